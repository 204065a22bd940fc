#!/usr/bin/env bash
# Attach benchmark: ADD/DEL cycles of tether-ipvlan + tether-ipam against the reference
# ipvlan + host-local (Debian containernetworking-plugins), every row interleaved, in one boot.
# Not a timed test: it prints p50/p90 per row and operation, the ratios tether/reference, and the
# exec cost of each binary.
#
#   conformance/bench/attach.sh              # builds release binaries, then runs in the lab
#                                            # VM (or here, if this kernel has ipvlan)
#   conformance/bench/attach.sh --here       # run the measurement now, in this kernel
#
# The reference never probes the wire, so each family has two tether rows: probe off and probe on
# (tether-ipam's default: 100 ms, one attempt). IPv4 and dual-stack (one IPv4 and one IPv6 range).
# One more row, tether-ipvlan over host-local, isolates the attacher. Every row has its own master,
# pod netns and store. Each ratio's label says what differs between its two sides besides the
# plugins themselves. In the dual rows the IPv6 address is never used tentative, but the sides get
# there differently: the reference waits out the kernel's default DAD (a random delay of up to 1 s,
# then 1 s); tether-ipvlan shortens DAD on the pod's interface to one 100 ms window and waits that
# out (probe off), or adds the IPv6 address tether-ipam probed (100 ms) with nodad (probe on).
#
# The plugins are exec'd directly (CNI_* env, config on stdin; no libcni in between), from a bash
# loop already inside the node netns, timed with $EPOCHREALTIME, so the numbers are the plugins'
# own wall time. Each cycle runs every row's ADD+DEL once; the order rotates by one row per cycle.
#
# Knobs:
#   BENCH_CYCLES=50                  cycles (after one untimed warm-up cycle)
#   BENCH_PROFILE=release            cargo profile of our binaries (release | debug)
#   BENCH_BIN_DIR                    take tether-ipvlan and tether-ipam from here instead (e.g. the
#                                    shipped static builds); nothing is built then
#   TETHER_REFERENCE_CNI_PATH        reference plugins (default /usr/lib/cni)
#   TETHER_LAB_FORCE_VM=1            use the VM even if this kernel has ipvlan
#   BENCH_SAMPLES_DIR                also write every latency (ms, one a line) to
#                                    <dir>/attach__<row>_<op>.txt (make bench)
set -euo pipefail
export LC_ALL=C # $EPOCHREALTIME with a "." separator

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
ROOT=$(cd "$HERE/../.." && pwd)
SELF="$HERE/$(basename "${BASH_SOURCE[0]}")"
CYCLES=${BENCH_CYCLES:-50}
PROFILE=${BENCH_PROFILE:-release}
REFDIR=${TETHER_REFERENCE_CNI_PATH:-/usr/lib/cni}
BIN=${BENCH_BIN_DIR:-$ROOT/target/$PROFILE}
log() { printf 'bench/attach: %s\n' "$*" >&2; }
die() { printf 'bench/attach: FAILED: %s\n' "$*" >&2; exit 1; }

[[ "$CYCLES" =~ ^[1-9][0-9]*$ ]] || die "BENCH_CYCLES must be a positive number"

# Rows: name, label, plugin (ours | ref), ipam (tether-on | tether-off | host-local), family (4 | dual).
ROWS=(
    "ref4|reference ipvlan + host-local|ref|host-local|4"
    "off4|tether, probe off|ours|tether-off|4"
    "on4|tether, probe on (as shipped)|ours|tether-on|4"
    "hl4|tether-ipvlan + host-local (attacher alone)|ours|host-local|4"
    "refd|reference ipvlan + host-local|ref|host-local|dual"
    "offd|tether, probe off, DAD shortened to 100 ms|ours|tether-off|dual"
    "ond|tether, probe on (as shipped), IPv6 nodad|ours|tether-on|dual"
)

# ----------------------------------------------------------------------------- host side
if [ "${1:-}" != --here ] && [ "${1:-}" != --loop ]; then
    [ "$(id -u)" = 0 ] || die "must run as root"
    cd "$ROOT"
    if [ -z "${BENCH_BIN_DIR:-}" ]; then
        profile_flag=()
        [ "$PROFILE" = release ] && profile_flag=(--release)
        log "building tether-ipvlan tether-ipam ($PROFILE)"
        cargo build "${profile_flag[@]}" --bin tether-ipvlan --bin tether-ipam >&2 || die "cargo build failed"
    fi
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
    "$ROOT/conformance/lab/run.sh" "$(printf 'BENCH_CYCLES=%q BENCH_PROFILE=%q BENCH_BIN_DIR=%q BENCH_SAMPLES_OUT=%q %q --here' \
        "$CYCLES" "$PROFILE" "$BIN" "$samples_vm" "$SELF")"
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
# Runs inside the node netns. Appends "<row> <op> <microseconds>" to $TIMES.
if [ "${1:-}" = --loop ]; then
    : "${TIMES:?}" "${SCRATCH:?}" "${RUN:?}"
    # cycle <row> <i> <timed 0|1>
    cycle() {
        local row=$1 i=$2 timed=$3 cid out t0 t1 t2
        local bin path
        bin=$(<"$SCRATCH/$row.bin") path=$(<"$SCRATCH/$row.path")
        cid=$(printf 'bench%s%05d%s' "$row" "$i" "$timed")
        export CNI_CONTAINERID=$cid CNI_NETNS=/run/netns/$RUN-pod-$row CNI_IFNAME=net1 CNI_PATH=$path \
            CNI_ARGS="IgnoreUnknown=true;K8S_POD_NAMESPACE=bench;K8S_POD_NAME=pod-$row-$i-$timed;K8S_POD_INFRA_CONTAINER_ID=$cid;K8S_POD_UID=uid-$row-$i-$timed"
        t0=${EPOCHREALTIME/./}
        out=$(CNI_COMMAND=ADD "$bin" <"$SCRATCH/$row.json") || { echo "$row ADD #$i failed: $out" >&2; return 1; }
        t1=${EPOCHREALTIME/./}
        out=$(CNI_COMMAND=DEL "$bin" <"$SCRATCH/$row.json") || { echo "$row DEL #$i failed: $out" >&2; return 1; }
        t2=${EPOCHREALTIME/./}
        if [ "$timed" = 1 ]; then
            echo "$row ADD $((t1 - t0))" >>"$TIMES"
            echo "$row DEL $((t2 - t1))" >>"$TIMES"
        fi
    }
    # version <binary> <name>: one VERSION round trip, as a runtime probes a plugin.
    version() {
        local t0 t1
        t0=${EPOCHREALTIME/./}
        CNI_COMMAND=VERSION "$1" </dev/null >/dev/null || { echo "$2 VERSION failed" >&2; return 1; }
        t1=${EPOCHREALTIME/./}
        echo "exec $2 $((t1 - t0))" >>"$TIMES"
    }
    read -r -a rows <<<"$ROW_NAMES"
    n=${#rows[@]}
    for r in "${rows[@]}"; do cycle "$r" 0 0; done # warm-up: page cache, first-exec costs
    for ((i = 1; i <= CYCLES; i++)); do
        for ((k = 0; k < n; k++)); do
            cycle "${rows[(i + k) % n]}" "$i" 1
        done
        for b in tether-ipvlan tether-ipam; do version "$SCRATCH/bin-ours/$b" "$b"; done
        for b in ipvlan host-local; do version "$SCRATCH/bin-ref/$b" "$b"; done
    done
    exit 0
fi

# ----------------------------------------------------------------------------- --here
[ "$(id -u)" = 0 ] || die "must run as root"
for f in "$BIN/tether-ipvlan" "$BIN/tether-ipam" "$REFDIR/ipvlan" "$REFDIR/host-local"; do
    [ -x "$f" ] || die "$f missing"
done
command -v jq >/dev/null || die "jq missing"

RUN=bench$$
SCRATCH=$(mktemp -d "${TMPDIR:-/tmp}/tether-bench.XXXXXX")
# Run copies of all four binaries from the scratch dir (RAM in the lab VM), so neither side pays
# for paging its executable in over the VM's 9p root, and a concurrent cargo build cannot swap ours.
mkdir -p "$SCRATCH/bin-ours" "$SCRATCH/bin-ref"
cp "$BIN/tether-ipvlan" "$BIN/tether-ipam" "$REFDIR/host-local" "$SCRATCH/bin-ours/"
cp "$REFDIR/ipvlan" "$REFDIR/host-local" "$SCRATCH/bin-ref/"
NODE=$RUN-node PEER=$RUN-peer
names=()
for r in "${ROWS[@]}"; do names+=("${r%%|*}"); done
cleanup() {
    local rc=$?
    for n in "$NODE" "$PEER"; do ip netns del "$n" 2>/dev/null || true; done
    for r in "${names[@]}"; do ip netns del "$RUN-pod-$r" 2>/dev/null || true; done
    rm -rf "$SCRATCH"
    exit $rc
}
trap cleanup EXIT
trap 'exit 130' INT TERM

for n in "$NODE" "$PEER"; do ip netns add "$n"; ip -n "$n" link set lo up; done
host_local() { # <dataDir> <subnet4> <subnet6 or "">
    jq -cn --arg d "$1" --arg s4 "$2" --arg s6 "$3" \
        '{type: "host-local", dataDir: $d, ranges: ([[{subnet: $s4, rangeStart: ($s4 | sub("0/24$"; "10")), rangeEnd: ($s4 | sub("0/24$"; "250"))}]]
          + (if $s6 == "" then [] else [[{subnet: $s6, rangeStart: ($s6 | sub("/64$"; "10")), rangeEnd: ($s6 | sub("/64$"; "250"))}]] end))}'
}
tether_ipam() { # <dataDir> <subnet4> <subnet6 or ""> <probe 0|1>
    jq -cn --arg d "$1" --arg s4 "$2" --arg s6 "$3" --argjson probe "$([ "$4" = 1 ] && echo true || echo false)" \
        '{type: "tether-ipam", dataDir: $d, range: (($s4 | sub("0/24$"; "10")) + "-" + ($s4 | sub("0/24$"; "250/24")))}
         + (if $s6 == "" then {} else {ipRanges: [{range: (($s6 | sub("/64$"; "10")) + "-" + ($s6 | sub("/64$"; "250/64")))}]} end)
         + (if $probe then {} else {probe: false} end)'
}
k=0
for r in "${ROWS[@]}"; do
    IFS='|' read -r name label plugin ipam family <<<"$r"
    k=$((k + 1))
    ip netns add "$RUN-pod-$name"
    ip -n "$RUN-pod-$name" link set lo up
    ip -n "$NODE" link add "m-$name" type veth peer name "p-$name" netns "$PEER"
    ip -n "$NODE" link set "m-$name" up
    ip -n "$PEER" link set "p-$name" up
    ip -n "$PEER" addr add "10.1.$k.1/24" dev "p-$name"
    ip -n "$PEER" addr add "fd00:1:$k::1/64" dev "p-$name" nodad
    s6=
    [ "$family" = dual ] && s6="fd00:1:$k::/64"
    case "$ipam" in
        host-local) conf_ipam=$(host_local "$SCRATCH/ipam-$name" "10.1.$k.0/24" "$s6") ;;
        tether-on) conf_ipam=$(tether_ipam "$SCRATCH/ipam-$name" "10.1.$k.0/24" "$s6" 1) ;;
        tether-off) conf_ipam=$(tether_ipam "$SCRATCH/ipam-$name" "10.1.$k.0/24" "$s6" 0) ;;
    esac
    case "$plugin" in
        ours) type=tether-ipvlan dir=$SCRATCH/bin-ours ;;
        ref) type=ipvlan dir=$SCRATCH/bin-ref ;;
    esac
    echo "$dir/$type" >"$SCRATCH/$name.bin"
    echo "$dir" >"$SCRATCH/$name.path"
    # 1.0.0: the newest version the reference plugins speak; same for all rows.
    jq -cn --arg n "bench-$name" --arg t "$type" --arg m "m-$name" --argjson ipam "$conf_ipam" \
        '{cniVersion: "1.0.0", name: $n, type: $t, master: $m, mode: "l2", ipam: $ipam}' >"$SCRATCH/$name.json"
    echo "$label" >"$SCRATCH/$name.label"
done

echo "== attach benchmark: $CYCLES ADD/DEL cycles of each row, interleaved (the order rotates every cycle); kernel $(uname -r), $(nproc) cpus"
echo "   tether:    $BIN/tether-ipvlan + tether-ipam (file store); probe on = tether-ipam's default (100 ms, 1 attempt)"
echo "   reference: $REFDIR/ipvlan + host-local ($(dpkg-query -W -f='containernetworking-plugins ${Version}' containernetworking-plugins 2>/dev/null || echo 'version unknown')); never probes"
echo "   dual: one IPv4 and one IPv6 range. The reference waits out the kernel's default IPv6 DAD (a random"
echo "   delay of up to 1 s, then 1 s); tether-ipvlan shortens DAD on the pod's interface to one 100 ms window"
echo "   and waits that out (probe off), or adds the IPv6 address tether-ipam probed (100 ms) with nodad (probe on)"

TIMES=$SCRATCH/times
: >"$TIMES"
export TIMES SCRATCH RUN CYCLES
ROW_NAMES="${names[*]}" ip netns exec "$NODE" bash "$SELF" --loop || die "a plugin call failed (see above)"

# Leftovers would make the numbers meaningless (and mean a bug).
for r in "${names[@]}"; do
    left=$(ip -n "$RUN-pod-$r" -o link show | grep -vc ': lo:' || true)
    [ "$left" = 0 ] || die "links left in the pod of row $r: $left"
done

# pct <row> <op> <p>: nearest-rank percentile in ms.
pct() {
    awk -v i="$1" -v o="$2" '$1 == i && $2 == o {print $3}' "$TIMES" | sort -n |
        awk -v p="$3" '{v[NR] = $1} END {if (NR == 0) {print "nan"; exit} r = int((p / 100) * NR + 0.999999); if (r < 1) r = 1; printf "%.1f", v[r] / 1000}'
}
ratio() { awk -v a="$1" -v b="$2" 'BEGIN {printf "%.2f", a / b}'; }
# verdict <value> <limit>
verdict() { awk -v v="$1" -v l="$2" 'BEGIN {print (v <= l) ? "met" : "MISSED"}'; }

echo
echo "   exec cost: one CNI_COMMAND=VERSION round trip, $CYCLES runs each, interleaved with the cycles"
printf '   %-28s %9s %9s\n' binary "p50 ms" "p90 ms"
for b in tether-ipvlan tether-ipam ipvlan host-local; do
    printf '   %-28s %9s %9s\n' "$b$([ "$b" = ipvlan ] || [ "$b" = host-local ] && echo ' (reference)')" "$(pct exec "$b" 50)" "$(pct exec "$b" 90)"
done

echo
printf '   %-6s %-46s %9s %9s %9s %9s\n' family row "ADD p50" "ADD p90" "DEL p50" "DEL p90"
for r in "${names[@]}"; do
    fam=IPv4
    [[ "$r" == *d ]] && fam=dual
    printf '   %-6s %-46s %9s %9s %9s %9s\n' "$fam" "$(<"$SCRATCH/$r.label")" \
        "$(pct "$r" ADD 50)" "$(pct "$r" ADD 90)" "$(pct "$r" DEL 50)" "$(pct "$r" DEL 90)"
done

echo
printf '   %-67s %-15s %-12s %s\n' "ratio tether/reference, p50 (p90); each label: what differs" ADD DEL "targets (p50)"
line() { # <family> <what> <row> <ref> <add target> <del target or "">
    local a d t
    a="$(ratio "$(pct "$3" ADD 50)" "$(pct "$4" ADD 50)") ($(ratio "$(pct "$3" ADD 90)" "$(pct "$4" ADD 90)"))"
    d="$(ratio "$(pct "$3" DEL 50)" "$(pct "$4" DEL 50)") ($(ratio "$(pct "$3" DEL 90)" "$(pct "$4" DEL 90)"))"
    t=
    [ -n "$5" ] && t="ADD <= $5: $(verdict "$(ratio "$(pct "$3" ADD 50)" "$(pct "$4" ADD 50)")" "$5")"
    [ -n "$6" ] && t="$t; DEL <= $6: $(verdict "$(ratio "$(pct "$3" DEL 50)" "$(pct "$4" DEL 50)")" "$6")"
    printf '   %-6s %-60s %-15s %-12s %s\n' "$1" "$2" "$a" "$d" "$t"
}
line IPv4 "neither side probes; IPv4 has no DAD" off4 ref4 0.5 0.5
line IPv4 "tether probes the address (100 ms); the reference does not" on4 ref4 1.2 ""
line IPv4 "attachers only: both sides use host-local" hl4 ref4 "" ""
line dual "IPv6 DAD: tether's one 100 ms window vs the kernel default" offd refd 0.5 0.5
line dual "tether probes (100 ms), adds IPv6 nodad; ref waits out DAD" ond refd 1.2 ""
echo
ds=$(ratio "$(pct ond ADD 50)" "$(pct on4 ADD 50)")
echo "   dual-stack ADD / IPv4 ADD, tether probe on, p50: $ds (target <= 1.3: $(verdict "$ds" 1.3))"
added=$(awk -v a="$(pct on4 ADD 50)" -v b="$(pct off4 ADD 50)" 'BEGIN {printf "%.1f", a - b}')
echo "   added by probing, tether IPv4 ADD p50 (on - off): $added ms (target <= 110: $(verdict "$added" 110))"

# Every latency, for `make bench`'s distribution chart: <dir>/attach__<row>_<op>.txt, ms per line.
if [ -n "${BENCH_SAMPLES_OUT:-}" ]; then
    mkdir -p "$BENCH_SAMPLES_OUT"
    for r in "${names[@]}"; do
        fam=ipv4
        [[ "$r" == *d ]] && fam=dual
        label=$(tr -c 'a-zA-Z0-9\n' '_' <"$SCRATCH/$r.label" | tr -s _ | sed 's/_$//')
        for op in ADD DEL; do
            awk -v i="$r" -v o="$op" '$1 == i && $2 == o {printf "%.3f\n", $3 / 1000}' "$TIMES" \
                >"$BENCH_SAMPLES_OUT/attach__${fam}_${label}_$op.txt"
        done
    done
fi
