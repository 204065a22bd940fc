#!/usr/bin/env bash
# Two nodes on one wire (issue 40 part 1; after test-release.sh, or install.sh in
# `make e2e-two-nodes`): node B joins the cluster beside node A in the same VM (node-b.sh), and
# tether's DaemonSet, installed on A as the release says, brings its agent up on B by itself; the
# seed's NADs, unchanged, serve both. test-node-gone.sh cuts B off next.
#
#   1. A pod on each node with mgmt-pool (net1) and compute (net2): real l2 ipvlan on each node's
#      own enp5s0/enp6s0, each address Leased to its pod on its node; the pods ping each other
#      across over net1 and net2, and B's pod pings the gateway.
#   2. A burst across both nodes into mgmt-pool's nine addresses (issue 40 part 2): one owner per
#      address on the wire, exhaustion named in the pods' events, freed addresses reused at once
#      on either node.
#   3. TCP over net2 the way NCCL is told to use it (NCCL_SOCKET_IFNAME=net2: the interface's
#      address as the source): A's pod to B's pod, counted on A's net2; and host to host on the
#      same segment (A's enp6s0 to B's enp6s0, addresses .253/.254 added for it), in the same run.
#      The ratio is the figure: both ride the same emulated wire.
#   4. A host takes xb's address: B's conflict guard reports it on xb within 5 s (part 5).
set -euo pipefail
. "$(dirname "${BASH_SOURCE[0]}")/checks.sh"
B=$E2E_NODE_B
bash "$E2E_HERE/node-b.sh"

# ---- 1. a pod on each node, across ------------------------------------------------------------
NETS='[{"name": "mgmt-pool", "interface": "net1"}, {"name": "compute", "interface": "net2"}]'
seed_nads
t=$(now)
busybox_pod xa "$NETS" "$E2E_NODE"
busybox_pod xb "$NETS" "$B"
wait_running 300 xa xb
timing two-nodes-create-to-2-pods-running "$(since "$t")"
a1=$(assert_ipvlan xa net1 "$POOL_RE"); a2=$(assert_ipvlan xa net2 "$COMPUTE_RE")
b1=$(on_b assert_ipvlan xb net1 "$POOL_RE"); b2=$(on_b assert_ipvlan xb net2 "$COMPUTE_RE")
assert_leased "$a1" xa net1; assert_leased "$a2" xa net2
assert_leased "$b1" xb net1 "$B"; assert_leased "$b2" xb net2 "$B"
ping_from xa net1 "$b1"
ping_from xa net2 "$b2"
on_b ping_from xb net1 "$a1"
on_b ping_from xb net2 "$a2"
on_b ping_from xb net1 10.20.30.1
pass "xa on $E2E_NODE (net1 $a1, net2 $a2) and xb on $B (net1 $b1, net2 $b2): l2 ipvlan on each node's own NICs, Leased on each node; they ping each other over net1 and net2, xb the gateway"

# ---- 2. a burst across both nodes into the ten-address pool --------------------------------------
# mgmt-pool has 9 usable addresses (.241-.250 without .245); xa and xb hold 2. Ten pods ask for
# one each, five bound to each node, all at once: 7 run, 3 are refused with the pool named in
# their events. From the gateway's side every leased address answers one ARP request with one
# reply, from the MAC of the node its pod runs on. Then 3 running pods are deleted, on the other
# node from the waiting ones where there is one: the waiting pods start with the freed addresses
# (nothing else is free, so the cooldown does not hold them back).
MGMT='[{"name": "mgmt-pool", "interface": "net1"}]'
BURST=()
for i in 1 2 3 4 5; do BURST+=(burst-a$i burst-b$i); done
# What the pool holds besides xa and xb (a quarantine left by an earlier check) is not given out.
taken=$(leases_json | jq --arg re "$POOL_RE" '[.items[] | select((.spec.address | test($re)) and (.spec.state == "Leased" or .spec.state == "Quarantined"))] | length')
FITS=$(( 9 - taken ))
[ "$FITS" -ge 3 ] || fail "burst: only $FITS of mgmt-pool's 9 addresses free before the burst"
t=$(now)
for i in 1 2 3 4 5; do busybox_pod "burst-a$i" "$MGMT" "$E2E_NODE"; busybox_pod "burst-b$i" "$MGMT" "$B"; done
node_of() { case $1 in *-b[0-9]*|xb) echo "$B" ;; *) echo "$E2E_NODE" ;; esac; }
exhausted() { event_text "$1" FailedCreatePodSandBox | grep -q 'no free address in range.*of network mgmt-pool'; }
settled() {
  local p r=0 x=0
  for p in "${BURST[@]}"; do
    if running "$p"; then r=$((r + 1)); elif exhausted "$p"; then x=$((x + 1)); fi
  done
  [ "$r" = "$FITS" ] && [ "$x" = $(( 10 - FITS )) ]
}
wait_for 300 settled || fail "burst: not $FITS Running and $(( 10 - FITS )) refused for exhaustion 300 s after creation: $(for p in "${BURST[@]}"; do printf '%s=%s ' "$p" "$(pod_phase "$p")"; done)"
timing two-nodes-burst-10-pods-settled "$(since "$t")"
RUN=(); WAIT=()
for p in "${BURST[@]}"; do if running "$p"; then RUN+=("$p"); else WAIT+=("$p"); fi; done
declare -A OWNER=([$a1]=xa [$b1]=xb)
for p in "${RUN[@]}"; do
  n=$(node_of "$p")
  if [ "$n" = "$B" ]; then a=$(on_b assert_ipvlan "$p" net1 "$POOL_RE"); else a=$(assert_ipvlan "$p" net1 "$POOL_RE"); fi
  [ -z "${OWNER[$a]:-}" ] || fail "burst: $a given to both $p and ${OWNER[$a]}"
  OWNER[$a]=$p
  assert_leased "$a" "$p" net1 "$n"
done
[ "${#OWNER[@]}" = $(( FITS + 2 )) ] || fail "burst: ${#OWNER[@]} addresses in use, not $(( FITS + 2 ))"
# One ARP reply per address, from the node's MAC: the gateway's neighbour cache emptied, every
# address pinged once, the replies captured on br-mgmt.
amac=$(ip -j link show dev enp5s0 | jq -r '.[0].address'); bmac=$(ip -n nodeb -j link show dev enp5s0 | jq -r '.[0].address')
ip -n e2e-wire neigh flush dev br-mgmt
ip netns exec e2e-wire timeout 60 tcpdump -l -nn -e -i br-mgmt 'arp[6:2] = 2' >"$E2E_DIR/burst-arp.txt" 2>"$E2E_DIR/burst-tcpdump.err" &
cap=$!
listening() { grep -q "listening on" "$E2E_DIR/burst-tcpdump.err"; }
wait_for 20 listening || fail "burst: tcpdump on br-mgmt did not start: $(cat "$E2E_DIR/burst-tcpdump.err")"
for a in "${!OWNER[@]}"; do ip netns exec e2e-wire ping -c 1 -W 3 "$a" >/dev/null || fail "burst: the gateway cannot reach $a (${OWNER[$a]})"; done
replied() { [ "$(grep -c 'is-at' "$E2E_DIR/burst-arp.txt")" -ge "${#OWNER[@]}" ]; }
# (A second owner's reply comes in the same round trip as the first, before the echo reply the
# ping waited for.)
wait_for 10 replied || true
kill "$cap" 2>/dev/null || true; wait "$cap" 2>/dev/null || true
for a in "${!OWNER[@]}"; do
  want=$amac; [ "$(node_of "${OWNER[$a]}")" != "$B" ] || want=$bmac
  got=$(awk -v a="$a" '{for (i = 2; i < NF; i++) if ($i == "is-at" && $(i - 1) == a) print $(i + 1)}' "$E2E_DIR/burst-arp.txt" | tr -d ',' | sort | tr '\n' ' ')
  [ "$got" = "$want " ] || fail "burst: ARP replies for $a (${OWNER[$a]} on $(node_of "${OWNER[$a]}")) came from '$got', not once from $want"
done
pass "burst across $E2E_NODE and $B into mgmt-pool: $FITS of 10 Running, $(( 10 - FITS )) refused naming the exhausted pool; the ${#OWNER[@]} leased addresses each answered one ARP request once from the gateway's side, with the MAC of its pod's node"
# Free as many as wait, on the other node from the waiting pods where possible.
VICTIMS=()
for w in "${WAIT[@]}"; do
  for p in "${RUN[@]}"; do
    [[ " ${VICTIMS[*]} " != *" $p "* ]] || continue
    if [ "$(node_of "$p")" != "$(node_of "$w")" ] || [ "$p" = "${RUN[-1]}" ]; then VICTIMS+=("$p"); break; fi
  done
done
FREED=(); for a in "${!OWNER[@]}"; do [[ " ${VICTIMS[*]} " != *" ${OWNER[$a]} "* ]] || FREED+=("$a"); done
t=$(now)
delete_pods 120 "${VICTIMS[@]}"
wait_running 180 "${WAIT[@]}"
reused_s=$(since "$t")
timing two-nodes-burst-freed-to-waiting-running "$reused_s"
for w in "${WAIT[@]}"; do
  n=$(node_of "$w")
  if [ "$n" = "$B" ]; then a=$(on_b assert_ipvlan "$w" net1 "$POOL_RE"); else a=$(assert_ipvlan "$w" net1 "$POOL_RE"); fi
  [[ " ${FREED[*]} " == *" $a "* ]] || fail "burst: $w got $a, not one of the freed ${FREED[*]}"
  assert_leased "$a" "$w" net1 "$n"
done
pass "burst: ${VICTIMS[*]} deleted → ${WAIT[*]} Running $reused_s s later with the freed ${FREED[*]} (on either node)"
delete_pods 180 "${RUN[@]}" "${WAIT[@]}"

# ---- 3. TCP across: pod to pod over net2, host to host on the same segment ----------------------
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
pa=$(sandbox_pid xa); pb=$(on_b sandbox_pid xb)
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
printf 'two-nodes-tcp-pod-to-pod-mib-s %s %s\ntwo-nodes-tcp-host-to-host-mib-s %s %s\n' "$best_pods" "${0##*/}" "$best_hosts" "${0##*/}" >>"$E2E_DIR/timings.txt"
pass "TCP from xa bound to net2's $a2 (as NCCL_SOCKET_IFNAME=net2 does) to xb on $B: $best_pods MiB/s, all of it through net2; host to host on the same segment: $best_hosts MiB/s; pods/hosts $ratio (best of 3 × $MIB MiB each; TCG emulates both paths, so only the ratio says something)"
# ---- 4. a host takes B's pod's address: B's conflict guard -------------------------------------
# The gateway's end of the wire (br-mgmt) is given xb's net1 address and speaks from it (the ARP
# request of one ping): B's agent, which alone leases it, reports the claim within 5 s (an
# AddressConflict Event on xb naming the address and the MAC, the claim counted by B's agent).
b_metrics() { curl -fsS --max-time 10 "http://$(agent_json "$B" | jq -r .status.podIP):9464/metrics"; }
b_watches() { [ "$(b_metrics | awk '/^tether_guard_watched_addresses\{interface="enp5s0"\}/ {print $2}')" -ge 1 ]; }
wait_for 30 b_watches || fail "guard on $B: its agent watches no address on enp5s0: $(b_metrics | grep '^tether_guard')"
ip -n e2e-wire addr add "$b1/24" dev br-mgmt
gmac=$(ip -n e2e-wire -j link show dev br-mgmt | jq -r '.[0].address')
ip -n e2e-wire neigh flush dev br-mgmt
t=$(now)
ip netns exec e2e-wire ping -c 1 -W 1 -I "$b1" "$a1" >/dev/null 2>&1 || true
b_claim_event() {
  pod_events_json xb AddressConflict |
    jq -e --arg a "$b1" --arg m "$gmac" '[.items[] | select((.message | contains($a)) and (.message | contains($m)))] | length == 1'
}
wait_for 5 b_claim_event || { pod_events default xb >&2; fail "guard on $B: no AddressConflict Event naming $b1 and $gmac on xb within 5 s of the claim"; }
claim_s=$(since "$t")
timing two-nodes-guard-claim-to-event "$claim_s"
grep -q "^tether_address_claims_total{network=\"mgmt-pool\",address=\"$b1\",mac=\"$gmac\"} 1$" <<<"$(b_metrics)" ||
  fail "guard on $B: its agent does not count the claim: $(b_metrics | grep '^tether_address_claim')"
ip -n e2e-wire addr del "$b1/24" dev br-mgmt
pass "guard on $B: $b1 of xb spoken for by the gateway's $gmac → AddressConflict Event on xb in $claim_s s, the claim counted by $B's agent"
delete_pods 120 xa xb
