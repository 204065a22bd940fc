#!/usr/bin/env bash
# The e2e checks, part 1, run by node.sh INSIDE the lab VM once the node is Ready: tether installed
# as the README says, the seed's training setup as users write it, and its lifecycle through the
# real kubelet. Part 2 (what users see when something is wrong) is test-events.sh.
#
#   1. (install.sh, run before this) deploy/tether.yaml applied unchanged, the node-agent Ready,
#      the plugins and their kubeconfig (a node-bound token) on the node.
#   2. The three NADs of deploy/examples, unchanged: mgmt-pool (.241-.250 but .245), mgmt-fixed
#      (the whole /24 the pool is part of, addresses named by the pod), compute (enp6s0,
#      192.168.100.10-250).
#   3. The recipes of deploy/recipes, unchanged: a StatefulSet of two trainers (net1 from the pool,
#      net2 compute) and one fixed-address pod (net1 10.20.30.240, net2) reach Running; net1/net2 are l2 ipvlan links with the right
#      addresses; the pods ping each other over net2 and the gateway over net1; each address is
#      Leased to its pod on this node; Multus' network-status lists them; the ADDs went through
#      the node-agent's lease service (its metrics).
#   4. A StatefulSet pod deleted: the kubelet's DEL releases its leases; its replacement (same name,
#      new UID) gets the same two addresses.
#   5. A sandbox that dies (its process killed): the kubelet re-creates it (DEL, then ADD with a new
#      sandbox id) and the pod keeps its addresses.
#   6. The node-agent pod deleted: the DaemonSet replaces it; running pods and their leases are
#      untouched.
#   7. 8 pods (two tether networks each) created while the DaemonSet is rolled to a new image
#      whose plugins differ: all Running, no sandbox failed in tether, the plugins on the node are
#      the new ones, every address leased once; the 8 deleted: all 16 leases Released. (The burst
#      into a small pool, across nodes, is test-two-nodes.sh's; this one is about the roll.)
# Times (seconds) go to $E2E_DIR/timings.txt; what was seen to $E2E_DIR/results.txt.
set -euo pipefail
. "$(dirname "${BASH_SOURCE[0]}")/checks.sh"

# ---- 2. the NADs of deploy/examples, unchanged -------------------------------------------------
seed_nads
wait_for 60 K -n default get serviceaccount default || fail "no default ServiceAccount"
pass "NADs mgmt-pool, mgmt-fixed, compute applied from deploy/examples"

# ---- 3. the training setup: a StatefulSet of trainers and a fixed-address pod ------------------
t=$(now)
# The recipes of docs/recipes.md, unchanged (their busybox:1.35 is the node's local image).
for r in trainer-statefulset fixed-address-pod; do
  K apply -f "$E2E_ROOT/deploy/recipes/$r.yaml" >&2 || fail "kubectl apply -f deploy/recipes/$r.yaml"
done
pods_exist() { K -n default get pod trainer-0 trainer-1; }
wait_for 60 pods_exist || fail "the StatefulSet controller did not create trainer-0 and trainer-1"
wait_running "${TETHER_E2E_POD_TIMEOUT:-240}" trainer-0 trainer-1 login
timing create-to-3-pods-running "$(since "$t")"
declare -A NET1 NET2
for p in trainer-0 trainer-1 login; do
  re=$POOL_RE; [ $p != login ] || re='^10\.20\.30\.240$'
  NET1[$p]=$(assert_ipvlan $p net1 "$re")
  NET2[$p]=$(assert_ipvlan $p net2 "$COMPUTE_RE")
  eth0=$(addr_of $p eth0)
  [[ "$eth0" == 10.244.0.* ]] || fail "eth0 of $p has '$eth0', not an address of the cluster network 10.244.0.0/24"
  pass "$p Running: net1 ipvlan l2 ${NET1[$p]} (enp5s0), net2 ipvlan l2 ${NET2[$p]} (enp6s0), eth0 $eth0"
done
[ "${NET1[trainer-0]}" != "${NET1[trainer-1]}" ] && [ "${NET2[trainer-0]}" != "${NET2[trainer-1]}" ] &&
  [ "${NET2[login]}" != "${NET2[trainer-0]}" ] && [ "${NET2[login]}" != "${NET2[trainer-1]}" ] ||
  fail "two pods share an address: net1 ${NET1[*]}, net2 ${NET2[*]}"
ping_from trainer-0 net2 "${NET2[trainer-1]}"
ping_from trainer-1 net2 "${NET2[login]}"
ping_from login net2 "${NET2[trainer-0]}"
ping_from trainer-1 net1 10.20.30.1
ping_from login net1 10.20.30.1
pass "over net2 trainer-0 → trainer-1 → login → trainer-0 ping; trainer-1 and login ping the gateway 10.20.30.1 over net1"
for p in trainer-0 trainer-1 login; do
  assert_leased "${NET1[$p]}" $p net1
  assert_leased "${NET2[$p]}" $p net2
  status=$(K -n default get pod $p -o jsonpath='{.metadata.annotations.k8s\.v1\.cni\.cncf\.io/network-status}')
  net1_nad=default/mgmt-pool; [ $p != login ] || net1_nad=default/mgmt-fixed
  for pair in "$net1_nad ${NET1[$p]} net1" "default/compute ${NET2[$p]} net2"; do
    set -- $pair
    jq -e --arg n "$1" --arg a "$2" --arg i "$3" '.[] | select(.name == $n and .interface == $i) | .ips | index($a)' <<<"$status" >/dev/null ||
      fail "Multus' network-status of $p does not list $2 on $3 for $1: $status"
  done
done
pass "each address Leased to its pod (name, namespace, UID, interface) on $E2E_NODE; network-status lists net1 and net2 of each"

# One holder per address on the wire: each record is named by its address alone (these NADs name
# no isolated fabric). No controller has decided yet that every agent names leases so, so each
# record also has its mirror under the old name <network>.<address>, which a tether from before
# uniqueness domains would find (test-node-gone.sh sees the controller end them).
for p in trainer-0 trainer-1 login; do
  for a in "${NET1[$p]}" "${NET2[$p]}"; do
    name=$(lease_of "$a" | jq -r .metadata.name)
    [ "$name" = "$a" ] || fail "the IPLease of $a is named '$name', not by its address"
    mirrors_json | jq -e --arg a "$a" --argjson l "$(lease_of "$a")" \
      '[.items[] | select(.spec.address == $a and .spec.network == $l.spec.network and .spec.pod.uid == $l.spec.pod.uid
                          and .metadata.name == ($l.spec.network + "." + $a))] | length == 1' >/dev/null ||
      fail "no mirror named <network>.$a of the lease of $a while the controller has not decided: $(mirrors_json | jq -c --arg a "$a" '[.items[] | select(.spec.address == $a) | .metadata.name]')"
  done
done
pass "each lease named by its address, with its mirror under the old name while no controller has decided"

# Those six ADDs went through the node-agent's lease service (the NADs name the kubeconfig it
# writes), and the networks are kept by its watch: its metrics (hostNetwork, port 9464) say so.
agent_ip=$(K -n kube-system get pod "$(agent_pod)" -o jsonpath='{.status.podIP}')
metrics=$(curl -fsS --max-time 10 "http://$agent_ip:9464/metrics") || fail "cannot read the node-agent's metrics on $agent_ip:9464"
welcomed=$(awk '/^tether_lease_service_connections_total\{outcome="welcomed"\}/ {print $2}' <<<"$metrics")
synced=$(grep -c '^tether_lease_service_network_records{.*standing="synced"}' <<<"$metrics" || true)
[ "${welcomed:-0}" -ge 6 ] && [ "$synced" -ge 2 ] ||
  fail "the plugins did not go through the node-agent: $welcomed calls welcomed, $synced networks kept; $(grep '^tether_lease_service' <<<"$metrics")"
pass "the plugins' lease requests went through the node-agent ($welcomed calls welcomed; $synced networks kept by its watch)"

# The operator's view, found with no flag: `tether leases` and `tether pools` in the agent's
# container (its service account, as `kubectl -n kube-system exec ds/tether -- tether leases` runs
# them; exec goes through containerd here, see checks.sh) and as root on the node (the credential
# the agent writes for the plugins). Each lists what the API server holds, and says where it read.
kube_leased=$(leases_json | jq -c '[.items[] | select(.spec.state == "Leased") | .spec.address] | sort')
agent_ctr=$(CTR containers ls -q "labels.\"io.kubernetes.pod.name\"==$(agent_pod),labels.\"io.kubernetes.container.name\"==agent")
[ -n "$agent_ctr" ] || fail "no container 'agent' of the node-agent pod $(agent_pod) in containerd"
cli_in_agent() { CTR tasks exec --exec-id "cli-$RANDOM" "$agent_ctr" tether "$@"; }
cli_on_node() { env -u KUBECONFIG HOME=/nonexistent "$E2E_ROOT/target/image/tether" "$@"; }
for where in cli_in_agent cli_on_node; do
  out=$($where leases --state Leased -o json 2>"$E2E_DIR/cli.err") || fail "$where: tether leases failed: $(cat "$E2E_DIR/cli.err")"
  got=$(jq -c '[.items[] | .address] | sort' <<<"$out")
  [ "$got" = "$kube_leased" ] || fail "$where: tether leases lists $got, kubectl $kube_leased; $(cat "$E2E_DIR/cli.err")"
  want_source="this pod's service account"; [ $where = cli_in_agent ] || want_source="this node's tether credential"
  grep -q "from the cluster store at https://.*$want_source" "$E2E_DIR/cli.err" ||
    fail "$where: tether leases does not say it read the cluster store with $want_source: $(cat "$E2E_DIR/cli.err")"
  # mgmt-pool's pool: .241-.250 without .245, 9 addresses; the trainers' net1 addresses are in it.
  pools=$($where pools --network mgmt-pool -o json 2>"$E2E_DIR/cli.err") || fail "$where: tether pools failed: $(cat "$E2E_DIR/cli.err")"
  in_pool=$(jq --arg re "$POOL_RE" '[.[] | select(test($re))] | length' <<<"$kube_leased")
  jq -e --argjson n "$in_pool" '.items | length == 1 and .[0].size == 9 and .[0].leased == $n and .[0].free == 9 - $n' <<<"$pools" >/dev/null ||
    fail "$where: tether pools says $(jq -c .items <<<"$pools"); the API server holds $in_pool leases in mgmt-pool's range"
done
pass "tether leases and tether pools with no flag, in the agent's container and as root on the node: the API server's $(jq length <<<"$kube_leased") leases; mgmt-pool $in_pool of 9 leased"

# ---- 4. a StatefulSet pod deleted and re-created keeps its addresses ---------------------------
old_uid=$(pod_uid trainer-1)
t=$(now)
K -n default delete pod trainer-1 --wait=false >&2
both_released() { released "${NET1[trainer-1]}" && released "${NET2[trainer-1]}"; }
replaced() { [ "$(pod_uid trainer-1 2>/dev/null)" != "$old_uid" ] && running trainer-1; }
# The StatefulSet controller re-creates trainer-1 as soon as the old one is gone, so the Released
# state may be short: seen on the way, or implied by the new UID holding the lease.
seen_released=no
deadline=$(( $(date +%s) + 180 ))
until replaced; do
  [ $seen_released = yes ] || ! both_released || { seen_released=yes; timing delete-to-leases-released "$(since "$t")"; }
  [ "$(date +%s)" -lt "$deadline" ] || { pod_events default trainer-1 >&2; fail "trainer-1 not re-created and Running 180 s after its deletion"; }
  sleep 1
done
timing statefulset-pod-delete-to-replacement-running "$(since "$t")"
n1=$(assert_ipvlan trainer-1 net1 "$POOL_RE"); n2=$(assert_ipvlan trainer-1 net2 "$COMPUTE_RE")
[ "$n1" = "${NET1[trainer-1]}" ] && [ "$n2" = "${NET2[trainer-1]}" ] ||
  fail "trainer-1 re-created with net1 $n1 / net2 $n2; it had ${NET1[trainer-1]} / ${NET2[trainer-1]}"
assert_leased "$n1" trainer-1 net1; assert_leased "$n2" trainer-1 net2
pass "trainer-1 deleted (leases Released on the way: $seen_released) and re-created by the StatefulSet with a new UID: same net1 $n1 and net2 $n2"

# ---- 5. a sandbox that dies is re-created with the same addresses ------------------------------
old_sb=$(sandbox_id trainer-0); pid=$(sandbox_pid trainer-0)
t=$(now)
kill -KILL "$pid"
new_sandbox() { local s; s=$(sandbox_id trainer-0) && [ "$s" != "$old_sb" ] && running trainer-0; }
wait_for 180 new_sandbox || { pod_events default trainer-0 >&2; fail "trainer-0's sandbox not re-created 180 s after its process was killed"; }
timing sandbox-killed-to-new-sandbox "$(since "$t")"
new_sb=$(sandbox_id trainer-0)
n1=$(assert_ipvlan trainer-0 net1 "$POOL_RE"); n2=$(assert_ipvlan trainer-0 net2 "$COMPUTE_RE")
[ "$n1" = "${NET1[trainer-0]}" ] && [ "$n2" = "${NET2[trainer-0]}" ] ||
  fail "trainer-0's new sandbox has net1 $n1 / net2 $n2; the old one had ${NET1[trainer-0]} / ${NET2[trainer-0]}"
for a in "$n1" "$n2"; do
  [ "$(lease_of "$a" | jq -r .spec.containerID)" = "$new_sb" ] || fail "the lease of $a names container $(lease_of "$a" | jq -r .spec.containerID), not the new sandbox $new_sb"
done
ping_from trainer-0 net2 "${NET2[trainer-1]}"
pass "trainer-0's sandbox killed: re-created (${old_sb:0:12} → ${new_sb:0:12}) with the same net1 $n1 and net2 $n2; leases name the new sandbox; net2 pings trainer-1"

# ---- 6. the node-agent pod deleted and replaced -----------------------------------------------
AGENT=$(agent_pod)
leased_before=$(leases_json | jq -c '[.items[] | select(.spec.state == "Leased") | .spec.address] | sort')
t=$(now)
K -n kube-system delete pod "$AGENT" --wait=false >&2
new_agent() { local p; p=$(agent_pod) && [ -n "$p" ] && [ "$p" != "$AGENT" ] && agent_ready; }
wait_for 180 new_agent || fail "the DaemonSet did not replace the deleted agent $AGENT with a Ready one in 180 s"
timing agent-deleted-to-replacement-ready "$(since "$t")"
AGENT=$(agent_pod)
ping_from trainer-0 net2 "${NET2[login]}"
[ "$(leases_json | jq -c '[.items[] | select(.spec.state == "Leased") | .spec.address] | sort')" = "$leased_before" ] ||
  fail "the leases changed across the agent's replacement: $leased_before → $(leases_json | jq -c '[.items[] | select(.spec.state == "Leased") | .spec.address] | sort')"
pass "node-agent deleted: replaced by $AGENT (Ready); running pods untouched, leases unchanged ($leased_before)"

# ---- 7. 8 pods start while the DaemonSet rolls to a new image -----------------------------------
# localhost/tether:0.1.1-e2e (run.sh builds it: the same binaries, each with bytes appended, so the
# agent really replaces both plugins in /opt/cni/bin while the pods' ADDs exec them).
nad scratch enp5s0 10.20.30.100-10.20.30.199/24
# Enough pods that their ADDs span the roll (the old agent stops, the new one installs the plugins:
# 16-19 s; 8 pods take a minute under TCG); 20 took 143-216 s and showed nothing 8 do not.
ROLL_PODS=${TETHER_E2E_ROLL_PODS:-8}
old_sum=$(sha256sum /opt/cni/bin/tether-ipam | cut -c1-12)
t=$(now)
K apply -f - >&2 <<EOF || fail "creating Deployment burst"
apiVersion: apps/v1
kind: Deployment
metadata: {name: burst, namespace: default}
spec:
  replicas: $ROLL_PODS
  selector: {matchLabels: {app: burst}}
  template:
    metadata:
      labels: {app: burst}
      annotations:
        k8s.v1.cni.cncf.io/networks: '[{"name": "scratch", "interface": "net1"}, {"name": "compute", "interface": "net2"}]'
    spec:
      terminationGracePeriodSeconds: 1
      containers:
      - name: main
        image: localhost/kubelet-lab/busybox:1.35
        imagePullPolicy: Never
        command: ["/bin/sh", "-c", "exec sleep 3600"]
EOF
K -n kube-system set image daemonset/tether agent=localhost/tether:0.1.1-e2e >&2 || fail "kubectl set image daemonset/tether"
burst_json() { GET /api/v1/namespaces/default/pods --data-urlencode labelSelector=app=burst; }
burst_pods() { burst_json | jq -r '.items[].metadata.name'; }
burst_running() {
  [ "$(burst_json | jq '[.items[] | select(.status.phase == "Running")] | length')" = "$ROLL_PODS" ]
}
rolled() {
  [ "$(K -n kube-system get daemonset tether -o jsonpath='{.status.updatedNumberScheduled}/{.status.numberReady}')" = 1/1 ] &&
    [ "$(agent_image)" = localhost/tether:0.1.1-e2e ]
}
if ! wait_for "${TETHER_E2E_BURST_TIMEOUT:-480}" burst_running; then
  K -n default get pods -l app=burst -o wide >&2 || true
  for p in $(burst_pods); do running "$p" || pod_events default "$p" >&2; done
  fail "not all $ROLL_PODS burst pods Running in ${TETHER_E2E_BURST_TIMEOUT:-480} s"
fi
timing roll-pods-running-during-rollout "$(since "$t")"
wait_for 120 rolled || fail "the DaemonSet did not finish rolling to localhost/tether:0.1.1-e2e"
new_sum=$(sha256sum /opt/cni/bin/tether-ipam | cut -c1-12)
[ "$new_sum" != "$old_sum" ] || fail "/opt/cni/bin/tether-ipam is still the old one ($old_sum) after the roll"
# No sandbox may fail on the way because of tether. Seen on the first runs: the plugin's kubeconfig
# held the agent pod's token, refused by the API server once that pod was gone, so 30 ADDs failed
# with 401 until the new agent had written its own; it now holds a token bound to the node
# (plugin_token.rs). A failure of a delegate reads "error adding container to network"; Multus'
# own (its pod GET through this node's kubectl proxy, slow under TCG) are counted apart.
# One read of the namespace's sandbox failures, not one kubectl per pod (each ~1.5 s under TCG).
msgs=$(GET /api/v1/namespaces/default/events --data-urlencode fieldSelector=reason=FailedCreatePodSandBox |
  jq -r '.items[] | select(.involvedObject.name | startswith("burst-")) | "\(.count // 1) \(.message)"')
ours=$(grep 'error adding container to network' <<<"$msgs" || true)
[ -z "$ours" ] || { sed 's/.*error adding container to network //' <<<"$ours" | sort | uniq -c >&2; fail "burst sandboxes failed in tether during the roll: $(wc -l <<<"$ours")"; }
multus_failed=$(awk '{n += $1} END {print n + 0}' <<<"$msgs")
timing burst-sandboxes-failed-in-multus "$multus_failed"
BURST=$(leases_json | jq -c '[.items[] | select(.spec.state == "Leased" and (.spec.pod.name | startswith("burst-")))]')
[ "$(jq length <<<"$BURST")" = $((2 * ROLL_PODS)) ] || fail "the $ROLL_PODS burst pods hold $(jq length <<<"$BURST") leases, not $((2 * ROLL_PODS))"
[ "$(jq '[.[] | .spec.pod.name + "/" + .spec.ifname] | unique | length' <<<"$BURST")" = $((2 * ROLL_PODS)) ] || fail "a burst pod holds two leases for one interface: $BURST"
dups=$(leases_json | jq -r '[.items[] | select(.spec.state == "Leased") | .spec.address] | group_by(.) | map(select(length > 1) | .[0]) | join(" ")')
[ -z "$dups" ] || fail "addresses leased twice: $dups"
pass "$ROLL_PODS pods × 2 tether networks Running $(since "$t") s after creation while the DaemonSet rolled to localhost/tether:0.1.1-e2e (tether-ipam $old_sum → $new_sum on the node): no sandbox failed in tether ($multus_failed in Multus' own pod GET, retried), $((2 * ROLL_PODS)) leases, no address twice"
t=$(now)
K -n default delete deployment burst >&2
burst_released() {
  [ "$(leases_json | jq '[.items[] | select(.spec.state == "Leased" and (.spec.pod.name | startswith("burst-")))] | length')" = 0 ] &&
    [ -z "$(burst_pods)" ]
}
wait_for 300 burst_released || fail "burst pods deleted: still Leased after 300 s: $(leases_json | jq -c '[.items[] | select(.spec.state == "Leased" and (.spec.pod.name | startswith("burst-"))) | .spec.address]')"
timing roll-pods-deleted-to-leases-released "$(since "$t")"
pass "the $ROLL_PODS deleted: all $((2 * ROLL_PODS)) leases Released, no pod left"

# ---- docs/operations.md's CLI examples, as written, as root on the node ------------------------
cp "$E2E_ROOT/target/image/tether" /run/e2e/bin/tether
OUT=$(KUBECONFIG=$E2E_DIR/cp/guest-admin.kubeconfig bash -euo pipefail -c "$(cd "$E2E_ROOT" && python3 conformance/docs/blocks.py extract docs/operations.md cli-examples)" 2>&1) ||
  { echo "$OUT" >&2; fail "docs/operations.md cli-examples failed as written"; }
for want in "^mgmt-fixed  *10.20.30.240/24  *default/login  *net1  *e2e-node  *Leased" "kind: LeaseList" "name: trainer-0" \
  "^mgmt-pool .*10.20.30.241-10.20.30.250" "e2e-node"; do
  grep -q -- "$want" <<<"$OUT" || { echo "$OUT" >&2; fail "docs/operations.md cli-examples: nothing matches '$want'"; }
done
released=$(grep -c '^released .*(was Released' <<<"$OUT" || true)
[ "$released" -ge $((2 * ROLL_PODS)) ] || { echo "$OUT" >&2; fail "docs/operations.md cli-examples released $released cooling leases, not the $((2 * ROLL_PODS)) of the burst"; }
pass "docs/operations.md CLI examples as written, as root on the node: leases of this node, a pod's as YAML, the pools, by node; $released cooldowns ended"
