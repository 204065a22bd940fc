#!/usr/bin/env bash
# The node of the Multus lab tests (conformance/tests/lab_multus.rs): a real control plane and two
# NICs, all inside network namespaces of its own, so nothing leaves loopback or those namespaces.
#
#   dir=$(conformance/multus/up.sh [--owner PID])    # prints the node's directory (only line on stdout)
#   conformance/multus/down.sh
#
#   netns tether-multus-node     the node: etcd + kube-apiserver (../shared/peers; started by
#                                control-plane.sh as k8s-up.sh does, but restarting a kube-apiserver
#                                that dies in its RBAC bootstrap under TCG) on its loopback
#                                (https://127.0.0.1:46443), NICs enp5s0 (management) and enp6s0
#                                (compute); Multus, its daemon and the plugins run here too
#   netns tether-multus-switch   the other end of both cables: host 10.20.30.1/24 on mgmt-port,
#                                host 192.168.100.1/24 on compute-port
#
# In the API server: the NetworkAttachmentDefinition CRD (../shared/peers/nad-crd.yaml), the IPLease
# CRD (deploy/crds/ipleases.yaml), ServiceAccounts kube-system/multus (upstream Multus' ClusterRole)
# and kube-system/tether (deploy/base/rbac.yaml), each with a kubeconfig from a TokenRequest token.
#
# <dir> (default /tmp/tether-multus; TETHER_MULTUS_DIR) holds:
#   bin/                  kube-apiserver, etcd, multus, multus-daemon, multus-shim (see below)
#   k8s/                  control-plane.sh's directory (k8s-up.sh's layout): pki/, kubeconfig, logs
#   admin.kubeconfig      -> k8s/kubeconfig
#   sa/multus/            token, ca.crt, namespace: the thick daemon's in-cluster credentials
#   multus-sa.kubeconfig  kube-system/multus's token: kubectl proxy's credentials
#   tether-peer.kubeconfig  tether's token bound to node gpu-node-2 (a second node of the segment)
#   env                   NODE_NS=, SWITCH_NS=, API_PORT=, ROOT=, ... for the tests
#   root/                 the node's own files, at their usual paths under this prefix (a test
#                         must not touch the real /opt/cni/bin or /etc/cni/net.d of a machine):
#     opt/cni/bin/                 tether-ipvlan, tether-ipam (from $TETHER_BIN_DIR, as the
#                                  node-agent installs them), multus-shim, ptp, host-local, loopback
#     etc/cni/net.d/10-cluster.conf           the cluster network (ptp + host-local): Multus' delegates[0]
#     etc/cni/net.d/multus.d/multus.kubeconfig   the thin plugin's "kubeconfig": kubectl proxy (below)
#     etc/cni/net.d/tether.d/tether.kubeconfig   tether's identity (what the node-agent writes)
#     var/lib/cni/tether/  var/lib/cni/multus/  run/multus/
# The tether binaries are placed again on every call (also when the node is reused).
#
# The lab VM's root filesystem is 9p without a page cache: every exec of a big binary from it
# re-reads the pages it touches over 9p (~20 s for multus, ~8 s for a debug tether-ipam under TCG).
# In the VM the binaries are therefore copied into <dir> (RAM) once; elsewhere they are symlinked.
#
# --owner PID: a watchdog runs down.sh when PID exits (the test process that started the node), so
# the node lives exactly as long as the tests that share it.
#
# TETHER_MULTUS_API_DIR=<dir> (set by run-tests.sh in the lab VM): no control plane in the node;
# the API server is the one host-api.sh runs natively on the host, with the CRDs and identities
# already in it (<dir>/tokens.json, <dir>/k8s/pki/ca.crt). The VM's one NIC (run.sh's
# TETHER_LAB_FORWARD) moves into the node as api0, 10.0.2.15/24, and the node's clients use
# https://10.0.2.100:$API_PORT. Under TCG this saves the 2–3 minutes kube-apiserver took to start.
#
# Exit status: 0 ready; 3 ../shared/peers is absent (NOT RUN banner on stderr); 1 anything else.
# Knobs: TETHER_PEERS (default <repo>/../shared/peers), TETHER_MULTUS_DIR, TETHER_MULTUS_API_PORT
# (46443), TETHER_MULTUS_ETCD_PORT (43790), TETHER_MULTUS_ETCD_PEER_PORT (43800),
# TETHER_MULTUS_PROXY_PORT (46001), TETHER_MULTUS_READY_TIMEOUT (900 s: the API server's first start under qemu TCG takes minutes).
set -euo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
. "$HERE/node.sh"
API_PORT=${TETHER_MULTUS_API_PORT:-46443}
PROXY_PORT=${TETHER_MULTUS_PROXY_PORT:-46001}
TOKEN=peers-admin-token
export PATH="$PATH:/usr/sbin:/sbin"
API_DIR=${TETHER_MULTUS_API_DIR:-}
if [ -n "$API_DIR" ]; then
  API_HOST=10.0.2.100 CA=$API_DIR/k8s/pki/ca.crt
else
  API_HOST=127.0.0.1 CA=$DIR/k8s/pki/ca.crt
fi
BASE=https://$API_HOST:$API_PORT

log() { echo "multus/up: $(date +%T) $*" >&2; }
die() { echo "multus/up: FAILED: $*" >&2; exit 1; }

OWNER=
if [ "${1:-}" = --owner ]; then OWNER=${2:?--owner needs a pid}; shift 2; fi

if [ ! -x "$PEERS/k8s-up.sh" ]; then
  cat >&2 <<EOF

##########################################################################################
##  NOT RUN: Multus end to end (lab_multus) — ../shared/peers is absent
##
##  No $PEERS/k8s-up.sh: neither Multus (thin, thick) nor a kube-apiserver to run it
##  against. The Multus tests have NOT passed. Put the peers directory there (or set
##  TETHER_PEERS=/path/to/peers) and run \`make lab-tests\` again.
##########################################################################################

EOF
  exit 3
fi

api() { # curl against the API server, from inside the node's netns, as the admin
  ip netns exec "$NODE_NS" curl -sS --max-time 60 --cacert "$CA" \
    -H "Authorization: Bearer $TOKEN" "$@"
}
ready() {
  [ -s "$DIR/env" ] && [ -e "/run/netns/$NODE_NS" ] &&
    [ "$(api "$BASE/readyz" 2>/dev/null)" = ok ]
}

# On 9p (the lab VM's root, and the overlays on it) or not.
on_9p() { [ "$(findmnt -n -o FSTYPE /)" = 9p ]; }
place() { # src dst: a copy in RAM when src is on 9p (the lab VM), else a symlink
  if on_9p "$1"; then cp "$1" "$2.tmp" && mv -f "$2.tmp" "$2"; else ln -sfn "$(readlink -f "$1")" "$2"; fi
}
R=$DIR/root
# The node's CNI binaries: tether's (what the node-agent installs), the cluster network's, the shim.
install_bins() {
  local b src
  mkdir -p "$R/opt/cni/bin"
  if [ -n "${TETHER_BIN_DIR:-}" ]; then
    for b in tether-ipvlan tether-ipam; do
      src=$TETHER_BIN_DIR/$b
      [ -x "$src" ] || die "$src missing (cargo build --workspace --bins)"
      # Debug builds are mostly debug info (170 MB): only the code is worth copying into RAM.
      if on_9p "$src"; then
        objcopy --strip-debug "$src" "$R/opt/cni/bin/.$b.tmp" && mv -f "$R/opt/cni/bin/.$b.tmp" "$R/opt/cni/bin/$b"
      else
        ln -sfn "$(readlink -f "$src")" "$R/opt/cni/bin/$b"
      fi
    done
  fi
  for b in ptp host-local loopback; do place "/usr/lib/cni/$b" "$R/opt/cni/bin/$b"; done
  ln -sfn "$DIR/bin/multus-shim" "$R/opt/cni/bin/multus-shim"
}

if ready; then
  install_bins
  log "reusing the node in $DIR"
  echo "$DIR"
  exit 0
fi
if [ -e "$DIR" ] || [ -e "/run/netns/$NODE_NS" ]; then
  log "leftovers of an earlier run in $DIR: stopping them first"
  "$HERE/down.sh" --quiet
fi

t0=$(date +%s)
mkdir -p "$DIR/bin" "$DIR/sa/multus"
# Logs (API server, etcd, kubectl proxy, Multus) go where they survive the lab VM.
LOGS=$ROOT/target/lab/multus-logs
{ rm -rf "$LOGS" && mkdir -p "$LOGS"; } 2>/dev/null || { LOGS=$DIR/logs; mkdir -p "$LOGS"; }
# Whatever fails from here on, nothing of a half-built node stays behind.
ok=0
trap '[ $ok = 1 ] || "$HERE/down.sh" --quiet' EXIT
[ -z "$OWNER" ] || {
  # The watchdog: the node goes when the process that asked for it goes (also mid-start).
  setsid nohup bash -c 'while kill -0 "$1" 2>/dev/null; do sleep 1; done; exec "$2" --quiet' \
    watchdog "$OWNER" "$HERE/down.sh" >/dev/null 2>&1 </dev/null &
  echo $! >"$DIR/watchdog.pid"
}

# ---- binaries ----------------------------------------------------------------------------------
# unpack.sh extracts into target/lab/peers-bin once (a no-op when up to date; run-tests.sh does it
# on the host before booting the VM, where xz is fast).
SRC=$("$PEERS/unpack.sh" "$ROOT/target/lab/peers-bin" 2>&1 | tail -n 1)
[ -x "$SRC/multus" ] || die "unpacking the peers failed: $SRC"
for b in multus multus-daemon multus-shim; do place "$SRC/$b" "$DIR/bin/$b"; done
if [ -z "$API_DIR" ]; then
  place "$SRC/kube-apiserver" "$DIR/bin/kube-apiserver"
  place /usr/bin/etcd "$DIR/bin/etcd"
fi
# kubectl, for `kubectl proxy` (below): the one built with the other peers.
[ -x "$SRC/kubectl" ] || die "no kubectl in $SRC: .ci/deps.sh builds it (conformance/peers/build.sh)"
place "$SRC/kubectl" "$DIR/bin/kubectl"
install_bins
log "binaries ready in $DIR/bin and $R/opt/cni/bin ($(( $(date +%s) - t0 )) s)"

# ---- the node and the switch -------------------------------------------------------------------
ip netns add "$NODE_NS"
ip netns add "$SWITCH_NS"
ip -n "$NODE_NS" link set lo up
ip -n "$SWITCH_NS" link set lo up
cable() { # node-nic switch-port host-address
  ip -n "$NODE_NS" link add "$1" type veth peer name "$2" netns "$SWITCH_NS"
  ip -n "$NODE_NS" link set "$1" up
  ip -n "$SWITCH_NS" link set "$2" up
  ip -n "$SWITCH_NS" addr add "$3" dev "$2"
}
cable enp5s0 mgmt-port 10.20.30.1/24
cable enp6s0 compute-port 192.168.100.1/24

# ---- the control plane: inside the node, or the host's (TETHER_MULTUS_API_DIR) ----------------
t1=$(date +%s)
if [ -z "$API_DIR" ]; then
  # Both run detached (setsid nohup) and keep the node's netns.
  mkdir -p "$DIR/k8s"
  ip netns exec "$NODE_NS" "$HERE/control-plane.sh" "$DIR/k8s" "$API_PORT" \
    "${TETHER_MULTUS_ETCD_PORT:-43790}" "${TETHER_MULTUS_ETCD_PEER_PORT:-43800}" "$DIR/bin" \
    "${TETHER_MULTUS_READY_TIMEOUT:-900}" "$LOGS" || die "the API server did not start (see above)"
  ln -sf k8s/kubeconfig "$DIR/admin.kubeconfig"
  log "kube-apiserver ready on the node's loopback :$API_PORT ($(( $(date +%s) - t1 )) s)"

  # ---- CRDs (NetworkAttachmentDefinition, IPLease), Multus' and tether's identities ------------
  t2=$(date +%s)
  ip netns exec "$NODE_NS" python3 "$HERE/setup-api.py" "$BASE" "$CA" "$TOKEN" \
    "$PEERS/nad-crd.yaml" "$ROOT/deploy/crds/ipleases.yaml" "$ROOT/deploy/base/rbac.yaml" \
    "$ROOT/deploy/base/policy.yaml" "${TETHER_MULTUS_NODE_NAME:-lab-node}" >"$DIR/tokens.json" ||
    die "installing the CRDs and identities failed"
  log "CRDs established, ServiceAccounts multus and tether with their RBAC, the node-scope policy, node ${TETHER_MULTUS_NODE_NAME:-lab-node} ($(( $(date +%s) - t2 )) s)"
else
  [ -s "$API_DIR/tokens.json" ] && [ -s "$CA" ] || die "$API_DIR has no tokens.json or CA (conformance/multus/host-api.sh up)"
  cp "$API_DIR/tokens.json" "$DIR/tokens.json"
  # The VM's only NIC (virtio-net, a module in the lab kernel) is the way to the host's server.
  modprobe virtio_net 2>/dev/null || true
  nic=
  for _ in $(seq 1 100); do
    for d in /sys/class/net/*; do
      if [ "$(basename "$(readlink -f "$d/device/driver" 2>/dev/null)")" = virtio_net ]; then nic=$(basename "$d"); break 2; fi
    done
    sleep 0.1
  done
  [ -n "$nic" ] || die "no virtio NIC to the host's API server: boot the VM with TETHER_LAB_FORWARD=$API_PORT (run-tests.sh does)"
  ip link set "$nic" netns "$NODE_NS"
  ip -n "$NODE_NS" link set "$nic" name api0
  ip -n "$NODE_NS" addr add 10.0.2.15/24 dev api0
  ip -n "$NODE_NS" link set api0 up
  up=0
  for _ in $(seq 1 60); do
    if [ "$(api "$BASE/readyz" 2>/dev/null)" = ok ]; then up=1; break; fi
    sleep 0.5
  done
  [ $up = 1 ] || die "the host's API server is not reachable at $BASE from the node"
  log "using the host's kube-apiserver at $BASE, CRDs and identities in place ($(( $(date +%s) - t1 )) s)"
fi

kubeconfig() { # user token -> kubeconfig on stdout
  cat <<EOF
apiVersion: v1
kind: Config
clusters:
- name: lab
  cluster:
    server: $BASE
    certificate-authority-data: $(base64 -w0 <"$CA")
users:
- name: $1
  user:
    token: $2
contexts:
- name: lab
  context:
    cluster: lab
    user: $1
current-context: lab
EOF
}
mt=$(jq -er .multus "$DIR/tokens.json") && tt=$(jq -er .tether "$DIR/tokens.json") || die "no tokens"
mkdir -p "$R/etc/cni/net.d/multus.d" "$R/etc/cni/net.d/tether.d" "$R/var/lib/cni/tether" \
  "$R/var/lib/cni/multus" "$R/run/multus"
chmod 700 "$R/etc/cni/net.d/tether.d" "$R/var/lib/cni/tether"
kubeconfig multus "$mt" >"$DIR/multus-sa.kubeconfig"
kubeconfig tether "$tt" >"$R/etc/cni/net.d/tether.d/tether.kubeconfig"
# The second node the tests play on the same segment (gpu-node-2): its own node-bound credential.
jq -er '.["tether-peer"]' "$DIR/tokens.json" >/dev/null || die "no tether-peer token in tokens.json"
kubeconfig tether "$(jq -er '.["tether-peer"]' "$DIR/tokens.json")" >"$DIR/tether-peer.kubeconfig"
chmod 600 "$DIR/multus-sa.kubeconfig" "$R/etc/cni/net.d/tether.d/tether.kubeconfig" "$DIR/tether-peer.kubeconfig"
if [ -n "$API_DIR" ]; then
  kubeconfig admin "$TOKEN" >"$DIR/admin.kubeconfig"
  chmod 600 "$DIR/admin.kubeconfig"
fi

# ---- Multus' way to the API server: kubectl proxy ---------------------------------------------
# The thin plugin gives its pod GET 250 ms per attempt (2.5 s in all: pkg/multus shortPollDuration,
# shortPollTimeout), which a fresh process's TLS handshake alone exceeds under TCG. Its kubeconfig
# therefore points at `kubectl proxy` on the node's loopback (plain HTTP), which holds one TLS
# connection to the API server and authenticates as kube-system/multus. Same requests, same RBAC.
ip netns exec "$NODE_NS" setsid nohup "$DIR/bin/kubectl" proxy --kubeconfig "$DIR/multus-sa.kubeconfig" \
  --address 127.0.0.1 --port "$PROXY_PORT" --accept-hosts '^127\.0\.0\.1$' \
  >"$LOGS/kubectl-proxy.log" 2>&1 </dev/null &
echo $! >"$DIR/kubectl-proxy.pid"
for _ in $(seq 1 600); do
  [ "$(ip netns exec "$NODE_NS" curl -s --max-time 10 "http://127.0.0.1:$PROXY_PORT/readyz" 2>/dev/null)" = ok ] && break
  [ -d "/proc/$(cat "$DIR/kubectl-proxy.pid")" ] || die "kubectl proxy exited: $(tail -5 "$LOGS/kubectl-proxy.log")"
  sleep 0.5
done
cat >"$R/etc/cni/net.d/multus.d/multus.kubeconfig" <<EOF
apiVersion: v1
kind: Config
clusters:
- name: lab
  cluster:
    server: http://127.0.0.1:$PROXY_PORT
users:
- name: multus
  user: {}
contexts:
- name: lab
  context:
    cluster: lab
    user: multus
current-context: lab
EOF
chmod 600 "$R/etc/cni/net.d/multus.d/multus.kubeconfig"
# The cluster network: what Multus puts first (delegates[0]) and the pod's eth0.
# A single-plugin .conf: with a .conflist as the thick daemon's cluster network, Multus v4.3.0
# re-serializes it lossily into its cache and the DEL of eth0 fails (host-local: "no IP ranges
# specified"); the thin plugin is not affected. Nothing of tether's is involved.
cat >"$R/etc/cni/net.d/10-cluster.conf" <<EOF
{"cniVersion": "0.3.1", "name": "cluster", "type": "ptp", "ipMasq": false,
 "ipam": {"type": "host-local", "subnet": "10.244.0.0/24", "dataDir": "$DIR/host-local"}}
EOF
# The thick daemon's in-cluster credentials (what kubelet projects into its pod).
printf '%s' "$mt" >"$DIR/sa/multus/token"
cp "$CA" "$DIR/sa/multus/ca.crt"
printf kube-system >"$DIR/sa/multus/namespace"

cat >"$DIR/env" <<EOF
NODE_NS=$NODE_NS
SWITCH_NS=$SWITCH_NS
API_HOST=$API_HOST
API_PORT=$API_PORT
PROXY_PORT=$PROXY_PORT
ROOT=$R
LOGS=$LOGS
MGMT_MASTER=enp5s0
COMPUTE_MASTER=enp6s0
MGMT_HOST=10.20.30.1
COMPUTE_HOST=192.168.100.1
EOF
ok=1
log "node ready in $(( $(date +%s) - t0 )) s: netns $NODE_NS, API $BASE, dir $DIR"
echo "$DIR"
