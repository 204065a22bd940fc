#!/usr/bin/env bash
# The Multus lab node's API server, run natively on the host for the lab VM (run-tests.sh does
# this when lab_multus runs in the VM). Under qemu TCG the same etcd + kube-apiserver took 2–3
# minutes to start and then competed with the tests for the VM's emulated CPUs; here it is ready
# in seconds. The VM reaches it, and nothing else, through conformance/lab/run.sh's
# TETHER_LAB_FORWARD (10.0.2.100:PORT in the guest is 127.0.0.1:PORT here), and up.sh moves that NIC
# into the node's netns. Still the real kube-apiserver from ../shared/peers, the same flags,
# PKI layout, CRDs and identities as up.sh's own (control-plane.sh, setup-api.py), with the
# serving certificate also valid for 10.0.2.100.
#
#   conformance/multus/host-api.sh up DIR PORT    # DIR: k8s/ (control-plane.sh's), tokens.json, bin/
#   conformance/multus/host-api.sh down DIR       # stops exactly the pids in DIR/k8s/*.pid
#
# Knobs: TETHER_PEERS, TETHER_MULTUS_HOST_ETCD_PORT (46379), TETHER_MULTUS_HOST_ETCD_PEER_PORT (46380).
set -euo pipefail
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
ROOT=$(cd "$HERE/../.." && pwd)
PEERS=${TETHER_PEERS:-$ROOT/../shared/peers}
TOKEN=peers-admin-token
log() { echo "multus/host-api: $(date +%T) $*" >&2; }
die() { echo "multus/host-api: FAILED: $*" >&2; exit 1; }

cmd=${1:?usage: host-api.sh up DIR PORT | down DIR}
DIR=${2:?usage: host-api.sh up DIR PORT | down DIR}

. "$HERE/pids.sh"
stop_servers() {
  local n pid
  for n in kube-apiserver etcd; do
    if pid=$(ours "$DIR/k8s/$n.pid" "$n"); then stop "$pid"; fi
  done
}

case $cmd in
  down)
    stop_servers
    log "stopped"
    ;;
  up)
    PORT=${3:?usage: host-api.sh up DIR PORT}
    [ ! -d "$DIR" ] || stop_servers
    rm -rf "$DIR"
    mkdir -p "$DIR/bin" "$DIR/logs"
    t0=$(date +%s)
    SRC=$("$PEERS/unpack.sh" "$ROOT/target/lab/peers-bin" 2>&1 | tail -n 1)
    [ -x "$SRC/kube-apiserver" ] || die "unpacking the peers failed: $SRC"
    ln -s "$SRC/kube-apiserver" "$DIR/bin/kube-apiserver"
    ln -s "$(command -v etcd || echo /usr/bin/etcd)" "$DIR/bin/etcd"
    TETHER_MULTUS_API_SAN=IP:10.0.2.100 "$HERE/control-plane.sh" "$DIR/k8s" "$PORT" \
      "${TETHER_MULTUS_HOST_ETCD_PORT:-46379}" "${TETHER_MULTUS_HOST_ETCD_PEER_PORT:-46380}" \
      "$DIR/bin" 120 "$DIR/logs" || { stop_servers; die "the API server did not start (see above)"; }
    python3 "$HERE/setup-api.py" "https://127.0.0.1:$PORT" "$DIR/k8s/pki/ca.crt" "$TOKEN" \
      "$PEERS/nad-crd.yaml" "$ROOT/deploy/crds/ipleases.yaml" "$ROOT/deploy/base/rbac.yaml" \
      "$ROOT/deploy/base/policy.yaml" "${TETHER_MULTUS_NODE_NAME:-lab-node}" >"$DIR/tokens.json" || { stop_servers; die "installing the CRDs and identities failed"; }
    log "kube-apiserver on 127.0.0.1:$PORT with the CRDs and identities, ready in $(( $(date +%s) - t0 )) s ($DIR)"
    ;;
  *) die "unknown command $cmd" ;;
esac
