#!/usr/bin/env bash
# The e2e checks, thick Multus (after test-events.sh, before test-node-gone.sh, in the lab VM): the
# node's CNI switched from Multus' thin plugin to its thick one, as RKE2 can run it — multus-daemon
# in a DaemonSet pod (multus-thick.yaml: chrootDir /hostroot, 00-multus.conf generated from the
# node's cluster network), multus-shim on the node — and tether attaches through it unchanged.
#
#   1. The thin 00-multus.conf replaced by the cluster network alone (10-cluster.conf, the same
#      bridge + host-local) and the DaemonSet applied: the daemon Ready, its init container put
#      multus-shim into /opt/cni/bin, the daemon wrote a 00-multus.conf of type multus-shim.
#   2. Two pods on mgmt-pool (net1) + compute (net2) through the shim: Running, l2 ipvlan links
#      with pool addresses, ping the gateway over net1 and each other over net2; their leases carry
#      this node (the delegates ran in the daemon's pod, chrooted into the node's /); network-status
#      lists both networks; the daemon's log names each pod.
#   3. The pods deleted: the kubelet's DELs through shim and daemon release all four leases (timed).
# The node stays on thick Multus for test-node-gone.sh.
set -euo pipefail
. "$(dirname "${BASH_SOURCE[0]}")/checks.sh"

# ---- 1. thick Multus installed -----------------------------------------------------------------
t=$(now)
# The cluster network as a single-plugin .conf (see conformance/multus/up.sh: a .conflist as the
# thick daemon's cluster network loses its IPAM in Multus' cache, and the DEL of eth0 fails).
jq '.delegates[0].plugins[0] + {cniVersion: "0.3.1", name: "cluster"}' /etc/cni/net.d/00-multus.conf >/etc/cni/net.d/10-cluster.conf ||
  fail "cannot derive 10-cluster.conf from the thin 00-multus.conf"
rm -f /etc/cni/net.d/00-multus.conf /etc/cni/net.d/multus.d/multus.kubeconfig
# On node A only: node B, which joins later (test-two-nodes.sh), keeps thin Multus.
sed "s|^      hostNetwork: true|      nodeSelector: {kubernetes.io/hostname: $E2E_NODE}\n      hostNetwork: true|" "$E2E_HERE/multus-thick.yaml" |
  K apply -f - >&2 || fail "kubectl apply -f multus-thick.yaml"
multus_pod() { K -n kube-system get pods -l app=multus -o jsonpath='{.items[0].metadata.name}'; }
multus_ready() {
  [ "$(K -n kube-system get pods -l app=multus -o jsonpath='{.items[0].status.conditions[?(@.type=="Ready")].status}')" = True ]
}
shim_conf() { [ "$(jq -r .type /etc/cni/net.d/00-multus.conf 2>/dev/null)" = multus-shim ]; }
if ! wait_for 180 multus_ready || ! wait_for 60 shim_conf; then
  p=$(multus_pod || true)
  [ -z "$p" ] || { pod_events kube-system "$p" >&2; cat /var/log/pods/kube-system_"$p"_*/*/*.log >&2 2>/dev/null | tail -40; }
  fail "thick Multus: daemon pod Ready $(multus_ready && echo yes || echo no), 00-multus.conf: $(head -c 300 /etc/cni/net.d/00-multus.conf 2>&1)"
fi
[ -x /opt/cni/bin/multus-shim ] || fail "the daemon's init container did not install /opt/cni/bin/multus-shim"
timing thick-multus-apply-to-ready "$(since "$t")"
pass "thick Multus: $(multus_pod) Ready, multus-shim in /opt/cni/bin, 00-multus.conf of type multus-shim (cluster network $(jq -r '.delegates[0].name // .clusterNetwork // "?"' /etc/cni/net.d/00-multus.conf))"

# ---- 2. two pods through the shim ----------------------------------------------------------------
seed_nads # applied by test.sh already; again so that this check also runs alone
t=$(now)
for p in thick-0 thick-1; do
  busybox_pod $p '[{"name": "mgmt-pool", "interface": "net1"}, {"name": "compute", "interface": "net2"}]'
done
wait_running 240 thick-0 thick-1
timing thick-create-to-2-pods-running "$(since "$t")"
declare -A NET1 NET2
for p in thick-0 thick-1; do
  NET1[$p]=$(assert_ipvlan $p net1 "$POOL_RE"); NET2[$p]=$(assert_ipvlan $p net2 "$COMPUTE_RE")
  eth0=$(addr_of $p eth0)
  [[ "$eth0" == 10.244.0.* ]] || fail "eth0 of $p has '$eth0', not an address of the cluster network"
  assert_leased "${NET1[$p]}" $p net1; assert_leased "${NET2[$p]}" $p net2
  status=$(K -n default get pod $p -o jsonpath='{.metadata.annotations.k8s\.v1\.cni\.cncf\.io/network-status}')
  for pair in "default/mgmt-pool ${NET1[$p]} net1" "default/compute ${NET2[$p]} net2"; do
    set -- $pair
    jq -e --arg n "$1" --arg a "$2" --arg i "$3" '.[] | select(.name == $n and .interface == $i) | .ips | index($a)' <<<"$status" >/dev/null ||
      fail "thick Multus' network-status of $p does not list $2 on $3 for $1: $status"
  done
  grep -q "$p" /var/log/pods/kube-system_"$(multus_pod)"_*/kube-multus/*.log 2>/dev/null ||
    fail "the daemon's log does not mention $p: it was not attached through the daemon"
done
ping_from thick-0 net1 10.20.30.1
ping_from thick-0 net2 "${NET2[thick-1]}"
ping_from thick-1 net2 192.168.100.1
pass "thick-0, thick-1 Running through multus-shim → multus-daemon: net1 ${NET1[*]}, net2 ${NET2[*]} (l2 ipvlan); ping the gateway over net1 and each other over net2; Leased on $E2E_NODE; network-status lists both"

# ---- 3. deleted: DEL through the daemon releases ---------------------------------------------------
t=$(now)
K -n default delete pod thick-0 thick-1 --wait=false >&2
all_released() { local a; for a in "${NET1[@]}" "${NET2[@]}"; do released "$a" || return 1; done; }
wait_for 120 all_released || fail "thick-0/1 deleted: leases not all Released after 120 s: $(for a in "${NET1[@]}" "${NET2[@]}"; do printf '%s=%s ' "$a" "$(lease_state "$a")"; done)"
timing thick-delete-to-leases-released "$(since "$t")"
wait_for 60 gone thick-0 || fail "thick-0 still in the API 60 s after its leases were released"
wait_for 60 gone thick-1 || fail "thick-1 still in the API 60 s after its leases were released"
pass "thick-0, thick-1 deleted: the DELs through multus-daemon released all four leases"
