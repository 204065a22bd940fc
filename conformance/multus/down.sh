#!/usr/bin/env bash
# Stop the node conformance/multus/up.sh built: its watchdog, a Multus daemon a test left running,
# kubectl proxy, etcd and kube-apiserver (exactly the pids in their pid files), both network
# namespaces; then remove its directory (default /tmp/tether-multus; TETHER_MULTUS_DIR). The logs
# stay in <repo>/target/lab/multus-logs/ (see up.sh). Safe to run when nothing is running.
#   --quiet   say nothing about what was stopped
set -u
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
. "$HERE/node.sh"
export PATH="$PATH:/usr/sbin:/sbin"
say() { [ "${1:-}" = --quiet ] || echo "multus/down: $*" >&2; }
Q=${1:-}

. "$HERE/pids.sh"

if pid=$(ours "$DIR/watchdog.pid" watchdog); then stop "$pid"; fi
for f in "$DIR"/*.daemon.pid; do
  [ -e "$f" ] || continue
  if pid=$(ours "$f" multus-daemon); then stop "$pid"; say "stopped multus-daemon (pid $pid)" "$Q"; fi
done

if pid=$(ours "$DIR/kubectl-proxy.pid" kubectl); then stop "$pid"; fi

if [ -d "$DIR/k8s" ]; then
  if [ -x "$PEERS/k8s-down.sh" ]; then
    PEERS_DIR="$DIR/k8s" "$PEERS/k8s-down.sh" 2>/dev/null
  else
    for n in kube-apiserver etcd; do
      if pid=$(ours "$DIR/k8s/$n.pid" "$n"); then stop "$pid"; fi
    done
  fi
  say "stopped the API server" "$Q"
fi
for ns in "$NODE_NS" "$SWITCH_NS"; do
  [ -e "/run/netns/$ns" ] && ip netns del "$ns"
done
rm -rf "$DIR"
exit 0
