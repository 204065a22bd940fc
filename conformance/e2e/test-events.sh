#!/usr/bin/env bash
# The e2e checks, part 2 (after test.sh, in the lab VM): what a user sees when something is wrong.
# Each fault is made for real, the pod's FailedCreatePodSandBox event (what `kubectl describe pod`
# shows) must name the network and the cause and say what to do, nothing may stay leased for the
# failed pod, and once the cause is fixed the pod must start by itself (the kubelet retries).
#
#   1. An exhausted pool (NAD tiny: one address, held by another pod) → freed by deleting that pod.
#   2. A fixed address in use on the wire (10.20.30.239 configured in netns e2e-wire) → removed there.
#   3. A master that is down (enp7s0, administratively down) → `ip link set enp7s0 up`.
#   4. "store": "kubernetes" without a kubeconfig: the pod does not start, and it can be deleted
#      (its DEL succeeds although no ADD can work with that config).
#   5. The IPLease CRD missing (deleted, with no pod holding a tether address) → deploy/tether.yaml
#      applied again.
#   (After 2.) A pool address another host answers for: an AddressConflict Event on the pod, as
#      docs/monitoring.md's commands show it. Then a host that takes a running pod's address: the
#      node-agent's conflict guard reports it (Event, metric, mark on the lease) and defends it.
#   (Before 5.) Two NADs on one segment: a pod asking mgmt-fixed (the whole /24) for the address
#      mgmt-pool gave trainer-0 is refused, naming the holder; deleting it leaves trainer-0's lease.
# Times: fault seen (event) and fixed → Running, in $E2E_DIR/timings.txt.
set -euo pipefail
. "$(dirname "${BASH_SOURCE[0]}")/checks.sh"

# ---- 1. an exhausted pool ------------------------------------------------------------------------
nad tiny enp5s0 10.20.30.200-10.20.30.200/24
busybox_pod tiny-a '[{"name": "tiny", "interface": "net1"}]'
wait_running 180 tiny-a
[ "$(addr_of tiny-a net1)" = 10.20.30.200 ] || fail "tiny-a has net1 $(addr_of tiny-a net1), not the pool's one address"
busybox_pod tiny-b '[{"name": "tiny", "interface": "net1"}]'
expect_event tiny-b exhausted 'error adding container to network "tiny"' 'no free address in range' \
  '10.20.30.200' 'of network tiny' '1 leased' 'delete pods that no longer need this network or widen the range'
delete_pods 120 tiny-a
recovers tiny-b exhausted
[ "$(addr_of tiny-b net1)" = 10.20.30.200 ] || fail "tiny-b started with net1 $(addr_of tiny-b net1), not 10.20.30.200"
assert_leased 10.20.30.200 tiny-b net1
pass "exhausted: tiny-a deleted → tiny-b Running by itself with 10.20.30.200"
delete_pods 120 tiny-b

# ---- 2. a fixed address in use on the wire -------------------------------------------------------
ip -n e2e-wire addr add 10.20.30.239/24 dev wire0
mac=$(ip -n e2e-wire -j link show dev wire0 | jq -r '.[0].address')
busybox_pod fixed-b '[{"name": "mgmt-fixed", "interface": "net1", "ips": ["10.20.30.239/24"]}]'
expect_event fixed-b in-use 'error adding container to network "mgmt-fixed"' \
  "requested address 10.20.30.239 of network mgmt-fixed is already in use on the segment by MAC $mac" \
  'free it on the host with that MAC, or request another address'
ip -n e2e-wire addr del 10.20.30.239/24 dev wire0
recovers fixed-b in-use
[ "$(addr_of fixed-b net1)" = 10.20.30.239 ] || fail "fixed-b started with net1 $(addr_of fixed-b net1), not 10.20.30.239"
assert_leased 10.20.30.239 fixed-b net1
pass "in-use: 10.20.30.239 removed from the wire → fixed-b Running by itself with it"
delete_pods 120 fixed-b

# ---- 3. a master that is down ----------------------------------------------------------------------
ip link set enp7s0 down
nad side enp7s0 10.30.0.10-10.30.0.20/24
busybox_pod side-a '[{"name": "side", "interface": "net1"}]'
expect_event side-a master-down 'error adding container to network "side"' \
  'master interface "enp7s0" on the host is administratively down' 'ip link set enp7s0 up' \
  'retries the pod by itself'
ip link set enp7s0 up
recovers side-a master-down
assert_ipvlan side-a net1 '^10\.30\.0\.(1[0-9]|20)$' >/dev/null
pass "master-down: enp7s0 brought up → side-a Running by itself"
delete_pods 120 side-a

# ---- 4. whereabouts' "datastore": "etcd" ----------------------------------------------------------
# A NAD moved from whereabouts' etcd days: refused (code 7) saying what to remove. (A NAD with
# "store": "kubernetes" and no kubeconfig, the case here before, now uses the node-agent's.)
K apply -f - >&2 <<'EOF' || fail "creating NAD mgmt-etcd"
apiVersion: k8s.cni.cncf.io/v1
kind: NetworkAttachmentDefinition
metadata: {name: mgmt-etcd, namespace: default}
spec:
  config: |
    {"cniVersion": "1.0.0", "type": "tether-ipvlan", "master": "enp5s0",
     "ipam": {"type": "tether-ipam", "range": "10.20.30.241-10.20.30.250/24", "datastore": "etcd",
              "etcd_host": "etcd.example:2379"}}
EOF
busybox_pod etcd '[{"name": "mgmt-etcd", "interface": "net1"}]'
expect_event etcd etcd 'error adding container to network "mgmt-etcd"' \
  'ipam.datastore "etcd"' 'remove "datastore" and the etcd_* keys'
# containerd calls DEL for the failed sandbox, and again on every StopPodSandbox, with the ADD's
# configuration. Seen on the first runs: tether-ipam's DEL failed like the ADD, so the pod stayed
# Terminating for ever (FailedKillPod); DEL now succeeds under a configuration no ADD can work with.
t=$(now)
K -n default delete pod etcd --wait=false >&2
if ! wait_for 60 gone etcd; then
  fk=$(event_text etcd FailedKillPod)
  K -n default delete pod etcd --force --grace-period=0 >&2 2>/dev/null || true
  fail "etcd stuck Terminating 60 s after delete: its CNI DEL fails (FailedKillPod: ${fk:0:300})"
fi
timing delete-failed-pod-to-gone "$(since "$t")"
pass "etcd deleted (its DEL succeeds)"

# ---- an address conflict on the wire, as docs/monitoring.md shows it -----------------------------
# A pool whose one address another host uses (configured in netns e2e-wire): the ADD's probe is
# answered, the address quarantined, and the node-agent posts an AddressConflict Event on the pod.
# docs/monitoring.md's commands, run as written, show it: namespace train, pod worker-3, as there.
K get namespace train >/dev/null 2>&1 || K create namespace train >&2
K apply -f - >&2 <<'EOF' || fail "creating NAD train/conflict"
apiVersion: k8s.cni.cncf.io/v1
kind: NetworkAttachmentDefinition
metadata: {name: conflict, namespace: train}
spec:
  config: '{"cniVersion": "1.0.0", "type": "tether-ipvlan", "master": "enp5s0", "ipam": {"type": "tether-ipam", "range": "10.20.30.231-10.20.30.231/24", "gateway": "10.20.30.1", "kubernetes": {"kubeconfig": "/etc/cni/net.d/tether.d/tether.kubeconfig"}}}'
EOF
ip -n e2e-wire addr add 10.20.30.231/24 dev wire0
K apply -f - >&2 <<'EOF' || fail "creating pod train/worker-3"
apiVersion: v1
kind: Pod
metadata:
  name: worker-3
  namespace: train
  annotations: {k8s.v1.cni.cncf.io/networks: '[{"name": "conflict", "interface": "net1"}]'}
spec:
  terminationGracePeriodSeconds: 1
  containers:
  - {name: main, image: busybox:1.35, command: ["sleep", "3600"]}
EOF
t=$(now)
conflict_posted() { [ -n "$(K -n train get events --field-selector reason=AddressConflict,involvedObject.name=worker-3 -o name)" ]; }
wait_for 150 conflict_posted || { K -n train get events >&2; fail "conflict: no AddressConflict Event on train/worker-3 within 150 s"; }
timing conflict-create-to-event "$(since "$t")"
OUT=$(KUBECONFIG=$E2E_DIR/cp/guest-admin.kubeconfig bash -euo pipefail -c "$(cd "$E2E_ROOT" && python3 conformance/docs/blocks.py extract docs/monitoring.md conflict-events)" 2>&1) ||
  { echo "$OUT" >&2; fail "docs/monitoring.md conflict-events failed as written"; }
mac=$(ip -n e2e-wire -j link show dev wire0 | jq -r '.[0].address')
grep -q "train .*AddressConflict .*10.20.30.231.*$mac" <<<"$OUT" && grep -q "Warning  *AddressConflict" <<<"$OUT" ||
  { echo "$OUT" >&2; fail "docs/monitoring.md conflict-events does not show the conflict of 10.20.30.231 ($mac) on train/worker-3"; }
pass "conflict: 10.20.30.231 answered by $mac on the wire → AddressConflict Event on train/worker-3, shown by docs/monitoring.md's commands as written"
ip -n e2e-wire addr del 10.20.30.231/24 dev wire0
K delete namespace train --wait=false >&2

# ---- a host takes a running pod's address: the node-agent's conflict guard ------------------------
# A pod runs with 10.20.30.233 (NAD guarded, "defend": true); then netns e2e-wire, the segment's
# other end, is given that address and speaks from it (the ARP request of one ping). The guard on
# enp5s0 sees the claim: within 5 s an AddressConflict Event on the pod naming the address and
# e2e-wire's MAC; the claim counted; the IPLease marked, and `tether leases` says so; one
# gratuitous ARP back from the master, in defence.
K apply -f - >&2 <<'EOF' || fail "creating NAD guarded"
apiVersion: k8s.cni.cncf.io/v1
kind: NetworkAttachmentDefinition
metadata: {name: guarded, namespace: default}
spec:
  config: '{"cniVersion": "1.0.0", "type": "tether-ipvlan", "master": "enp5s0", "ipam": {"type": "tether-ipam", "range": "10.20.30.233-10.20.30.233/24", "gateway": "10.20.30.1", "defend": true}}'
EOF
agent_ip=$(K -n kube-system get pod "$(agent_pod)" -o jsonpath='{.status.podIP}')
agent_metrics() { curl -fsS --max-time 10 "http://$agent_ip:9464/metrics"; }
watched() { agent_metrics | awk '/^tether_guard_watched_addresses\{interface="enp5s0"\}/ {print $2}'; }
before=$(watched) || fail "guard: cannot read the node-agent's metrics on $agent_ip:9464"
busybox_pod guarded '[{"name": "guarded", "interface": "net1"}]'
wait_running 180 guarded
[ "$(addr_of guarded net1)" = 10.20.30.233 ] || fail "guard: guarded has net1 $(addr_of guarded net1), not 10.20.30.233"
t=$(now)
one_more_watched() { [ "$(watched)" = $(( ${before:-0} + 1 )) ]; }
wait_for 30 one_more_watched ||
  fail "guard: 30 s after guarded runs the agent watches $(watched) addresses on enp5s0, not $(( ${before:-0} + 1 )): $(agent_metrics | grep '^tether_guard')"
timing guard-running-to-watched "$(since "$t")"
master_mac=$(ip -j link show dev enp5s0 | jq -r '.[0].address')
# The defence: a gratuitous ARP for .233 (0x0a141ee9, as sender and as target) from the master.
ip netns exec e2e-wire timeout 30 tcpdump -c 1 -l -nn -i wire0 \
  "arp and ether src $master_mac and arp[14:4] = 0x0a141ee9 and arp[24:4] = 0x0a141ee9" \
  >"$E2E_DIR/guard-defence.txt" 2>"$E2E_DIR/guard-tcpdump.err" &
capture=$!
listening() { grep -q "listening on" "$E2E_DIR/guard-tcpdump.err"; }
wait_for 20 listening || fail "guard: tcpdump in e2e-wire did not start: $(cat "$E2E_DIR/guard-tcpdump.err")"
ip -n e2e-wire addr add 10.20.30.233/24 dev wire0
mac=$(ip -n e2e-wire -j link show dev wire0 | jq -r '.[0].address')
# Its neighbour cache emptied first: an entry left from the checks before (.250 was a pod's) would
# let the ping go out without an ARP request, and the claim with it.
ip -n e2e-wire neigh flush dev wire0
t=$(now)
ip netns exec e2e-wire ping -c 1 -W 1 -I 10.20.30.233 10.20.30.250 >/dev/null 2>&1 || true
claim_event() {
  pod_events_json guarded AddressConflict |
    jq -e --arg m "$mac" '[.items[] | select((.message | contains("10.20.30.233")) and (.message | contains($m)))] | length == 1'
}
wait_for 5 claim_event || { pod_events default guarded >&2; fail "guard: no AddressConflict Event naming 10.20.30.233 and $mac on guarded within 5 s of the claim"; }
claim_s=$(since "$t")
timing guard-claim-to-event "$claim_s"
wait "$capture" || fail "guard: no defence from $master_mac on the wire: $(cat "$E2E_DIR/guard-tcpdump.err")"
grep -q "10.20.30.233" "$E2E_DIR/guard-defence.txt" ||
  fail "guard: the captured defence is not a gratuitous ARP for 10.20.30.233: $(cat "$E2E_DIR/guard-defence.txt")"
marked() {
  lease_of 10.20.30.233 |
    jq -e --arg m "$mac" '.metadata.labels["ipam.tether.dev/claimed"] == "true" and .metadata.annotations["ipam.tether.dev/claimed-by"] == $m'
}
wait_for 5 marked || fail "guard: the IPLease of 10.20.30.233 is not marked as claimed by $mac: $(lease_of 10.20.30.233)"
shown=$(env -u KUBECONFIG HOME=/nonexistent "$E2E_ROOT/target/image/tether" leases --network guarded 2>&1) ||
  fail "guard: tether leases failed: $shown"
grep -q "Leased, claimed by $mac" <<<"$shown" || fail "guard: tether leases does not show the claim: $shown"
grep -q "^tether_address_claims_total{network=\"guarded\",address=\"10.20.30.233\",mac=\"$mac\"} 1$" <<<"$(agent_metrics)" ||
  fail "guard: tether_address_claims_total does not count the claim: $(agent_metrics | grep '^tether_address_claim')"
pass "guard: 10.20.30.233 of running pod guarded spoken for by $mac on the wire → AddressConflict Event in $claim_s s, one gratuitous ARP back from $master_mac, the claim counted, the IPLease marked and shown by tether leases"
ip -n e2e-wire addr del 10.20.30.233/24 dev wire0
delete_pods 120 guarded
released 10.20.30.233 || fail "guard: guarded deleted, the IPLease of 10.20.30.233 is $(lease_state 10.20.30.233)"
[ -z "$(lease_of 10.20.30.233 | jq -r '.metadata.labels["ipam.tether.dev/claimed"] // empty')" ] ||
  fail "guard: the released IPLease of 10.20.30.233 still carries the claim mark"
K delete net-attach-def guarded >&2

# ---- one address, one holder across NADs ---------------------------------------------------------
# mgmt-fixed spans the /24 that mgmt-pool's range is part of: the address the pool gave trainer-0
# is refused to a pod that asks mgmt-fixed for it.
pooled=$(leases_json | jq -r '.items[] | select(.spec.pod.name == "trainer-0" and .spec.network == "mgmt-pool" and .spec.state == "Leased") | .spec.address')
[ -n "$pooled" ] || fail "cross-nad: trainer-0 holds no mgmt-pool lease"
busybox_pod cross '[{"name": "mgmt-fixed", "interface": "net1", "ips": ["'"$pooled"'/24"]}]'
expect_event cross cross-nad 'error adding container to network "mgmt-fixed"' \
  "requested address $pooled is held by pod default/trainer-0" 'network mgmt-pool'
delete_pods 120 cross
assert_leased "$pooled" trainer-0 net1
pass "cross-nad: $pooled, from mgmt-pool, refused to a pod asking mgmt-fixed; still trainer-0's"

# ---- a whereabouts NAD with only its type changed -----------------------------------------------
# whereabouts' README NAD (macvlan in bridge mode, no kubernetes block) with its log_file example,
# "type" changed to tether-ipam, and this node's enp7s0 for the README's eth0 (not a NIC here; and
# enp5s0 has ipvlan ports, which a macvlan cannot share). The node-agent is installed, so the lease
# is an IPLease in the cluster store, under the agent's credential, not a node-local file.
K apply -f - >&2 <<'EOF' || fail "creating NAD whereaboutsexample"
apiVersion: k8s.cni.cncf.io/v1
kind: NetworkAttachmentDefinition
metadata: {name: whereaboutsexample, namespace: default}
spec:
  config: |
    {"cniVersion": "0.3.0", "name": "whereaboutsexample", "type": "macvlan", "master": "enp7s0", "mode": "bridge",
     "ipam": {"type": "tether-ipam", "range": "192.168.2.225/28",
              "log_file": "/tmp/whereabouts.log", "log_level": "debug"}}
EOF
busybox_pod wb '[{"name": "whereaboutsexample", "interface": "net1"}]'
wait_running 180 wb
pid=$(sandbox_pid wb) || fail "no running sandbox for wb"
kind=$(in_pod "$pid" ip -j -d link show dev net1 | jq -r '.[0].linkinfo.info_kind')
[ "$kind" = macvlan ] || fail "net1 of wb is a '$kind' link, not macvlan"
a=$(addr_of wb net1)
[[ "$a" =~ ^192\.168\.2\.(22[5-9]|23[0-8])$ ]] || fail "net1 of wb has '$a', not an address of 192.168.2.225/28"
assert_leased "$a" wb net1
[ "$(lease_of "$a" | jq -r '.spec.network')" = whereaboutsexample ] || fail "the IPLease of $a is not of network whereaboutsexample: $(lease_of "$a")"
# The file store's state files are the dataDir's *.json; journal/ is the cluster store's own.
! grep -qs whereaboutsexample /var/lib/cni/tether/*.json || fail "the node-local file store holds whereaboutsexample: $(grep -ls whereaboutsexample /var/lib/cni/tether/*.json)"
delete_pods 120 wb
released "$a" || fail "wb deleted: the IPLease of $a is $(lease_state "$a"), not Released"
pass "whereabouts' README NAD with only its type changed: wb Running with macvlan net1 $a, an IPLease in the cluster (no file store), Released on delete"

# ---- 5. the IPLease CRD missing ------------------------------------------------------------------
# Deleting the CRD deletes every IPLease: first every pod holding a tether address goes, or the
# next ADD could hand out an address a running pod still has.
K -n default delete statefulset trainer >&2
delete_pods 180 trainer-0 trainer-1 login
# As docs/upgrade.md says: the policy tether-iplease-crd-guard refuses the delete without it.
K annotate crd "$LEASES" ipam.tether.dev/delete-all-leases=true >&2
K delete crd "$LEASES" >&2
crd_gone() { ! K get crd "$LEASES"; }
wait_for 60 crd_gone || fail "the IPLease CRD is still there 60 s after delete"
busybox_pod crd-a '[{"name": "mgmt-pool", "interface": "net1"}]'
expect_event crd-a crd-missing 'error adding container to network "mgmt-pool"' \
  "the IPLease custom resource ($LEASES) is not installed" 'kubectl apply -f'
K apply -f "$E2E_ROOT/deploy/tether.yaml" >&2 || fail "kubectl apply -f deploy/tether.yaml (again)"
recovers crd-a crd-missing
a=$(assert_ipvlan crd-a net1 "$POOL_RE")
assert_leased "$a" crd-a net1
wait_for 120 agent_ready || fail "the node-agent is not Ready after the CRD came back"
pass "crd-missing: deploy/tether.yaml applied again → crd-a Running by itself with $a; the node-agent Ready"
delete_pods 120 crd-a
