#!/usr/bin/env bash
# Prepare the lab kernel: a Debian bookworm linux-image-6.1.0-N-amd64 (its
# modules include ipvlan.ko, dummy.ko, 8021q.ko) that virtme-ng boots under
# qemu sharing the host's root filesystem.
#
# Idempotent. Installs what it needs itself (qemu, kmod, iproute2, ping,
# busybox, virtme-ng) so it works on a brand-new Debian machine. The kernel
# package is downloaded ONCE into a cache outside the source tree and reused
# afterwards without touching the network.
#
# Prints the absolute path of the vmlinuz on stdout (and nothing else on
# stdout); progress goes to stderr.
#
# Environment:
#   TETHER_LAB_CACHE    cache dir (default /var/cache/tether-lab)
#   TETHER_LAB_KERNEL   pin an ABI name, e.g. 6.1.0-57-amd64 (default: the
#                       one already cached, else the highest N apt lists)
#   TETHER_LAB_REFRESH  =1: ignore the cached choice and pick the newest again
set -euo pipefail

CACHE=${TETHER_LAB_CACHE:-/var/cache/tether-lab}
log() { printf 'lab/kernel: %s\n' "$*" >&2; }
die() { printf 'lab/kernel: ERROR: %s\n' "$*" >&2; exit 1; }

[ "$(id -u)" = 0 ] || die "must run as root (installs packages and /lib/modules/<ver>)"

export DEBIAN_FRONTEND=noninteractive
APT_UPDATED=0
apt_update_once() {
    if [ "$APT_UPDATED" = 0 ]; then
        log "apt-get update"
        apt-get update -qq >&2 || die "apt-get update failed"
        APT_UPDATED=1
    fi
}

# --- host tools --------------------------------------------------------------
need_pkgs=()
command -v qemu-system-x86_64 >/dev/null || need_pkgs+=(qemu-system-x86)
command -v depmod >/dev/null || [ -x /usr/sbin/depmod ] || need_pkgs+=(kmod)
command -v ip >/dev/null || need_pkgs+=(iproute2)
command -v ping >/dev/null || need_pkgs+=(iputils-ping)
command -v busybox >/dev/null || need_pkgs+=(busybox-static)
command -v jq >/dev/null || need_pkgs+=(jq)
command -v dpkg-deb >/dev/null || die "dpkg-deb missing: this needs a Debian-based host"
if [ "${#need_pkgs[@]}" -gt 0 ]; then
    log "installing ${need_pkgs[*]}"
    if ! apt-get install -y -qq --no-install-recommends "${need_pkgs[@]}" >&2; then
        apt_update_once
        apt-get install -y -qq --no-install-recommends "${need_pkgs[@]}" >&2 \
            || die "apt-get install ${need_pkgs[*]} failed"
    fi
fi

if ! command -v vng >/dev/null; then
    log "installing virtme-ng from PyPI"
    if ! command -v python3 >/dev/null || ! python3 -m pip --version >/dev/null 2>&1; then
        apt_update_once
        apt-get install -y -qq --no-install-recommends python3 python3-pip >&2 \
            || die "cannot install python3-pip"
    fi
    # Debian's system python refuses plain `pip install` (PEP 668).
    python3 -m pip install -q virtme-ng >&2 \
        || python3 -m pip install -q --break-system-packages virtme-ng >&2 \
        || die "pip install virtme-ng failed"
    hash -r
    command -v vng >/dev/null || die "virtme-ng installed but 'vng' is not on PATH ($PATH)"
fi

# --- pick the kernel ---------------------------------------------------------
mkdir -p "$CACHE"
ABI_RE='^6\.1\.0-[0-9]+-amd64$'

newest_available() {
    # Highest linux-image-6.1.0-N-amd64 that apt can actually install
    # (has a candidate); excludes -cloud/-rt/-dbg/-unsigned.
    # (No `cmd | grep -q` here: with pipefail, grep -q exiting early
    # SIGPIPEs the writer and the test reads as false.)
    local p names policy
    names=$(apt-cache pkgnames linux-image-6.1.0- 2>/dev/null \
        | grep -E '^linux-image-6\.1\.0-[0-9]+-amd64$' | sort -V -r || true)
    for p in $names; do
        policy=$(apt-cache policy "$p" 2>/dev/null || true)
        if [[ "$policy" =~ Candidate:\ [0-9] ]]; then
            echo "${p#linux-image-}"
            return 0
        fi
    done
}

ABI=${TETHER_LAB_KERNEL:-}
if [ -z "$ABI" ] && [ "${TETHER_LAB_REFRESH:-0}" != 1 ] && [ -f "$CACHE/current" ]; then
    ABI=$(cat "$CACHE/current")
fi
if [ -z "$ABI" ]; then
    ABI=$(newest_available)
    if [ -z "$ABI" ]; then
        apt_update_once
        ABI=$(newest_available)
    fi
    [ -n "$ABI" ] || die "apt knows no linux-image-6.1.0-N-amd64 package (is a Debian bookworm source configured?)"
fi
[[ "$ABI" =~ $ABI_RE ]] || die "unexpected kernel ABI name '$ABI' (want 6.1.0-N-amd64)"

KDIR="$CACHE/$ABI"
VMLINUZ="$KDIR/boot/vmlinuz-$ABI"

# --- download + unpack once --------------------------------------------------
if [ ! -f "$KDIR/.complete" ]; then
    pkg="linux-image-$ABI"
    tmp=$(mktemp -d "$CACHE/.dl.XXXXXX")
    trap 'rm -rf "$tmp"' EXIT
    log "downloading $pkg into $CACHE"
    if ! (cd "$tmp" && apt-get download -qq -o APT::Sandbox::User=root "$pkg" >&2); then
        apt_update_once
        (cd "$tmp" && apt-get download -qq -o APT::Sandbox::User=root "$pkg" >&2) || die "apt-get download $pkg failed"
    fi
    deb=$(ls "$tmp"/*.deb 2>/dev/null | head -1)
    [ -n "$deb" ] || die "apt-get download produced no .deb"
    mkdir -p "$tmp/x"
    dpkg-deb -x "$deb" "$tmp/x" || die "dpkg-deb -x $deb failed"
    [ -f "$tmp/x/boot/vmlinuz-$ABI" ] || die "package has no boot/vmlinuz-$ABI"
    [ -d "$tmp/x/lib/modules/$ABI" ] || die "package has no lib/modules/$ABI"
    [ -n "$(find "$tmp/x/lib/modules/$ABI" -name 'ipvlan.ko*')" ] \
        || die "package modules lack ipvlan.ko"
    rm -rf "$KDIR"
    mkdir -p "$KDIR"
    mv "$tmp/x/boot" "$tmp/x/lib" "$KDIR/"
    mv "$deb" "$KDIR/"
    touch "$KDIR/.complete"
    rm -rf "$tmp"
    trap - EXIT
fi
echo "$ABI" >"$CACHE/current.tmp" && mv "$CACHE/current.tmp" "$CACHE/current"

# --- install modules where the guest (sharing our root fs) finds them --------
MODDIR=/lib/modules/$ABI
if [ ! -f "$MODDIR/.tether-lab" ] || [ ! -f "$MODDIR/modules.dep" ]; then
    log "installing modules into $MODDIR"
    mkdir -p /lib/modules
    rm -rf "$MODDIR"
    cp -a "$KDIR/lib/modules/$ABI" "$MODDIR"
    /usr/sbin/depmod "$ABI" 2>/dev/null || depmod "$ABI" || die "depmod $ABI failed"
    touch "$MODDIR/.tether-lab"
fi

[ -f "$VMLINUZ" ] || die "missing $VMLINUZ"
log "kernel $ABI"
echo "$VMLINUZ"
