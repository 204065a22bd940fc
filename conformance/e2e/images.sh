#!/usr/bin/env bash
# The two local images the e2e node runs, built offline FROM scratch (nothing can be pulled):
#   $1/pause.tar    localhost/kubelet-lab/pause:3.10.2   busybox `sleep infinity` as the sandbox
#   $1/busybox.tar  localhost/kubelet-lab/busybox:1.35   Debian's busybox-static with its applet links
# Adapted from ../shared/peers/kubelet-lab/images.sh (same names, same mkimage.py, copied here); the
# pause binary from Kubernetes' pause.c is not built (no KL_PAUSE_C): a sleeping busybox does the
# same job for a sandbox. node.sh imports them with `ctr -n k8s.io images import`.
set -euo pipefail
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
OUT=${1:?usage: images.sh OUTDIR}
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
