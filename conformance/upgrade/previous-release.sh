#!/usr/bin/env bash
# The previous release, 0.1.0 (tag v0.1.0, commit 009f738: what `make image` built before releases
# existed), as a cluster has it: its node-agent image and its deploy/tether.yaml. The e2e
# installs it on the real node and upgrades it to this checkout's release with pods running
# (conformance/e2e/test-release.sh).
#
# Built from this repository's history (git archive of that commit; nothing is downloaded but
# crates from the registry), with that commit's own build settings, once per machine into
# TETHER_PREVIOUS_DIR (default /var/cache/tether-previous/<commit>/: tether-image.tar, an OCI
# archive named docker.io/library/tether:0.1.0, tether.yaml, and tether-ipam.sha256: its plugin's
# checksum). A shallow clone without the
# commit cannot build it: fetch the history.
set -euo pipefail
cd "$(dirname "$0")/../.."
COMMIT=009f738213937bbccf3849e2829442c19fe082ca
VERSION=0.1.0
OUT=${TETHER_PREVIOUS_DIR:-/var/cache/tether-previous}/$COMMIT
if [[ -s $OUT/tether-image.tar && -s $OUT/tether.yaml && -s $OUT/tether-ipam.sha256 ]]; then
  echo "$OUT"
  exit 0
fi
if ! git cat-file -e "$COMMIT^{commit}" 2>/dev/null; then
  echo "previous-release: commit $COMMIT (v$VERSION) is not in this clone (shallow?); fetch the history" >&2
  exit 1
fi
start=$(date +%s)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
git archive "$COMMIT" | tar -x -C "$work"
# Its own target dir, kept beside the result: a rebuild after a cache wipe of OUT alone is quick.
CARGO_TARGET_DIR=${OUT%/*}/build cargo build --quiet --release --locked --manifest-path "$work/Cargo.toml" \
  --target x86_64-unknown-linux-musl --bin tether-ipvlan --bin tether-ipam --bin tether >&2
mkdir -p "$work/root/usr/local/bin" "$OUT.tmp"
for b in tether-ipvlan tether-ipam tether; do
  install -m 0755 "${OUT%/*}/build/x86_64-unknown-linux-musl/release/$b" "$work/root/usr/local/bin/$b"
done
python3 conformance/e2e/mkimage.py "$OUT.tmp/tether-image.tar" "docker.io/library/tether:$VERSION" "$work/root" \
  --entrypoint '["/usr/local/bin/tether"]' --env PATH=/usr/local/bin >/dev/null
git show "$COMMIT:deploy/tether.yaml" >"$OUT.tmp/tether.yaml"
# What its agent installs on a node, to tell its plugin from this release's.
sha256sum "$work/root/usr/local/bin/tether-ipam" | cut -d' ' -f1 >"$OUT.tmp/tether-ipam.sha256"
grep -q "image: tether:$VERSION\$" "$OUT.tmp/tether.yaml" || { echo "previous-release: its tether.yaml names no tether:$VERSION" >&2; exit 1; }
rm -rf "$OUT" && mv "$OUT.tmp" "$OUT"
echo "previous-release: tether $VERSION of $COMMIT in $OUT ($(( $(date +%s) - start )) s)" >&2
echo "$OUT"
