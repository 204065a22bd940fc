#!/usr/bin/env bash
# Start the real Kubernetes API server (etcd + kube-apiserver v1.36 from ../shared/peers) for a
# test run, install the IPLease CRD, and print the kubeconfig's path (the only line on stdout).
#
#   kc=$(conformance/kube/up.sh) && export TETHER_TEST_KUBECONFIG=$kc
#   conformance/kube/down.sh
#
# It runs in its own directory and on its own ports, never a developer's server on the peers'
# defaults (/tmp/peers-k8s, 16443). Idempotent: a server of ours already running there is reused
# (the CRD is applied again); leftovers of a run that was killed are stopped and removed first.
#
# Exit status: 0 ready; 3 the peers directory is absent (a NOT RUN banner is printed on stderr:
# the real-server tests cannot run, which is not a failure of this script); 1 anything else.
# `up.sh --check`: exit 0 when a server of ours is already running and ready, 1 otherwise.
#
# Knobs: TETHER_PEERS (default $ROOT/../shared/peers), TETHER_KUBE_DIR ($ROOT/target/peers-k8s),
# TETHER_KUBE_API_PORT (26443), TETHER_KUBE_ETCD_PORT (33790), TETHER_KUBE_ETCD_PEER_PORT (33800).
set -euo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
ROOT=$(cd "$HERE/../.." && pwd)
PEERS=${TETHER_PEERS:-$ROOT/../shared/peers}
NOT_RUN=3
KUBECTL=${KUBECTL:-${PEERS_BIN_DIR:-/var/cache/tether-peers/bin}/kubectl}
CRD=$ROOT/deploy/crds/ipleases.yaml
CRD_NAME=ipleases.ipam.tether.dev

log() { echo "kube/up: $*" >&2; }

# Our own instance: never the peers' defaults (and never a PEERS_* of the caller's shell).
export PEERS_DIR=${TETHER_KUBE_DIR:-$ROOT/target/peers-k8s}
export PEERS_API_PORT=${TETHER_KUBE_API_PORT:-26443}
export PEERS_ETCD_PORT=${TETHER_KUBE_ETCD_PORT:-33790}
export PEERS_ETCD_PEER_PORT=${TETHER_KUBE_ETCD_PEER_PORT:-33800}
export KUBECTL
KC=$PEERS_DIR/kubeconfig

ready() {
  [ -s "$PEERS_DIR/pki/ca.crt" ] && [ -s "$KC" ] &&
    [ "$(curl -sS --max-time 3 --cacert "$PEERS_DIR/pki/ca.crt" -H "Authorization: Bearer peers-admin-token" \
           "https://127.0.0.1:$PEERS_API_PORT/readyz" 2>/dev/null)" = ok ]
}

# --check: is a server of ours running and ready there? (exit 0/1, prints nothing)
if [ "${1:-}" = --check ]; then ready; exit; fi

if [ ! -x "$PEERS/k8s-up.sh" ]; then
  cat >&2 <<EOF

##########################################################################################
##  NOT RUN: real kube-apiserver tests — ../shared/peers is absent
##
##  No $PEERS/k8s-up.sh, so no Kubernetes API server can be started.
##  The tests of the Kubernetes lease store, the engine over it, the reconciler and the
##  CLI against a real API server are NOT RUN (libtest shows them as "ignored").
##  They have NOT passed. To run them, put the peers directory there (or set
##  TETHER_PEERS=/path/to/peers) and run \`make unit\` again.
##########################################################################################

EOF
  exit $NOT_RUN
fi

start=$(date +%s%N)
if [ -e "$PEERS_DIR" ] && ! ready; then
  log "$PEERS_DIR holds a server that is not ready (a killed run?); stopping it first"
  "$HERE/down.sh" --quiet
fi
mkdir -p "$(dirname "$PEERS_DIR")"
# k8s-up.sh logs on stderr only; it reuses a running server of ours. Once in many runs its
# kube-apiserver stayed unready for its whole 90 s with nothing in its log; a second start, after
# down.sh, is cheap next to a test run thrown away.
if ! "$PEERS/k8s-up.sh" >&2; then
  log "the API server did not start (see above); stopping what is left and starting it once more"
  mkdir -p "$ROOT/target/conformance"
  cp "$PEERS_DIR/apiserver.log" "$ROOT/target/conformance/kube-apiserver-failed-start.log" 2>/dev/null || true
  "$HERE/down.sh" --quiet
  "$PEERS/k8s-up.sh" >&2 || { log "FAILED to start the API server (see above)"; exit 1; }
fi

# The CRD, then the rest of deploy/base (service accounts, RBAC, the node-scope policy, the
# controller), exactly as an operator installs them. No controller-manager runs here, so the
# DaemonSet and Deployment stay objects; the node-scope tests (ipam/operator/tests/node_scope.rs) mint
# tokens of their service accounts.
[ -x "$KUBECTL" ] || { log "no kubectl at $KUBECTL: .ci/deps.sh builds it (conformance/peers/build.sh)"; exit 1; }
"$KUBECTL" --kubeconfig "$KC" apply -f "$CRD" >&2
"$KUBECTL" --kubeconfig "$KC" wait --for=condition=Established --timeout=60s "crd/$CRD_NAME" >&2
"$KUBECTL" --kubeconfig "$KC" apply -k "$ROOT/deploy/base" >&2
# Established is not quite served yet: wait until the resource lists.
for _ in $(seq 1 60); do
  if curl -fsS --max-time 3 --cacert "$PEERS_DIR/pki/ca.crt" -H "Authorization: Bearer peers-admin-token" \
       "https://127.0.0.1:$PEERS_API_PORT/apis/ipam.tether.dev/v1alpha1/ipleases?limit=1" >/dev/null 2>&1; then
    break
  fi
  sleep 0.25
done
ms=$(( ($(date +%s%N) - start) / 1000000 ))
log "ready in $((ms / 1000)).$(( (ms % 1000) / 100 )) s: kube-apiserver https://127.0.0.1:$PEERS_API_PORT, etcd :$PEERS_ETCD_PORT, dir $PEERS_DIR"
echo "$KC"
