#!/usr/bin/env bash
# The local images the e2e node runs, built offline FROM scratch (nothing can be pulled):
#   $1/pause.tar    localhost/kubelet-lab/pause:3.10.2   busybox `sleep infinity` as the sandbox
#   $1/busybox.tar  localhost/kubelet-lab/busybox:1.35   Debian's busybox-static with its applet links
#   $1/multus-thick.tar  localhost/multus-thick:v4.3.0   the peers' multus-daemon and multus-shim at
#                   upstream's paths (/usr/src/multus-cni/bin), busybox for the init container's cp,
#                   /etc/passwd (the daemon insists on user.Current() = root, which a static Go
#                   binary answers from /etc/passwd; upstream's base image has one), /var/run -> /run
# Adapted from ../shared/peers/kubelet-lab/images.sh (same names, same mkimage.py, copied here); the
# pause binary from Kubernetes' pause.c is not built (no KL_PAUSE_C): a sleeping busybox does the
# same job for a sandbox. node.sh imports them with `ctr -n k8s.io images import`.
set -euo pipefail
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
OUT=${1:?usage: images.sh OUTDIR}
PEERS_BIN_DIR=${PEERS_BIN_DIR:-/var/cache/tether-peers/bin}
if [ ! -x /bin/busybox ] || ! file -b /bin/busybox | grep -q 'statically linked'; then
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends busybox-static >/dev/null
fi
mkdir -p "$OUT"
W=$(mktemp -d); trap 'rm -rf "$W"' EXIT
mkdir -p "$W/pause/bin"
cp /bin/busybox "$W/pause/bin/busybox"; ln -s busybox "$W/pause/bin/sleep"
python3 "$HERE/mkimage.py" "$OUT/pause.tar" localhost/kubelet-lab/pause:3.10.2 "$W/pause" \
  --entrypoint '["/bin/sleep","infinity"]' --user 65535:65535 >/dev/null
R=$W/busybox
mkdir -p "$R/bin" "$R/etc" "$R/tmp" "$R/root" "$R/proc" "$R/sys" "$R/dev" "$R/var/run"
chmod 1777 "$R/tmp"
cp /bin/busybox "$R/bin/busybox"
for a in $(/bin/busybox --list); do [ "$a" = busybox ] || ln -sf busybox "$R/bin/$a"; done
printf 'root:x:0:0:root:/root:/bin/sh\nnobody:x:65534:65534:nobody:/:/bin/false\n' >"$R/etc/passwd"
printf 'root:x:0:\nnogroup:x:65534:\n' >"$R/etc/group"
python3 "$HERE/mkimage.py" "$OUT/busybox.tar" localhost/kubelet-lab/busybox:1.35 "$R" \
  --cmd '["/bin/sh"]' --env PATH=/bin >/dev/null
T=$W/multus-thick
mkdir -p "$T/bin" "$T/usr/src/multus-cni/bin" "$T/tmp" "$T/etc" "$T/run" "$T/var"
# The runtime hands the daemon netns paths under /var/run/netns, which it opens in its own
# filesystem: /var/run must lead to the /run/netns the pod mounts, as on every distribution.
ln -s ../run "$T/var/run"
cp "$R/etc/passwd" "$R/etc/group" "$T/etc/"
cp /bin/busybox "$T/bin/busybox"; ln -s busybox "$T/bin/cp"; ln -s busybox "$T/bin/sh"
cp "$PEERS_BIN_DIR/multus-daemon" "$PEERS_BIN_DIR/multus-shim" "$T/usr/src/multus-cni/bin/"
python3 "$HERE/mkimage.py" "$OUT/multus-thick.tar" localhost/multus-thick:v4.3.0 "$T" \
  --entrypoint '["/usr/src/multus-cni/bin/multus-daemon"]' --env PATH=/bin >/dev/null
