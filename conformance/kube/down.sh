#!/usr/bin/env bash
# Stop the API server that conformance/kube/up.sh started: exactly the etcd and kube-apiserver
# whose pids are in its directory (default $ROOT/target/peers-k8s, TETHER_KUBE_DIR), then remove
# that directory. Their logs are kept first in target/conformance/kube-{apiserver,etcd}.log
# (not with --quiet). Safe to run when nothing is running.
set -u

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
ROOT=$(cd "$HERE/../.." && pwd)
PEERS=${TETHER_PEERS:-$ROOT/../shared/peers}
DIR=${TETHER_KUBE_DIR:-$ROOT/target/peers-k8s}

[ -e "$DIR" ] || exit 0
if [ "${1:-}" != --quiet ]; then
  mkdir -p "$ROOT/target/conformance"
  [ -f "$DIR/apiserver.log" ] && cp "$DIR/apiserver.log" "$ROOT/target/conformance/kube-apiserver.log"
  [ -f "$DIR/etcd.log" ] && cp "$DIR/etcd.log" "$ROOT/target/conformance/kube-etcd.log"
fi

if [ -x "$PEERS/k8s-down.sh" ]; then
  PEERS_DIR=$DIR "$PEERS/k8s-down.sh"
  exit 0
fi

# The peers are gone since up.sh ran: the same steps as their k8s-down.sh.
ours() { [ -d "/proc/$1" ] && tr '\0' ' ' < "/proc/$1/cmdline" 2>/dev/null | awk '{print $1}' | grep -q "$2"; }
for n in kube-apiserver etcd; do
  [ -s "$DIR/$n.pid" ] || continue
  pid=$(cat "$DIR/$n.pid")
  ours "$pid" "$n" || continue
  kill -TERM "$pid" 2>/dev/null || true
  for _ in $(seq 1 30); do ours "$pid" "$n" || break; sleep 0.5; done
  if ours "$pid" "$n"; then kill -KILL "$pid" 2>/dev/null || true; fi
  echo "kube/down: stopped $n (pid $pid)" >&2
done
rm -rf "$DIR"
