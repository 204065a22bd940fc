#!/usr/bin/env bash
# The first e2e step, in the lab VM once the node is Ready (node.sh runs it before the checks or
# the benchmark): tether installed as the README says. deploy/tether.yaml applied unchanged
# (kubectl apply -f); the node-agent pod (DaemonSet, image tether:0.2.0 imported from
# target/tether-image.tar) becomes Ready, installs tether-ipvlan + tether-ipam into /opt/cni/bin
# and writes /etc/cni/net.d/tether.d/tether.kubeconfig (0600).
set -euo pipefail
. "$(dirname "${BASH_SOURCE[0]}")/checks.sh"
: >"$RES"

# ---- tether installed as the README says ---------------------------------------------------
t=$(now)
K apply -f "$E2E_ROOT/deploy/tether.yaml" >&2 || fail "kubectl apply -f deploy/tether.yaml"
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
