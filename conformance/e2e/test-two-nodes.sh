#!/usr/bin/env bash
# Two nodes on one wire (`make e2e-two-nodes`, after install.sh; issue 40 part 1): node B joins the
# cluster beside node A in the same VM (node-b.sh), tether's DaemonSet, installed on A as the
# README says, brings its agent up on B by itself; the seed's NADs, unchanged, serve both.
#
#   1. A pod on each node with mgmt-pool (net1) and compute (net2): real l2 ipvlan on each node's
#      own enp5s0/enp6s0, each address Leased to its pod on its node; the pods ping each other
#      across over net1 and net2, and B's pod pings the gateway.
#   2. TCP over net2 the way NCCL is told to use it (NCCL_SOCKET_IFNAME=net2: the interface's
#      address as the source): A's pod to B's pod, counted on A's net2; and host to host on the
#      same segment (A's enp6s0 to B's enp6s0, addresses .253/.254 added for it), in the same run.
#      The ratio is the figure: both ride the same emulated wire.
set -euo pipefail
. "$(dirname "${BASH_SOURCE[0]}")/checks.sh"
B=$E2E_NODE_B
BD=$E2E_DIR/node-b
bash "$E2E_HERE/node-b.sh"
ON_B() { CTR_NS=$(cat "$BD/pids/containerd.pid") "$@"; }

# ---- 1. a pod on each node, across ------------------------------------------------------------
NETS='[{"name": "mgmt-pool", "interface": "net1"}, {"name": "compute", "interface": "net2"}]'
seed_nads
t=$(now)
busybox_pod xa "$NETS" "$E2E_NODE"
busybox_pod xb "$NETS" "$B"
wait_running 300 xa xb
timing two-nodes-create-to-2-pods-running "$(since "$t")"
a1=$(assert_ipvlan xa net1 "$POOL_RE"); a2=$(assert_ipvlan xa net2 "$COMPUTE_RE")
b1=$(ON_B assert_ipvlan xb net1 "$POOL_RE"); b2=$(ON_B assert_ipvlan xb net2 "$COMPUTE_RE")
assert_leased "$a1" xa net1; assert_leased "$a2" xa net2
assert_leased "$b1" xb net1 "$B"; assert_leased "$b2" xb net2 "$B"
ping_from xa net1 "$b1"
ping_from xa net2 "$b2"
ON_B ping_from xb net1 "$a1"
ON_B ping_from xb net2 "$a2"
ON_B ping_from xb net1 10.20.30.1
pass "xa on $E2E_NODE (net1 $a1, net2 $a2) and xb on $B (net1 $b1, net2 $b2): l2 ipvlan on each node's own NICs, Leased on each node; they ping each other over net1 and net2, xb the gateway"

# ---- 2. TCP across: pod to pod over net2, host to host on the same segment ----------------------
MIB=64
# mib_per_s RX TX ADDRESS [SOURCE]: MiB/s of $MIB MiB over one TCP connection from TX to ADDRESS,
# where RX and TX are command prefixes that enter the receiver's and the sender's netns.
mib_per_s() {
  local rx=$1 tx=$2 to=$3 src=${4:-} port=5301 t0 l
  $rx socat -u "TCP-LISTEN:$port,reuseaddr" OPEN:/dev/null &
  l=$!
  listening() { $rx ss -Hltn "sport = :$port" | grep -q .; }
  wait_for 20 listening || { kill "$l" 2>/dev/null; return 1; }
  t0=$(now)
  head -c $((MIB << 20)) /dev/zero | timeout 300 $tx socat -u - "TCP:$to:$port${src:+,bind=$src}" || { kill "$l" 2>/dev/null; return 1; }
  wait "$l" || return 1
  awk -v a="$t0" -v b="$(now)" -v m="$MIB" 'BEGIN {printf "%.0f", m / (b - a)}'
}
in_ns() { echo "nsenter -t $1 -n"; }
tx_bytes() { nsenter -t "$1" -n ip -j -s link show dev "$2" | jq '.[0].stats64.tx.bytes'; }
pa=$(sandbox_pid xa); pb=$(ON_B sandbox_pid xb)
sent=$(tx_bytes "$pa" net2)
best_pods=0
for _ in 1 2 3; do
  r=$(mib_per_s "$(in_ns "$pb")" "$(in_ns "$pa")" "$b2" "$a2") || fail "TCP from xa ($a2, net2) to xb ($b2) failed"
  [ "$r" -le "$best_pods" ] || best_pods=$r
done
sent=$(( $(tx_bytes "$pa" net2) - sent ))
[ "$sent" -ge $((3 * MIB << 20)) ] || fail "TCP from $a2 to $b2 did not leave through xa's net2 ($sent bytes counted there)"
ip addr add 192.168.100.253/24 dev enp6s0
ip -n nodeb addr add 192.168.100.254/24 dev enp6s0
best_hosts=0
for _ in 1 2 3; do
  r=$(mib_per_s "ip netns exec nodeb" "" 192.168.100.254 192.168.100.253) || fail "TCP from $E2E_NODE's enp6s0 to $B's failed"
  [ "$r" -le "$best_hosts" ] || best_hosts=$r
done
ip addr del 192.168.100.253/24 dev enp6s0
ip -n nodeb addr del 192.168.100.254/24 dev enp6s0
ratio=$(awk -v p="$best_pods" -v h="$best_hosts" 'BEGIN {printf "%.2f", p / h}')
printf 'two-nodes-tcp-pod-to-pod-mib-s %s\ntwo-nodes-tcp-host-to-host-mib-s %s\n' "$best_pods" "$best_hosts" >>"$E2E_DIR/timings.txt"
pass "TCP from xa bound to net2's $a2 (as NCCL_SOCKET_IFNAME=net2 does) to xb on $B: $best_pods MiB/s, all of it through net2; host to host on the same segment: $best_hosts MiB/s; pods/hosts $ratio (best of 3 × $MIB MiB each; TCG emulates both paths, so only the ratio says something)"
delete_pods 120 xa xb
