#!/usr/bin/env bash
# The e2e checks of the release (after test-thick.sh, before test-node-gone.sh, in the lab VM):
# an upgrade from the previous release with pods running and starting, the uninstall as
# docs/upgrade.md says it, and the chart's install, upgrade and uninstall with the real helm.
#
#   1. The previous release (0.1.0: its image and its tether.yaml, conformance/upgrade/
#      previous-release.sh) applied: its agent Ready, its plugins on the node; three pods on
#      mgmt-pool + compute Running on it.
#   2. docs/upgrade.md `upgrade` as written, with the release's tether-<v>.yaml, while four more
#      pods start: all Running, the old pods' addresses and leases unchanged, no address Leased
#      twice, the node's plugins say this version, doctor in the agent finds them of its version.
#   3. The CRD guard: with those pods' addresses Leased, deleting the IPLease CRD is refused and
#      nothing is lost. The pods deleted: every lease of either version Released by the new plugins.
#   4. docs/upgrade.md `uninstall-check`, `uninstall` and `node-cleanup` as written: nothing of
#      tether left (plugins, kubeconfig, state, socket, CRD, leases, agent), and the token the node
#      kept is refused by the API server.
#   5. The release's chart: helm install (the CRD from crds/), a pod Running, helm upgrade with a
#      changed value (the DaemonSet rolls; the pod keeps its address), helm uninstall (the CRD and
#      the pod's lease kept). tether-<v>.yaml applied again for test-node-gone.sh.
set -euo pipefail
. "$(dirname "${BASH_SOURCE[0]}")/checks.sh"
export KUBECONFIG=$E2E_DIR/cp/guest-admin.kubeconfig
VERSION=$(sed -n 's/^version = "\(.*\)"/\1/p' "$E2E_ROOT/Cargo.toml" | head -1)
REL=$E2E_ROOT/target/release-artifacts
PREV=$E2E_DIR/previous
[ -s "$REL/tether-$VERSION.yaml" ] && [ -s "$REL/tether-$VERSION.tgz" ] || fail "no release artifacts in $REL (make release)"
[ -s "$PREV/tether.yaml" ] || fail "no previous release in $PREV (run.sh: conformance/upgrade/previous-release.sh)"
# The CLI as a user has it: from the release's tarball, also as `kubectl tether`.
tar -xzf "$REL/tether-$VERSION-linux-amd64.tar.gz" -C /run/e2e || fail "cannot unpack the release's amd64 tarball"
export PATH=/run/e2e/tether-$VERSION-linux-amd64:$PATH
cd "$E2E_ROOT"
run_block() { # FILE NAME, run as written in DIR ($BLOCK_DIR), its output in OUT
  OUT=$(cd "${BLOCK_DIR:-$E2E_ROOT}" && bash -euo pipefail -c "$(python3 "$E2E_ROOT/conformance/docs/blocks.py" extract "$E2E_ROOT/$1" "$2")" 2>&1) && return 0
  echo "$OUT" >&2
  fail "$1 $2 failed as written"
}
NETS='[{"name": "mgmt-pool", "interface": "net1"}, {"name": "compute", "interface": "net2"}]'
agent_on() { [ "$(agent_image)" = "$1" ] && agent_ready; }
leased_twice() { leases_json | jq -r '[.items[] | select(.spec.state == "Leased") | .spec.address] | group_by(.) | map(select(length > 1) | .[0]) | join(" ")'; }
seed_nads
# What earlier checks left on tether's networks goes first: these checks count every lease.
K -n default delete statefulset,deployment --all --wait=false >&2 || true
mapfile -t left < <(K -n default get pods -o jsonpath='{range .items[*]}{.metadata.name}{"\n"}{end}')
((${#left[@]} == 0)) || delete_pods 180 "${left[@]}"

# ---- 1. the previous release ------------------------------------------------------------------
t=$(now)
K apply -f "$PREV/tether.yaml" >&2 || fail "kubectl apply -f (previous release's) tether.yaml"
wait_for 240 agent_on tether:0.1.0 || fail "the previous release's agent (tether:0.1.0) did not become Ready: image $(agent_image)"
prev_sum=$(cat "$PREV/tether-ipam.sha256")
on_prev() { [ "$(sha256sum /opt/cni/bin/tether-ipam | cut -d' ' -f1)" = "$prev_sum" ]; }
wait_for 60 on_prev || fail "the previous release's agent did not install its tether-ipam"
for i in 0 1 2; do busybox_pod "up-old-$i" "$NETS"; done
wait_running 240 up-old-0 up-old-1 up-old-2
declare -A before
for i in 0 1 2; do
  p=up-old-$i
  before[$p]="$(addr_of "$p" net1) $(addr_of "$p" net2)"
  for a in ${before[$p]}; do assert_leased "$a" "$p" "$( [[ $a == 10.20.30.* ]] && echo net1 || echo net2)"; done
done
pass "previous release 0.1.0 installed from its tether.yaml: agent Ready, its plugins on the node; 3 pods Running on it: ${before[*]}"

# ---- 2. upgraded as docs/upgrade.md says, while pods start ------------------------------------
t=$(now)
for i in 0 1 2 3; do busybox_pod "up-new-$i" "$NETS"; done
BLOCK_DIR=$REL run_block docs/upgrade.md upgrade
agent_on "tether:$VERSION" || fail "after the upgrade's rollout status the agent is $(agent_image), not Ready on tether:$VERSION"
wait_running 300 up-new-0 up-new-1 up-new-2 up-new-3
timing upgrade-with-4-pods-starting "$(since "$t")"
for i in 0 1 2; do
  p=up-old-$i
  now_addrs="$(addr_of "$p" net1) $(addr_of "$p" net2)"
  [ "$now_addrs" = "${before[$p]}" ] || fail "$p had ${before[$p]} before the upgrade, now $now_addrs"
  for a in $now_addrs; do assert_leased "$a" "$p" "$( [[ $a == 10.20.30.* ]] && echo net1 || echo net2)"; done
done
twice=$(leased_twice)
[ -z "$twice" ] || fail "Leased twice after the upgrade: $twice"
n=$(leases_json | jq '[.items[] | select(.spec.state == "Leased")] | length')
[ "$n" = 14 ] || fail "$n addresses Leased after the upgrade, expected 14 (7 pods × 2)"
ver=$(/opt/cni/bin/tether-ipam --version) && [[ $ver == "tether-ipam $VERSION "* ]] || fail "the node's tether-ipam says '$ver', not $VERSION"
agent_ctr=$(CTR containers ls -q "labels.\"io.kubernetes.pod.name\"==$(agent_pod),labels.\"io.kubernetes.container.name\"==agent")
doctor=$(CTR tasks exec --exec-id "doctor-$RANDOM" "$agent_ctr" tether doctor 2>&1) ||
  { echo "$doctor" >&2; fail "tether doctor in the upgraded agent failed"; }
for b in tether-ipvlan tether-ipam; do
  grep -q "^OK *plugins *$b in /opt/cni/bin is $VERSION " <<<"$doctor" ||
    { echo "$doctor" >&2; fail "doctor in the agent did not find $b of its own build ($VERSION)"; }
done
failed=0
for i in 0 1 2 3; do failed=$((failed + $(event_count "up-new-$i" FailedCreatePodSandBox))); done
pass "docs/upgrade.md upgrade as written, 0.1.0 → $VERSION, 4 pods starting: all Running $(since "$t") s on ($failed sandbox failures, each retried to success), the 3 old pods kept ${before[*]}, 14 leases, none twice; plugins $VERSION, doctor agrees"

# ---- 3. the CRD guard, with these pods' addresses Leased; then the pods deleted ----------------
a=$(addr_of up-old-0 net1)
if out=$(K delete crd "$LEASES" 2>&1); then fail "the IPLease CRD was deleted while $a was Leased: $out"; fi
grep -q 'tether-iplease-crd-guard' <<<"$out" || fail "deleting the CRD failed, but not by the guard: $out"
assert_leased "$a" up-old-0 net1
pass "deleting the IPLease CRD while $a is Leased: refused by tether-iplease-crd-guard, the lease kept"
mapfile -t all < <(printf 'up-old-%s\n' 0 1 2; printf 'up-new-%s\n' 0 1 2 3)
addrs=$(leases_json | jq -r '.items[] | select(.spec.state == "Leased") | .spec.address')
delete_pods 180 "${all[@]}"
all_released() { local a; for a in $addrs; do released "$a" || return 1; done; }
wait_for 60 all_released || fail "not every lease Released after deleting the pods: $(leases_json | jq -c '[.items[] | select(.spec.state == "Leased") | .spec.address]')"
pass "the 7 pods deleted: all 14 leases (3 pods' written by 0.1.0) Released by the $VERSION plugins"

# ---- 4. uninstalled as docs/upgrade.md says ---------------------------------------------------
K delete -f "$E2E_ROOT/deploy/examples/" --wait=true >&2 || fail "deleting the example NADs"
run_block docs/upgrade.md uninstall-check
grep -q 'no leases match' <<<"$OUT" || { echo "$OUT" >&2; fail "uninstall-check listed Leased addresses"; }
token=$(sed -n 's/^ *token: *//p' /etc/cni/net.d/tether.d/tether.kubeconfig)
[ -n "$token" ] || fail "no token in the node's tether.kubeconfig before the uninstall"
BLOCK_DIR=$REL run_block docs/upgrade.md uninstall
run_block docs/upgrade.md node-cleanup
left=()
for f in /opt/cni/bin/tether-ipvlan /opt/cni/bin/tether-ipam /etc/cni/net.d/tether.d /var/lib/cni/tether /run/tether; do
  [ ! -e "$f" ] || left+=("$f")
done
((${#left[@]} == 0)) || fail "left on the node after the uninstall: ${left[*]}"
! K get crd "$LEASES" >/dev/null 2>&1 || fail "the IPLease CRD is still there"
no_agent() { [ "$(agents_json | jq '.items | length')" = 0 ]; }
wait_for 120 no_agent || fail "tether pods left: $(K -n kube-system get pods -l app.kubernetes.io/name=tether -o name)"
refused() { [ "$(curl -sk -o /dev/null -w '%{http_code}' -H "Authorization: Bearer $token" https://10.96.0.1/api)" = 401 ]; }
wait_for 30 refused || fail "the token the node kept still authenticates after the uninstall"
pass "docs/upgrade.md uninstall as written: no plugin, kubeconfig, state or socket left on the node, no CRD, no agent; the node's old token is refused (401)"
# test-node-gone.sh holds the agents' count of CNI calls (kept on the node under /run/tether,
# across agents) against the kernel's count of plugin execs: the uninstall removed the one, so the
# other starts again here too. No plugin runs from here on but for CNI calls.
exec_trace_start || fail "cannot restart the exec trace"

# ---- 5. the chart: install, upgrade, uninstall --------------------------------------------------
t=$(now)
helm install tether "$REL/tether-$VERSION.tgz" --namespace kube-system >&2 || fail "helm install $REL/tether-$VERSION.tgz"
wait_for 240 agent_on "tether:$VERSION" || fail "helm install: the agent did not become Ready"
seed_nads
busybox_pod charted '[{"name": "mgmt-pool", "interface": "net1"}]'
wait_running 120 charted
a=$(addr_of charted net1)
assert_leased "$a" charted net1
old_agent=$(agent_pod)
helm upgrade tether "$REL/tether-$VERSION.tgz" --namespace kube-system --set agent.resources.requests.cpu=20m >&2 ||
  fail "helm upgrade"
K -n kube-system rollout status daemonset/tether --timeout=5m >&2 || fail "helm upgrade: the DaemonSet did not roll"
[ "$(agent_pod)" != "$old_agent" ] && agent_ready || fail "helm upgrade: the agent was not replaced, or is not Ready"
[ "$(K -n kube-system get ds tether -o jsonpath='{.spec.template.spec.containers[0].resources.requests.cpu}')" = 20m ] ||
  fail "helm upgrade: the value did not reach the DaemonSet"
[ "$(addr_of charted net1)" = "$a" ] && assert_leased "$a" charted net1
helm uninstall tether --namespace kube-system >&2 || fail "helm uninstall"
wait_for 120 no_agent || fail "helm uninstall: tether pods left"
K get crd "$LEASES" >/dev/null || fail "helm uninstall deleted the IPLease CRD"
assert_leased "$a" charted net1
pass "the release's chart: helm install (agent Ready, charted Running on $a), helm upgrade (the DaemonSet rolled, the pod kept $a), helm uninstall (objects gone, the CRD and $a's lease kept) in $(since "$t") s"

# Back to the one-file install for test-node-gone.sh; the pod's lease is honoured by it.
K apply -f "$REL/tether-$VERSION.yaml" >&2 || fail "kubectl apply -f tether-$VERSION.yaml"
wait_for 240 agent_on "tether:$VERSION" || fail "tether-$VERSION.yaml again: the agent did not become Ready"
delete_pods 120 charted
wait_for 60 released "$a" || fail "$a not Released after charted was deleted"
pass "tether-$VERSION.yaml applied again: agent Ready; charted deleted, $a Released"
