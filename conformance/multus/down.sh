#!/usr/bin/env bash
# Stop the node conformance/multus/up.sh built: its watchdog, a Multus daemon a test left running,
# kubectl proxy, etcd and kube-apiserver (exactly the pids in their pid files), both network
# namespaces; then remove its directory (default /tmp/tether-multus; TETHER_MULTUS_DIR). The logs
# stay in <repo>/target/lab/multus-logs/ (see up.sh). Safe to run when nothing is running.
#   --quiet   say nothing about what was stopped
set -u
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
ROOT=$(cd "$HERE/../.." && pwd)
PEERS=${TETHER_PEERS:-$ROOT/../shared/peers}
DIR=${TETHER_MULTUS_DIR:-/tmp/tether-multus}
NODE_NS=tether-multus-node
SWITCH_NS=tether-multus-switch
export PATH="$PATH:/usr/sbin:/sbin"
say() { [ "${1:-}" = --quiet ] || echo "multus/down: $*" >&2; }
Q=${1:-}

# pid-file expected-word: the pid if it is alive and its command line has that word
ours() {
  local pid
  [ -s "$1" ] || return 1
  pid=$(cat "$1")
  [ "$pid" != "$$" ] && [ -d "/proc/$pid" ] && tr '\0' ' ' <"/proc/$pid/cmdline" 2>/dev/null | grep -q -- "$2" && echo "$pid"
}
stop() { # pid
  kill -TERM "$1" 2>/dev/null || return 0
  for _ in $(seq 1 20); do [ -d "/proc/$1" ] || return 0; sleep 0.25; done
  kill -KILL "$1" 2>/dev/null || true
}

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
