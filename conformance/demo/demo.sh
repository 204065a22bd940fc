#!/usr/bin/env bash
# tether demo: the network setup of a GPU training node, from a user's point of view.
#
#   make demo                      # boots the lab VM (Debian 6.1 kernel) and runs this there
#   sudo conformance/demo/demo.sh  # directly, on a machine whose kernel has ipvlan
#
# A node with two NICs (veth ends standing for enp5s0 and enp6s0) on two networks;
# their other ends sit in a "switch" namespace that also plays a host on each network:
#
#   management  10.20.30.0/24      enp5s0   host 10.20.30.1
#               one pod with the fixed address 10.20.30.240 (runtimeConfig.ips),
#               two pods from the pool 10.20.30.241-10.20.30.250
#   compute     192.168.100.0/24   enp6s0   host 192.168.100.1
#               every pod from the pool 192.168.100.10-192.168.100.250, as net2
#
# Pods get ipvlan (l2) interfaces from tether-ipvlan with addresses from tether-ipam,
# driven through the real libcni (target/libcni-driver) with the CNI_ARGS Multus sends.
# The demo pings pod to pod and pod to host on each network, deletes everything and
# shows that nothing is left. It exits non-zero as soon as a step fails.
#
# Knobs (environment):
#   DEMO_IPAM=tether-ipam|host-local   IPAM plugin (default tether-ipam; host-local is the
#                                      Debian reference, for checking the rest of the demo)
#   DEMO_MGMT_RANGE     default 10.20.30.241-10.20.30.250/24
#   DEMO_FIXED_IP       default 10.20.30.240/24
#   DEMO_FIXED_RANGE    default 10.20.30.224-10.20.30.240/24 (the mgmt-fixed network: addresses
#                       pods ask for by name, kept apart from the pool)
#   DEMO_COMPUTE_RANGE  default 192.168.100.10-192.168.100.250/24
#   TETHER_BIN_DIR      where tether-ipvlan / tether-ipam are (default target/debug)
#   LIBCNI_DRIVER       default target/libcni-driver
#   TETHER_REFERENCE_CNI_PATH  reference plugins (default /usr/lib/cni; host-local lives there)
#   DEMO_KEEP=1         keep the scratch dir (configs, IPAM store, libcni cache) for a look
set -euo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
ROOT=$(cd "$HERE/../.." && pwd)
BIN=${TETHER_BIN_DIR:-$ROOT/target/debug}
DRIVER=${LIBCNI_DRIVER:-$ROOT/target/libcni-driver}
REFDIR=${TETHER_REFERENCE_CNI_PATH:-/usr/lib/cni}
IPAM=${DEMO_IPAM:-tether-ipam}
MGMT_RANGE=${DEMO_MGMT_RANGE:-10.20.30.241-10.20.30.250/24}
FIXED_IP=${DEMO_FIXED_IP:-10.20.30.240/24}
FIXED_RANGE=${DEMO_FIXED_RANGE:-10.20.30.224-10.20.30.240/24}
COMPUTE_RANGE=${DEMO_COMPUTE_RANGE:-192.168.100.10-192.168.100.250/24}
MGMT_HOST=10.20.30.1
COMPUTE_HOST=192.168.100.1
export PATH="$PATH:/usr/sbin:/sbin"

# ---------------------------------------------------------------------------- output

if [ -t 1 ]; then B=$'\e[1m' G=$'\e[32m' R=$'\e[31m' D=$'\e[2m' N=$'\e[0m'; else B= G= R= D= N=; fi
heading() { printf '\n%s== %s%s\n' "$B" "$*" "$N"; }
note() { printf '%s   %s%s\n' "$D" "$*" "$N"; }
ok() { printf '   %sok%s  %s\n' "$G" "$N" "$*"; }
die() {
    printf '   %sFAILED%s  %s\n' "$R" "$N" "$1" >&2
    [ -z "${2:-}" ] || printf '%s\n' "$2" | sed 's/^/        /' >&2
    exit 1
}
indent() { sed 's/^/     /'; }

# step "what" cmd...: run it; "ok what", or FAILED with its output, and exit 1.
step() {
    local what=$1 out
    shift
    if out=$("$@" 2>&1); then ok "$what"; else die "$what" "$out"; fi
}

# ---------------------------------------------------------------------------- preflight

[ "$(id -u)" = 0 ] || { echo "demo: run as root (it creates network namespaces)" >&2; exit 1; }
for t in ip jq ping sha256sum; do
    command -v "$t" >/dev/null || { echo "demo: '$t' is missing" >&2; exit 1; }
done
case "$IPAM" in
    tether-ipam) IPAM_BIN=$BIN/tether-ipam ;;
    host-local) IPAM_BIN=$REFDIR/host-local ;;
    *) echo "demo: DEMO_IPAM must be tether-ipam or host-local, not '$IPAM'" >&2; exit 1 ;;
esac
for f in "$BIN/tether-ipvlan" "$IPAM_BIN" "$DRIVER"; do
    [ -x "$f" ] || { echo "demo: $f missing: run 'make demo' (it builds everything first)" >&2; exit 1; }
done

RUN=demo$$
SCRATCH=$(mktemp -d "${TMPDIR:-/tmp}/tether-demo.XXXXXX")
NETNS=()
cleanup() {
    local rc=$?
    for n in "${NETNS[@]}"; do ip netns del "$n" 2>/dev/null || true; done
    if [ "${DEMO_KEEP:-0}" = 1 ]; then echo "demo: kept $SCRATCH" >&2; else rm -rf "$SCRATCH"; fi
    exit $rc
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# Namespaces carry a per-run prefix so a second demo (or a test) never collides.
ns() { printf 'tether-%s-%s' "$RUN" "$1"; }
mkns() { ip netns add "$(ns "$1")" && NETNS+=("$(ns "$1")") && ip -n "$(ns "$1")" link set lo up; }
in_ns() { local n; n=$(ns "$1"); shift; ip netns exec "$n" "$@"; }

# Does this kernel do ipvlan? (A throwaway link in a throwaway netns.)
mkns probe
ip -n "$(ns probe)" link add pv0 type veth peer name pv1
if ! ip -n "$(ns probe)" link add link pv0 name pvl0 type ipvlan mode l2 2>/dev/null; then
    modprobe -q ipvlan 2>/dev/null || true
    ip -n "$(ns probe)" link add link pv0 name pvl0 type ipvlan mode l2 2>/dev/null || {
        echo "demo: this kernel ($(uname -r)) cannot create ipvlan links; run 'make demo' (lab VM)" >&2
        exit 1
    }
fi
ip netns del "$(ns probe)"

# ---------------------------------------------------------------------------- configs

# "a.b.c.d-e.f.g.h/p" -> the pieces host-local wants (IPv4 only; the demo's ranges are v4).
ip2int() { local IFS=.; set -- $1; echo $(( ($1 << 24) | ($2 << 16) | ($3 << 8) | $4 )); }
int2ip() { echo "$(( ($1 >> 24) & 255 )).$(( ($1 >> 16) & 255 )).$(( ($1 >> 8) & 255 )).$(( $1 & 255 ))"; }
subnet_of() { # ip prefix
    local i m; i=$(ip2int "$1"); m=$(( (0xffffffff << (32 - $2)) & 0xffffffff ))
    echo "$(int2ip $(( i & m )))/$2"
}

# ipam_json <range> [<fixed ip also requested from this network>]
ipam_json() {
    local range=$1 fixed=${2:-} first last prefix
    first=${range%%-*}; last=${range#*-}; last=${last%/*}; prefix=${range##*/}
    case "$IPAM" in
        tether-ipam)
            jq -cn --arg r "$range" --arg d "$SCRATCH/ipam" \
                '{type: "tether-ipam", range: $r, dataDir: $d}' ;;
        host-local)
            # host-local only hands out a requested address from inside rangeStart..rangeEnd.
            if [ -n "$fixed" ] && [ "$(ip2int "${fixed%/*}")" -lt "$(ip2int "$first")" ]; then
                first=${fixed%/*}
            fi
            jq -cn --arg s "$(subnet_of "$first" "$prefix")" --arg a "$first" --arg b "$last" \
                --arg d "$SCRATCH/ipam" \
                '{type: "host-local", ranges: [[{subnet: $s, rangeStart: $a, rangeEnd: $b}]], dataDir: $d}' ;;
    esac
}

# conflist <name> <master> <ipam json>: what a NetworkAttachmentDefinition's spec.config holds.
conflist() {
    jq -n --arg name "$1" --arg master "$2" --argjson ipam "$3" '{
        cniVersion: "1.0.0", name: $name,
        plugins: [{type: "tether-ipvlan", master: $master, mode: "l2",
                   capabilities: {ips: true}, ipam: $ipam}]}'
}

mkdir -p "$SCRATCH/net.d" "$SCRATCH/cache" "$SCRATCH/ipam"
# Management is two NADs on the same NIC, as in deploy/examples: fixed addresses (asked for in the
# pod's network selection) come from their own block, so the pool never hands one of them out.
conflist mgmt-fixed enp5s0 "$(ipam_json "$FIXED_RANGE" "$FIXED_IP")" >"$SCRATCH/net.d/mgmt-fixed.conflist"
conflist mgmt enp5s0 "$(ipam_json "$MGMT_RANGE")" >"$SCRATCH/net.d/mgmt.conflist"
conflist compute enp6s0 "$(ipam_json "$COMPUTE_RANGE")" >"$SCRATCH/net.d/compute.conflist"

# ---------------------------------------------------------------------------- the node

heading "1. A GPU node with two NICs (kernel $(uname -r), IPAM $IPAM)"
mkns node
mkns switch
# cable <node nic> <switch port> <host address>
cable() {
    ip -n "$(ns node)" link add "$1" type veth peer name "$2" netns "$(ns switch)" &&
        ip -n "$(ns node)" link set "$1" up &&
        ip -n "$(ns switch)" link set "$2" up &&
        ip -n "$(ns switch)" addr add "$3" dev "$2"
}
step "node NIC enp5s0 (management) cabled to a host $MGMT_HOST" cable enp5s0 mgmt-port "$MGMT_HOST/24"
step "node NIC enp6s0 (compute) cabled to a host $COMPUTE_HOST" cable enp6s0 compute-port "$COMPUTE_HOST/24"
note "NetworkAttachmentDefinition configs (spec.config), as given to libcni:"
for n in mgmt-fixed mgmt compute; do
    printf '     %s: %s\n' "$n" "$(jq -c '.plugins[0]' "$SCRATCH/net.d/$n.conflist")"
done

# ---------------------------------------------------------------------------- pods

POD_NS=gpu-training
declare -A CID UID_
# cni <add|check|del> <network> <pod> <ifname> [CAP_ARGS json]: libcni, run in the node netns.
cni() {
    local verb=$1 net=$2 pod=$3 ifname=$4 cap=${5:-}
    local args="IgnoreUnknown=true;K8S_POD_NAMESPACE=$POD_NS;K8S_POD_NAME=$pod;K8S_POD_INFRA_CONTAINER_ID=${CID[$pod]};K8S_POD_UID=${UID_[$pod]}"
    local env=(NETCONFPATH="$SCRATCH/net.d" CNI_PATH="$BIN:$REFDIR" CNI_CACHE_DIR="$SCRATCH/cache"
               CNI_IFNAME="$ifname" CNI_CONTAINERID="${CID[$pod]}" CNI_ARGS="$args")
    [ -z "$cap" ] || env+=(CAP_ARGS="$cap")
    env -u CAP_ARGS "${env[@]}" ip netns exec "$(ns node)" "$DRIVER" "$verb" "$net" "/run/netns/$(ns "$pod")"
}

PODS=(trainer-0 trainer-1 trainer-2)
# attach <pod> <network> <ifname> [CAP_ARGS]: ADD, and say what the pod got.
attach() {
    local pod=$1 net=$2 ifname=$3 cap=${4:-} out addr
    if ! out=$(cni add "$net" "$pod" "$ifname" "$cap" 2>&1); then
        die "$pod: $ifname on $net" "$out"
    fi
    addr=$(jq -r '[.ips[].address] | join(", ")' <<<"$out" 2>/dev/null) || die "$pod: $ifname on $net: no result" "$out"
    ok "$pod: $ifname on $net -> $addr${cap:+   (fixed, runtimeConfig.ips)}"
}

heading "2. Pods attach to both networks (through libcni, Multus-style CNI_ARGS)"
for p in "${PODS[@]}"; do
    mkns "$p"
    CID[$p]=$(printf '%s-%s' "$p" "$RUN" | sha256sum | cut -c1-64)
    UID_[$p]=$(cat /proc/sys/kernel/random/uuid)
done
declare -A MGMT_NET=([trainer-0]=mgmt-fixed [trainer-1]=mgmt [trainer-2]=mgmt)
attach trainer-0 mgmt-fixed net1 "$(jq -cn --arg ip "$FIXED_IP" '{ips: [$ip]}')"
attach trainer-1 mgmt net1
attach trainer-2 mgmt net1
for p in "${PODS[@]}"; do attach "$p" compute net2; done

heading "3. What each pod sees (ip -br addr)"
note "ipvlan interfaces report state UNKNOWN: they have no carrier of their own, which is normal."
for p in "${PODS[@]}"; do
    echo "   $p:"
    in_ns "$p" ip -br addr show | indent
done
if [ "$IPAM" = tether-ipam ]; then
    note "the node's leases (tether leases):"
    "$BIN/tether" leases --data-dir "$SCRATCH/ipam" | indent
fi

addr_of() { in_ns "$1" ip -4 -o addr show dev "$2" | awk '{print $4}' | cut -d/ -f1; }
FIXED=${FIXED_IP%/*}
[ "$(addr_of trainer-0 net1)" = "$FIXED" ] || die "trainer-0 net1 does not have $FIXED" "$(in_ns trainer-0 ip addr)"

heading "4. Traffic"
pingit() { # <from pod> <to ip> <label>
    step "$1 -> $3 ($2)" in_ns "$1" ping -c 2 -i 0.2 -W 2 "$2"
}
pingit trainer-1 "$FIXED" "trainer-0, management"
pingit trainer-2 "$(addr_of trainer-1 net1)" "trainer-1, management"
pingit trainer-0 "$MGMT_HOST" "host on management"
pingit trainer-0 "$(addr_of trainer-2 net2)" "trainer-2, compute"
pingit trainer-1 "$(addr_of trainer-0 net2)" "trainer-0, compute"
pingit trainer-2 "$COMPUTE_HOST" "host on compute"
check_pod() { cni check "${MGMT_NET[$1]}" "$1" net1 && cni check compute "$1" net2; }
for p in "${PODS[@]}"; do
    step "CHECK $p: both attachments are as ADD left them" check_pod "$p"
done

heading "5. Delete everything"
del_pod() { cni del compute "$1" net2 && cni del "${MGMT_NET[$1]}" "$1" net1; }
for p in "${PODS[@]}"; do
    step "$p: DEL net2 (compute), DEL net1 (management)" del_pod "$p"
done

heading "6. Nothing is left"
for p in "${PODS[@]}"; do
    links=$(in_ns "$p" ip -br link show | awk '{print $1}' | sed 's/@.*//' | tr '\n' ' ')
    [ "$links" = "lo " ] || die "$p still has links: $links"
done
ok "pods: only lo left"
links=$(ip -n "$(ns node)" -br link show | awk '{print $1}' | sed 's/@.*//' | sort | tr '\n' ' ')
[ "$links" = "enp5s0 enp6s0 lo " ] || die "node has unexpected links: $links"
ok "node: only lo, enp5s0, enp6s0"
case "$IPAM" in
    tether-ipam)
        held=$("$BIN/tether" leases --data-dir "$SCRATCH/ipam" -o json | jq '[.items[] | select(.state == "Leased")] | length')
        [ "$held" = 0 ] || die "$held leases still held" "$("$BIN/tether" leases --data-dir "$SCRATCH/ipam")"
        ok "tether-ipam: no lease held (released ones stay listed for cooldown and sticky re-use)"
        "$BIN/tether" leases --data-dir "$SCRATCH/ipam" | indent ;;
    host-local)
        held=$(find "$SCRATCH/ipam" -type f -regex '.*/[0-9.]+$' | wc -l)
        [ "$held" = 0 ] || die "$held host-local leases still held" "$(find "$SCRATCH/ipam" -type f)"
        ok "host-local: no lease held" ;;
esac
cached=$(find "$SCRATCH/cache" -type f | wc -l)
[ "$cached" = 0 ] || die "libcni cache still has $cached entries" "$(find "$SCRATCH/cache" -type f)"
ok "libcni cache: empty"

heading "demo passed"
