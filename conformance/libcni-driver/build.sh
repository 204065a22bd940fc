#!/usr/bin/env bash
# Build target/libcni-driver from conformance/libcni-driver/main.go against
# Debian's real libcni (golang-github-appc-cni-dev, GOPATH mode, no network).
# Idempotent: rebuilds only when main.go (or this script, or the Go/libcni
# install) changed. Installs golang-go + golang-github-appc-cni-dev when
# missing (root, Debian). Prints the binary path on stdout.
#
# Env: CARGO_TARGET_DIR (default <repo>/target) decides where the binary goes.
set -euo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
ROOT=$(cd "$HERE/../.." && pwd)
TARGET=${CARGO_TARGET_DIR:-$ROOT/target}
case "$TARGET" in /*) ;; *) TARGET="$ROOT/$TARGET" ;; esac
OUT="$TARGET/libcni-driver"
STAMP="$TARGET/.libcni-driver.stamp"
GOCODE=/usr/share/gocode
LIBCNI="$GOCODE/src/github.com/containernetworking/cni/libcni"

log() { printf 'libcni-driver/build: %s\n' "$*" >&2; }
die() { printf 'libcni-driver/build: ERROR: %s\n' "$*" >&2; exit 1; }

if ! command -v go >/dev/null || [ ! -d "$LIBCNI" ]; then
    [ "$(id -u)" = 0 ] || die "need golang-go and golang-github-appc-cni-dev (run as root to install)"
    export DEBIAN_FRONTEND=noninteractive
    log "installing golang-go golang-github-appc-cni-dev"
    apt-get install -y -qq --no-install-recommends golang-go golang-github-appc-cni-dev >&2 || {
        apt-get update -qq >&2
        apt-get install -y -qq --no-install-recommends golang-go golang-github-appc-cni-dev >&2
    } || die "apt-get install golang-go golang-github-appc-cni-dev failed"
fi

# Everything that should trigger a rebuild.
want=$( {
    sha256sum "$HERE/main.go" "$HERE/build.sh"
    go version
    dpkg-query -W -f='${Version}\n' golang-github-appc-cni-dev 2>/dev/null || true
} | sha256sum | cut -d' ' -f1)

if [ -x "$OUT" ] && [ -f "$STAMP" ] && [ "$(cat "$STAMP")" = "$want" ]; then
    echo "$OUT"
    exit 0
fi

mkdir -p "$TARGET"
GOPATH_DIR="$TARGET/libcni-driver.gopath"
mkdir -p "$GOPATH_DIR" "$TARGET/libcni-driver.gocache"
log "building $OUT"
(
    cd "$HERE"
    GO111MODULE=off GOPATH="$GOPATH_DIR:$GOCODE" GOFLAGS= \
        GOCACHE="$TARGET/libcni-driver.gocache" CGO_ENABLED=0 \
        go build -trimpath -o "$OUT.tmp" .
) || die "go build failed"
mv -f "$OUT.tmp" "$OUT"
echo "$want" >"$STAMP"
echo "$OUT"
