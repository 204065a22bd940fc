#!/usr/bin/env bash
# Build integration-test targets of tether-conformance on the host and run
# them all in ONE lab VM boot (or directly on the host when the running
# kernel can create ipvlan links), failing if any fails.
#
#   conformance/lab/run-tests.sh lab_reference [other_target ...]
#
# Before booting it also builds target/libcni-driver and the workspace's
# binaries (tether-ipvlan, tether-ipam): inside the VM the source tree is
# read-only, so everything a test executes must exist already.
#
# Each test binary runs with cwd = conformance/ (like cargo), TETHER_LAB=1,
# `--include-ignored` (lab tests are #[ignore]d for plain `cargo test`) and
# `--test-threads=$TETHER_LAB_TEST_THREADS`; unset, 1, or what the target's source declares on a
# line `//! lab-test-threads: N` (a suite whose tests share nothing, e.g. lab_ipvlan: the VM has two
# vCPUs, and one test at a time keeps only one of them busy).
#
# Env knobs:
#   TETHER_LAB_TEST_THREADS  every target's thread count (default: as above)
#   TETHER_LAB_TEST_ARGS     extra args for every test binary (e.g. a name
#                            filter, --nocapture), word-split
#   TETHER_LAB_FORCE_VM=1    use the VM even if the host kernel has ipvlan
#   TETHER_LAB_NO_BUILD_BINS=1  skip `cargo build --workspace --bins`
#   CARGO_PROFILE_ARGS       e.g. --release (passed to both cargo commands)
#   TETHER_PEERS             the peers directory (default <repo>/../shared/peers)
#   plus run.sh's and kernel.sh's knobs.
#
# Targets whose tests need a real Kubernetes API server (their #[ignore] reason says "needs a real
# API server", e.g. lab_multus: Multus and kube-apiserver from ../shared/peers; in the VM, Multus
# runs inside and kube-apiserver here on the host (conformance/multus/host-api.sh), reached over
# one forwarded port; TETHER_LAB_HOST_API=0 starts it inside the VM instead, as on a host kernel):
# with the peers present, their binaries are copied here on the host (conformance/peers/build.sh
# built them into PEERS_BIN_DIR) and the VM gets
# TETHER_LAB_MEMORY=3G and TETHER_LAB_TIMEOUT=3600 unless set; without them those targets run
# WITHOUT --include-ignored, so their tests show as "ignored" — NOT RUN, never passed — with a
# banner, which fails the run only with TETHER_REQUIRE_KUBE=1 (CI).
set -euo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
ROOT=$(cd "$HERE/../.." && pwd)
log() { printf 'lab/run-tests: %s\n' "$*" >&2; }
die() { printf 'lab/run-tests: FAILED: %s\n' "$*" >&2; exit 1; }

[ $# -ge 1 ] || { echo "usage: $0 <cargo test target name>..." >&2; exit 2; }
for t in "$@"; do
    [[ "$t" =~ ^[A-Za-z0-9_-]+$ ]] || die "bad test target name '$t'"
done
command -v jq >/dev/null || {
    apt-get install -y -qq jq >&2 || { apt-get update -qq >&2 && apt-get install -y -qq jq >&2; }
} || die "jq missing and cannot be installed"

cd "$ROOT"
# shellcheck disable=SC2206
profile=(${CARGO_PROFILE_ARGS:-})

"$ROOT/conformance/libcni-driver/build.sh" >/dev/null || die "building the libcni driver failed"
if [ "${TETHER_LAB_NO_BUILD_BINS:-0}" != 1 ]; then
    cargo build --workspace --bins "${profile[@]}" || die "cargo build --workspace --bins failed"
fi

test_args=()
for t in "$@"; do test_args+=(--test "$t"); done
# --workspace, not -p tether-conformance: the dependencies keep the features they have in every
# other build of the workspace, so nothing is compiled a second time (conformance/Cargo.toml).
json=$(cargo test --workspace "${test_args[@]}" "${profile[@]}" \
        --no-run --message-format=json) || die "building the test targets failed"

exes=()
for t in "$@"; do
    exe=$(jq -r --arg t "$t" 'select(.reason == "compiler-artifact" and .profile.test == true
            and .target.name == $t and .executable != null) | .executable' <<<"$json" | tail -n 1)
    [ -n "$exe" ] && [ -x "$exe" ] || die "no test executable for target '$t'"
    exes+=("$exe")
done

# Targets that need the peers (a real API server, Multus): see the header.
PEERS=${TETHER_PEERS:-$ROOT/../shared/peers}
needs_peers=()
for t in "$@"; do
    if grep -qs 'needs a real API server' "$ROOT/conformance/tests/$t.rs"; then needs_peers+=("$t"); fi
done
not_run=()
not_run_banner() {
    printf '\n%s\n##  NOT RUN: %s — ../shared/peers is absent (%s)\n%s\n%s\n%s\n\n' \
        '##########################################################################################' \
        "${not_run[*]}" "$PEERS" \
        '##  Their tests need Multus and a real kube-apiserver from the peers directory; they ran' \
        '##  without --include-ignored and show as "ignored". They have NOT passed.' \
        '##########################################################################################' >&2
}
if [ ${#needs_peers[@]} -gt 0 ]; then
    if [ -x "$PEERS/unpack.sh" ]; then
        "$PEERS/unpack.sh" "$ROOT/target/lab/peers-bin" >/dev/null || die "unpacking $PEERS failed"
        export TETHER_LAB_MEMORY=${TETHER_LAB_MEMORY:-3G}
        # The API server's start alone takes minutes under TCG on a busy machine.
        export TETHER_LAB_TIMEOUT=${TETHER_LAB_TIMEOUT:-3600}
    else
        not_run=("${needs_peers[@]}")
        not_run_banner
        [ "${TETHER_REQUIRE_KUBE:-}" != 1 ] || die "TETHER_REQUIRE_KUBE=1 and the peers are absent"
    fi
fi

[[ "${TETHER_LAB_TEST_THREADS:-1}" =~ ^[0-9]+$ ]] || die "TETHER_LAB_TEST_THREADS must be a number"
# Test threads of one target (see the header).
threads_of() {
    local n
    n=$(sed -n 's|^//! lab-test-threads: \([0-9][0-9]*\)$|\1|p' "$ROOT/conformance/tests/$1.rs" | head -n 1)
    echo "${TETHER_LAB_TEST_THREADS:-${n:-1}}"
}

# The script that runs every executable and fails if any failed.
script="cd $(printf '%q' "$ROOT/conformance") || exit 125
export TETHER_LAB=1
# The VM's /var/cache and /tmp are its own (tmpfs, overlays): the peers are the copies made above.
export PEERS_BIN_DIR=$(printf '%q' "$ROOT/target/lab/peers-bin") KUBECTL=$(printf '%q' "$ROOT/target/lab/peers-bin/kubectl")
failed=()
"
i=0
for exe in "${exes[@]}"; do
    q=$(printf '%q' "$exe")
    t=${*:$((i + 1)):1}
    i=$((i + 1))
    include=--include-ignored
    if [[ " ${not_run[*]} " == *" $t "* ]]; then
        include=
        script+="echo \"==== \$(basename $q): NOT RUN (../shared/peers is absent): its tests show as ignored\"
"
    fi
    script+="echo \"==== \$(basename $q)\"
$q $include --test-threads=$(threads_of "$t") ${TETHER_LAB_TEST_ARGS:-} || failed+=(\"\$(basename $q)\")
"
done
script+='if [ ${#failed[@]} -gt 0 ]; then echo "lab tests FAILED: ${failed[*]}"; exit 1; fi
echo "lab tests passed"
'

status=0
if [ "${TETHER_LAB_FORCE_VM:-0}" != 1 ] && "$HERE/has-ipvlan.sh"; then
    log "running kernel $(uname -r) has ipvlan: running on the host"
    bash -c "$script" || status=$?
else
    log "running kernel $(uname -r) lacks ipvlan (or TETHER_LAB_FORCE_VM=1): running in the lab VM"
    # The API server of the tests that need one runs here, natively (under TCG it took minutes to
    # start and then shared the emulated CPUs with the tests); the VM reaches it through one
    # forwarded port (conformance/multus/host-api.sh).
    api_dir=
    if [ ${#needs_peers[@]} -gt ${#not_run[@]} ] && [ "${TETHER_LAB_HOST_API:-1}" = 1 ]; then
        api_dir=$ROOT/target/lab/multus-api
        port=${TETHER_MULTUS_API_PORT:-46443}
        "$ROOT/conformance/multus/host-api.sh" up "$api_dir" "$port" || die "the host's API server for the VM did not start"
        trap '"$ROOT/conformance/multus/host-api.sh" down "$api_dir"' EXIT
        export TETHER_LAB_FORWARD=$port TETHER_MULTUS_API_DIR=$api_dir
    fi
    # The VM's root is 9p without a page cache: every exec of a debug binary (70–170 MB) from it
    # pages it in again (1–1.6 s per exec of tether-ipam under TCG, about 0.1 s from RAM). So the suites run
    # copies without debug info (stripped here, natively) that the guest puts in its RAM first.
    src=${TETHER_BIN_DIR:-$ROOT/target/$([[ " ${profile[*]} " == *" --release "* ]] && echo release || echo debug)}
    lab_bin=$ROOT/target/lab/bin
    rm -rf "$lab_bin" && mkdir -p "$lab_bin"
    for b in tether-ipvlan tether-ipam tether; do
        [ -x "$src/$b" ] || die "$src/$b missing (cargo build --workspace --bins)"
        objcopy --strip-debug "$src/$b" "$lab_bin/$b" || die "stripping $src/$b failed"
    done
    script="mkdir -p /tmp/tether-bin && cp $(printf '%q' "$lab_bin")/* /tmp/tether-bin/ || exit 125
export TETHER_BIN_DIR=/tmp/tether-bin
$script"
    "$HERE/run.sh" "$script" || status=$?
fi
[ ${#not_run[@]} -eq 0 ] || not_run_banner
exit $status
