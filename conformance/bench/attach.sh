#!/usr/bin/env bash
# Attach benchmark: ADD/DEL cycles of tether-ipvlan + its IPAM against the reference
# ipvlan + host-local (Debian containernetworking-plugins), interleaved, in one boot.
# Not a timed test: it prints p50/p90 per operation and the ratio ours/reference.
#
#   conformance/bench/attach.sh              # builds release binaries, then runs in the lab
#                                            # VM (or here, if this kernel has ipvlan)
#   conformance/bench/attach.sh --here       # run the measurement now, in this kernel
#
# Both plugins are exec'd directly (CNI_* env, config on stdin; no libcni in between),
# from a bash loop already inside the node netns, timed with $EPOCHREALTIME, so the
# numbers are the plugins' own wall time. Cycle i runs ours then the reference's ADD+DEL
# on odd i and the other way round on even i.
#
# Knobs:
#   BENCH_CYCLES=50                  cycles per implementation (after one untimed warm-up)
#   BENCH_OURS_IPAM=tether-ipam      the IPAM under tether-ipvlan: tether-ipam | host-local
#   BENCH_PROBE=1                    tether-ipam's conflict probe (0: "probe": false)
#   BENCH_PROFILE=release            cargo profile of our binaries (release | debug)
#   TETHER_REFERENCE_CNI_PATH        reference plugins (default /usr/lib/cni)
#   TETHER_LAB_FORCE_VM=1            use the VM even if this kernel has ipvlan
#   BENCH_SAMPLES_DIR                also write every latency (ms, one a line) to
#                                    <dir>/attach__{tether,reference}_{ADD,DEL}.txt (make bench)
set -euo pipefail
export LC_ALL=C # $EPOCHREALTIME with a "." separator

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
ROOT=$(cd "$HERE/../.." && pwd)
SELF="$HERE/$(basename "${BASH_SOURCE[0]}")"
CYCLES=${BENCH_CYCLES:-50}
OURS_IPAM=${BENCH_OURS_IPAM:-tether-ipam}
PROBE=${BENCH_PROBE:-1}
PROFILE=${BENCH_PROFILE:-release}
REFDIR=${TETHER_REFERENCE_CNI_PATH:-/usr/lib/cni}
BIN="$ROOT/target/$PROFILE"
log() { printf 'bench/attach: %s\n' "$*" >&2; }
die() { printf 'bench/attach: FAILED: %s\n' "$*" >&2; exit 1; }

[[ "$CYCLES" =~ ^[1-9][0-9]*$ ]] || die "BENCH_CYCLES must be a positive number"
case "$OURS_IPAM" in tether-ipam | host-local) ;; *) die "BENCH_OURS_IPAM: tether-ipam or host-local" ;; esac

# ----------------------------------------------------------------------------- host side
if [ "${1:-}" != --here ] && [ "${1:-}" != --loop ]; then
    [ "$(id -u)" = 0 ] || die "must run as root"
    cd "$ROOT"
    profile_flag=()
    [ "$PROFILE" = release ] && profile_flag=(--release)
    log "building tether-ipvlan tether-ipam ($PROFILE)"
    cargo build "${profile_flag[@]}" --bin tether-ipvlan --bin tether-ipam >&2 || die "cargo build failed"
    if [ "${TETHER_LAB_FORCE_VM:-0}" != 1 ] && "$ROOT/conformance/lab/has-ipvlan.sh"; then
        log "kernel $(uname -r) has ipvlan: running here"
        BENCH_SAMPLES_OUT=${BENCH_SAMPLES_DIR:-} exec "$SELF" --here
    fi
    log "kernel $(uname -r) lacks ipvlan: running in the lab VM"
    # In the VM only target/lab is writable: samples go there first, then to BENCH_SAMPLES_DIR.
    samples_vm=
    if [ -n "${BENCH_SAMPLES_DIR:-}" ]; then
        samples_vm=$ROOT/target/lab/bench-attach-samples.$$
        mkdir -p "$samples_vm"
    fi
    # run.sh passes only TETHER_*/RUST_*/CARGO_* into the VM: hand BENCH_* over explicitly.
    set +e
    "$ROOT/conformance/lab/run.sh" "$(printf 'BENCH_CYCLES=%q BENCH_OURS_IPAM=%q BENCH_PROBE=%q BENCH_PROFILE=%q BENCH_SAMPLES_OUT=%q %q --here' \
        "$CYCLES" "$OURS_IPAM" "$PROBE" "$PROFILE" "$samples_vm" "$SELF")"
    rc=$?
    set -e
    if [ -n "$samples_vm" ]; then
        mkdir -p "$BENCH_SAMPLES_DIR"
        cp "$samples_vm"/*.txt "$BENCH_SAMPLES_DIR"/ 2>/dev/null || true
        rm -rf "$samples_vm"
    fi
    exit $rc
fi

# ----------------------------------------------------------------------------- the loop
# Runs inside the node netns. Appends "<impl> <op> <microseconds>" to $TIMES.
if [ "${1:-}" = --loop ]; then
    : "${TIMES:?}" "${SCRATCH:?}" "${POD_OURS:?}" "${POD_REF:?}" "${LOOP_BIN:?}" "${LOOP_REFDIR:?}"
    BIN=$LOOP_BIN REFDIR=$LOOP_REFDIR
    # cycle <impl> <i> <timed 0|1>
    cycle() {
        local impl=$1 i=$2 timed=$3 conf bin path pod cid out t0 t1 t2
        case "$impl" in
            ours) bin=$BIN/tether-ipvlan conf=$SCRATCH/ours.json path=$BIN pod=$POD_OURS ;;
            ref) bin=$REFDIR/ipvlan conf=$SCRATCH/ref.json path=$REFDIR pod=$POD_REF ;;
        esac
        cid=$(printf 'bench%s%05d%s' "$impl" "$i" "$timed")
        export CNI_CONTAINERID=$cid CNI_NETNS=/run/netns/$pod CNI_IFNAME=net1 CNI_PATH=$path \
            CNI_ARGS="IgnoreUnknown=true;K8S_POD_NAMESPACE=bench;K8S_POD_NAME=pod-$impl-$i-$timed;K8S_POD_INFRA_CONTAINER_ID=$cid;K8S_POD_UID=uid-$impl-$i-$timed"
        t0=${EPOCHREALTIME/./}
        out=$(CNI_COMMAND=ADD "$bin" <"$conf") || { echo "$impl ADD #$i failed: $out" >&2; return 1; }
        t1=${EPOCHREALTIME/./}
        out=$(CNI_COMMAND=DEL "$bin" <"$conf") || { echo "$impl DEL #$i failed: $out" >&2; return 1; }
        t2=${EPOCHREALTIME/./}
        if [ "$timed" = 1 ]; then
            echo "$impl ADD $((t1 - t0))" >>"$TIMES"
            echo "$impl DEL $((t2 - t1))" >>"$TIMES"
        fi
    }
    cycle ours 0 0 && cycle ref 0 0 # warm-up: page cache, first-exec costs
    for ((i = 1; i <= CYCLES; i++)); do
        if ((i % 2)); then cycle ours "$i" 1 && cycle ref "$i" 1; else cycle ref "$i" 1 && cycle ours "$i" 1; fi
    done
    exit 0
fi

# ----------------------------------------------------------------------------- --here
[ "$(id -u)" = 0 ] || die "must run as root"
for f in "$BIN/tether-ipvlan" "$REFDIR/ipvlan" "$REFDIR/host-local"; do
    [ -x "$f" ] || die "$f missing"
done
[ "$OURS_IPAM" = host-local ] || [ -x "$BIN/tether-ipam" ] || die "$BIN/tether-ipam missing"
command -v jq >/dev/null || die "jq missing"

RUN=bench$$
SCRATCH=$(mktemp -d "${TMPDIR:-/tmp}/tether-bench.XXXXXX")
# Run copies of all four binaries from the scratch dir (RAM in the lab VM), so neither side pays
# for paging its executable in over the VM's 9p root, and a concurrent cargo build cannot swap ours.
mkdir -p "$SCRATCH/bin-ours" "$SCRATCH/bin-ref"
cp "$BIN/tether-ipvlan" "$REFDIR/host-local" "$SCRATCH/bin-ours/"
[ "$OURS_IPAM" = host-local ] || cp "$BIN/tether-ipam" "$SCRATCH/bin-ours/"
cp "$REFDIR/ipvlan" "$REFDIR/host-local" "$SCRATCH/bin-ref/"
SRC_BIN=$BIN SRC_REFDIR=$REFDIR
BIN=$SCRATCH/bin-ours REFDIR=$SCRATCH/bin-ref
NODE=tether-$RUN-node PEER=tether-$RUN-peer POD_OURS=tether-$RUN-pod-ours POD_REF=tether-$RUN-pod-ref
cleanup() {
    local rc=$?
    for n in "$NODE" "$PEER" "$POD_OURS" "$POD_REF"; do ip netns del "$n" 2>/dev/null || true; done
    rm -rf "$SCRATCH"
    exit $rc
}
trap cleanup EXIT
trap 'exit 130' INT TERM

for n in "$NODE" "$PEER" "$POD_OURS" "$POD_REF"; do ip netns add "$n"; ip -n "$n" link set lo up; done
# One master each, so the two plugins never share an ipvlan port.
ip -n "$NODE" link add m-ours type veth peer name p-ours netns "$PEER"
ip -n "$NODE" link add m-ref type veth peer name p-ref netns "$PEER"
for l in m-ours m-ref; do ip -n "$NODE" link set "$l" up; done
for l in p-ours p-ref; do ip -n "$PEER" link set "$l" up; done
ip -n "$PEER" addr add 10.1.2.1/24 dev p-ours
ip -n "$PEER" addr add 10.1.3.1/24 dev p-ref

host_local() { # <subnet> <start> <end> <dataDir>
    jq -cn --arg s "$1" --arg a "$2" --arg b "$3" --arg d "$4" \
        '{type: "host-local", ranges: [[{subnet: $s, rangeStart: $a, rangeEnd: $b}]], dataDir: $d}'
}
case "$OURS_IPAM" in
    tether-ipam)
        ours_ipam=$(jq -cn --arg d "$SCRATCH/ipam-ours" --argjson probe "$([ "$PROBE" = 1 ] && echo true || echo false)" \
            '{type: "tether-ipam", range: "10.1.2.10-10.1.2.250/24", dataDir: $d}
             + (if $probe then {} else {probe: false} end)') ;;
    host-local) ours_ipam=$(host_local 10.1.2.0/24 10.1.2.10 10.1.2.250 "$SCRATCH/ipam-ours") ;;
esac
ref_ipam=$(host_local 10.1.3.0/24 10.1.3.10 10.1.3.250 "$SCRATCH/ipam-ref")
# 1.0.0: the newest version the reference plugins speak; same for both.
jq -cn --argjson ipam "$ours_ipam" \
    '{cniVersion: "1.0.0", name: "bench-ours", type: "tether-ipvlan", master: "m-ours", mode: "l2", ipam: $ipam}' \
    >"$SCRATCH/ours.json"
jq -cn --argjson ipam "$ref_ipam" \
    '{cniVersion: "1.0.0", name: "bench-ref", type: "ipvlan", master: "m-ref", mode: "l2", ipam: $ipam}' \
    >"$SCRATCH/ref.json"

echo "== attach benchmark: $CYCLES ADD/DEL cycles each, interleaved; kernel $(uname -r), $(nproc) cpus"
echo "   ours:      $SRC_BIN/tether-ipvlan + $OURS_IPAM  $(jq -c .ipam "$SCRATCH/ours.json")"
echo "   reference: $SRC_REFDIR/ipvlan + host-local  ($(dpkg-query -W -f='containernetworking-plugins ${Version}' containernetworking-plugins 2>/dev/null || echo 'version unknown'))"

TIMES=$SCRATCH/times
: >"$TIMES"
LOOP_BIN=$BIN LOOP_REFDIR=$REFDIR
export TIMES SCRATCH POD_OURS POD_REF LOOP_BIN LOOP_REFDIR CYCLES
t_start=$EPOCHREALTIME
ip netns exec "$NODE" bash "$SELF" --loop || die "a plugin call failed (see above)"
echo "   wall time: $(awk -v a="$t_start" -v b="$EPOCHREALTIME" 'BEGIN{printf "%.1f s", b-a}')"

# Leftovers would make the numbers meaningless (and mean a bug).
left=$(ip -n "$POD_OURS" -o link show | grep -vc ': lo:' || true)
left_ref=$(ip -n "$POD_REF" -o link show | grep -vc ': lo:' || true)
[ "$left" = 0 ] && [ "$left_ref" = 0 ] || die "links left in the pods (ours $left, reference $left_ref)"

# pct <impl> <op> <p>: nearest-rank percentile in ms.
pct() {
    awk -v i="$1" -v o="$2" '$1 == i && $2 == o {print $3}' "$TIMES" | sort -n |
        awk -v p="$3" '{v[NR] = $1} END {if (NR == 0) {print "nan"; exit} r = int((p / 100) * NR + 0.999999); if (r < 1) r = 1; printf "%.1f", v[r] / 1000}'
}
echo
printf '   %-4s  %-10s %9s %9s\n' op impl "p50 ms" "p90 ms"
for op in ADD DEL; do
    for impl in ours ref; do
        printf '   %-4s  %-10s %9s %9s\n' "$op" "$([ $impl = ours ] && echo tether || echo reference)" \
            "$(pct $impl $op 50)" "$(pct $impl $op 90)"
    done
done
# Every latency, for `make bench`'s distribution chart: <dir>/attach__<impl>_<op>.txt, ms per line.
if [ -n "${BENCH_SAMPLES_OUT:-}" ]; then
    mkdir -p "$BENCH_SAMPLES_OUT"
    for op in ADD DEL; do
        for impl in ours ref; do
            awk -v i="$impl" -v o="$op" '$1 == i && $2 == o {printf "%.3f\n", $3 / 1000}' "$TIMES" \
                >"$BENCH_SAMPLES_OUT/attach__$([ $impl = ours ] && echo tether || echo reference)_$op.txt"
        done
    done
fi
echo
for op in ADD DEL; do
    awk -v op="$op" -v a50="$(pct ours $op 50)" -v b50="$(pct ref $op 50)" -v a90="$(pct ours $op 90)" -v b90="$(pct ref $op 90)" \
        'BEGIN {printf "   ratio tether/reference %s: p50 %.2f  p90 %.2f\n", op, a50 / b50, a90 / b90}'
done
