#!/usr/bin/env bash
# Run Multus' thick-plugin daemon (multus-daemon v4.3.0) in the lab node of up.sh the way its
# DaemonSet runs it: in the node's netns (hostNetwork: true), in a mount namespace of its own that
# stands for the pod's filesystem — the node's files are hidden (a tmpfs over <dir>/root, the
# node's prefix, and over /run), and only the DaemonSet's volumes bring parts of them back.
#
#   ip netns exec tether-multus-node unshare --mount --propagation slave \
#     conformance/multus/thick-daemon.sh chroot|mounts      # execs multus-daemon (foreground)
#
# The volumes, as in upstream deployments/multus-daemonset-thick.yml and RKE2's rke2-multus thick
# chart (host path -> path in the pod; <R> = <dir>/root stands for the node's /):
#   <R>/etc/cni/net.d        -> <R>/host/etc/cni/net.d   (cniConfigDir, multusAutoconfigDir)
#   <R>/opt/cni/bin          -> <R>/opt/cni/bin          (binDir: must be the same path in the pod)
#   <R>/run                  -> <R>/host/run             (socketDir <R>/host/run/multus)
#   <R>/var/lib/cni/multus   -> <R>/var/lib/cni/multus   (cniDir)
#   /run/netns               -> /run/netns, HostToContainer (rslave)
#   the service-account token of kube-system/multus at /var/run/secrets/kubernetes.io/serviceaccount
# and per variant:
#   chroot   "chrootDir": "<dir>/pod-chroot/hostroot" with the node's / at that path (hostroot,
#            HostToContainer): the upstream default. Delegates run in the node's filesystem.
#   mounts   no chroot; tether's own files mounted at their node paths:
#              <R>/etc/cni/net.d/tether.d -> <R>/etc/cni/net.d/tether.d   (the kubeconfig)
#              <R>/var/lib/cni/tether     -> <R>/var/lib/cni/tether       (dataDir: journal)
# Env: MULTUS_NODE_NAME (the pod informer's node filter) and NODE_NAME (what tether-ipam records on
# its leases; delegates inherit the daemon's environment), both "lab-node"; KUBERNETES_SERVICE_HOST
# and _PORT for the in-cluster client. Logs go to stderr.
set -euo pipefail
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
VARIANT=${1:?usage: thick-daemon.sh chroot|mounts}
case $VARIANT in chroot|mounts) ;; *) echo "thick-daemon: unknown variant $VARIANT" >&2; exit 2 ;; esac
DIR=${TETHER_MULTUS_DIR:-/tmp/tether-multus}
# shellcheck disable=SC1091
source "$DIR/env"
R=$ROOT
NODE=${TETHER_MULTUS_NODE_NAME:-lab-node}
POD=$DIR/pod-$VARIANT
rm -rf "$POD" && mkdir -p "$POD/stash" "$POD/netns" "$POD/hostroot"
log() { echo "thick-daemon($VARIANT): $*" >&2; }

# The daemon's configuration (its ConfigMap), upstream's keys, paths as seen in the pod.
chroot_key=
[ "$VARIANT" = chroot ] && chroot_key="\"chrootDir\": \"$POD/hostroot\","
cat >"$POD/daemon-config.json" <<EOF
{
  $chroot_key
  "cniVersion": "0.3.1",
  "logLevel": "debug",
  "logToStderr": true,
  "cniConfigDir": "$R/host/etc/cni/net.d",
  "multusAutoconfigDir": "$R/host/etc/cni/net.d",
  "multusConfigFile": "auto",
  "socketDir": "$R/host/run/multus",
  "daemonSocketDir": "$R/run/multus",
  "binDir": "$R/opt/cni/bin",
  "cniDir": "$R/var/lib/cni/multus"
}
EOF

# ---- the pod's filesystem ------------------------------------------------------------------
[ "$(findmnt -n -o PROPAGATION /)" != shared ] || { log "run me under unshare --mount --propagation slave"; exit 2; }
if [ "$VARIANT" = chroot ]; then
  # hostroot: the node's / (before anything is hidden), new mounts below it propagate in.
  mount --rbind / "$POD/hostroot"
fi
mount --rbind "$R" "$POD/stash"              # the node's files, for the volumes below
mount --rbind /run/netns "$POD/netns"
mount -t tmpfs pod-root "$R"                 # the pod sees none of the node's files,
mount -t tmpfs pod-run /run                  # and has a /run of its own
vol() { mkdir -p "$2" && mount --rbind "$1" "$2"; }
vol "$POD/stash/etc/cni/net.d" "$R/host/etc/cni/net.d"
vol "$POD/stash/opt/cni/bin" "$R/opt/cni/bin"
vol "$POD/stash/run" "$R/host/run"
vol "$POD/stash/var/lib/cni/multus" "$R/var/lib/cni/multus"
mkdir -p /run/netns && mount --move "$POD/netns" /run/netns
if [ "$VARIANT" = mounts ]; then
  vol "$POD/stash/etc/cni/net.d/tether.d" "$R/etc/cni/net.d/tether.d"
  vol "$POD/stash/var/lib/cni/tether" "$R/var/lib/cni/tether"
fi
vol "$DIR/sa/multus" /run/secrets/kubernetes.io/serviceaccount
umount -l "$POD/stash"
log "pod filesystem ready; starting multus-daemon (node $NODE)"

exec env -i PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
  MULTUS_NODE_NAME="$NODE" NODE_NAME="$NODE" \
  KUBERNETES_SERVICE_HOST="${API_HOST:-127.0.0.1}" KUBERNETES_SERVICE_PORT="$API_PORT" \
  "$DIR/bin/multus-daemon" -config "$POD/daemon-config.json"
