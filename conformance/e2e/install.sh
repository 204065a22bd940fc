#!/usr/bin/env bash
# The first e2e step, in the lab VM once the node is Ready (node.sh runs it before the checks or
# the benchmark): tether installed on this fresh node from the release's files by the README's
# quick start, word for word (its two blocks, in a copy of target/release-artifacts/: the files
# checked and unpacked, the image imported into containerd, tether-<v>.yaml applied, the example
# NADs, the smoke-test pod Succeeded with PASS, `tether leases`), within five minutes. The
# node-agent pod is Ready, has installed tether-ipvlan + tether-ipam into /opt/cni/bin and
# written /etc/cni/net.d/tether.d/tether.kubeconfig (0600) with a node-bound token.
set -euo pipefail
. "$(dirname "${BASH_SOURCE[0]}")/checks.sh"
: >"$RES"

# ---- tether installed as the README says, from the release's files ---------------------------
t=$(now)
export KUBECONFIG=$E2E_DIR/cp/guest-admin.kubeconfig
QS=/run/e2e/quick-start
rm -rf "$QS" && cp -r "$E2E_ROOT/target/release-artifacts" "$QS" || fail "no target/release-artifacts (make release)"
run_block() { # FILE BLOCK: the block, run as written in $QS (the release's files); its output in OUT
  OUT=$(cd "$QS" && bash -euo pipefail -c "$(python3 "$E2E_ROOT/conformance/docs/blocks.py" extract "$E2E_ROOT/$1" "$2")" 2>&1) && return 0
  echo "$OUT" >&2
  pod_events default tether-smoke-test >&2
  fail "$1 $2 failed as written"
}
run_block README.md quick-start-files
grep -q "tether-.*image.oci.tar: OK" <<<"$OUT" && grep -q 'unpacking docker.io/library/tether:' <<<"$OUT" ||
  { echo "$OUT" >&2; fail "the quick start did not check the files or import the image"; }
run_block README.md quick-start
grep -q '^PASS: 10.20.30.1 answers on net1' <<<"$OUT" || { echo "$OUT" >&2; fail "the quick start's smoke test did not say PASS"; }
grep -q '^NETWORK  *ADDRESS' <<<"$OUT" && grep -q 'mgmt-pool' <<<"$OUT" ||
  { echo "$OUT" >&2; fail "the quick start's tether leases listed no lease of mgmt-pool"; }
qs_s=$(since "$t")
timing readme-quick-start "$qs_s"
# The README promises a working node in minutes: the whole of it, image import included.
awk -v s="$qs_s" 'BEGIN { exit !(s <= 300) }' || fail "the README's quick start took $qs_s s on a fresh node, over five minutes"
pass "README quick start as written on a fresh node from the release's files, in $qs_s s: $(grep -m1 '^PASS' <<<"$OUT"); tether leases lists mgmt-pool"
if ! wait_for "${TETHER_E2E_AGENT_TIMEOUT:-240}" agent_ready; then
  K -n kube-system get pods -o wide >&2 || true
  p=$(agent_pod)
  [ -z "$p" ] || { pod_events kube-system "$p" >&2; cat /var/log/pods/kube-system_"$p"_*/agent/*.log >&2 2>/dev/null || true; }
  fail "the node-agent pod did not become Ready"
fi
timing apply-to-agent-ready "$(since "$t")"
AGENT=$(agent_pod)
wait_for 60 test -x /opt/cni/bin/tether-ipvlan -a -x /opt/cni/bin/tether-ipam \
  -a -s /etc/cni/net.d/tether.d/tether.kubeconfig ||
  fail "the agent $AGENT is Ready but did not install the plugins/kubeconfig: $(ls -la /opt/cni/bin /etc/cni/net.d/tether.d 2>&1 | tr '\n' ' ')"
timing apply-to-plugins-installed "$(since "$t")"
mode=$(stat -c %a /etc/cni/net.d/tether.d/tether.kubeconfig)
[ "$mode" = 600 ] || fail "tether.kubeconfig has mode $mode, not 600"
server=$(sed -n 's/^ *server: *//p' /etc/cni/net.d/tether.d/tether.kubeconfig | head -n 1)
pass "node-agent $AGENT Ready; installed $(cd /opt/cni/bin && ls tether-* | tr '\n' ' ')and tether.kubeconfig (0600, server $server)"

# The plugin's token is bound to the node, not to the agent's pod (it must outlive the pod).
node_bound() { grep -q "carries a token bound to node $E2E_NODE" /var/log/pods/kube-system_"$AGENT"_*/agent/*.log; }
wait_for 30 node_bound || fail "the agent $AGENT did not write a node-bound token: $(cat /var/log/pods/kube-system_"$AGENT"_*/agent/*.log 2>&1 | tail -5)"
pass "the plugin's kubeconfig carries a token bound to node $E2E_NODE"
