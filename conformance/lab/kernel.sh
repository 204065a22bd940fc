#!/usr/bin/env bash
# Prepare the lab kernel: a Debian bookworm linux-image-6.1.0-N-amd64 (its
# modules include ipvlan.ko, dummy.ko, 8021q.ko) that virtme-ng boots under
# qemu sharing the host's root filesystem.
#
# Idempotent. Installs what it needs itself (qemu, kmod, iproute2, ping,
# busybox, jq, containernetworking-plugins, virtme-ng) so it works on a brand-new Debian machine. The kernel
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
export PATH="$PATH:/usr/local/sbin:/usr/sbin:/sbin"
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
command -v depmod >/dev/null || need_pkgs+=(kmod)
command -v ip >/dev/null || need_pkgs+=(iproute2)
command -v ping >/dev/null || need_pkgs+=(iputils-ping)
command -v busybox >/dev/null || need_pkgs+=(busybox-static)
command -v jq >/dev/null || need_pkgs+=(jq)
# The Debian reference CNI plugins (ipvlan, host-local, ...) lab tests compare against.
[ -x /usr/lib/cni/ipvlan ] || need_pkgs+=(containernetworking-plugins)
command -v dpkg-deb >/dev/null || die "dpkg-deb missing: this needs a Debian-based host"
if [ "${#need_pkgs[@]}" -gt 0 ]; then
    log "installing ${need_pkgs[*]}"
    if ! apt-get install -y -qq --no-install-recommends "${need_pkgs[@]}" >&2; then
        apt_update_once
        apt-get install -y -qq --no-install-recommends "${need_pkgs[@]}" >&2 \
            || die "apt-get install ${need_pkgs[*]} failed"
    fi
fi

# virtme-ng: pinned to the version this lab was validated with (override
# TETHER_LAB_VIRTME_VERSION=; empty = latest). An installed vng is used as is.
VIRTME_VERSION=${TETHER_LAB_VIRTME_VERSION-1.42}
if ! command -v vng >/dev/null; then
    spec="virtme-ng${VIRTME_VERSION:+==$VIRTME_VERSION}"
    log "installing $spec from PyPI"
    if ! command -v python3 >/dev/null || ! python3 -m pip --version >/dev/null 2>&1; then
        apt_update_once
        apt-get install -y -qq --no-install-recommends python3 python3-pip >&2 \
            || die "cannot install python3-pip"
    fi
    # Debian's system python refuses plain `pip install` (PEP 668).
    python3 -m pip install -q "$spec" >&2 \
        || python3 -m pip install -q --break-system-packages "$spec" >&2 \
        || die "pip install $spec failed"
    # pyenv only exposes new scripts after a rehash; else link it onto PATH.
    command -v pyenv >/dev/null && pyenv rehash >/dev/null 2>&1 || true
    hash -r
    if ! command -v vng >/dev/null; then
        scripts=$(python3 -c 'import sysconfig; print(sysconfig.get_path("scripts"))')
        [ -x "$scripts/vng" ] || die "virtme-ng installed but no vng in $scripts"
        ln -sf "$scripts/vng" /usr/local/bin/vng
        hash -r
    fi
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

# Cache layout: $CACHE/<abi>/{vmlinuz-<abi>, linux-image-<abi>_*.deb}.
# NOTE: no lib/modules next to (or above) the vmlinuz: virtme-ng walks up from
# the kernel image looking for a "lib/modules" dir and, if it finds one other
# than the host's, symlinks the guest's /lib/modules/<ver> into THAT path; a
# path under /var/cache is a tmpfs inside the guest, so modprobe would fail.
# With nothing found it uses the root fs's /lib/modules/<ver>, installed below.
KDIR="$CACHE/$ABI"
VMLINUZ="$KDIR/vmlinuz-$ABI"

unpack_deb() { # <deb> <dir>
    dpkg-deb -x "$1" "$2" || die "dpkg-deb -x $1 failed"
    [ -f "$2/boot/vmlinuz-$ABI" ] || die "$1 has no boot/vmlinuz-$ABI"
    [ -d "$2/lib/modules/$ABI" ] || die "$1 has no lib/modules/$ABI"
    [ -n "$(find "$2/lib/modules/$ABI" -name 'ipvlan.ko*')" ] \
        || die "$1: modules lack ipvlan.ko"
}

tmp=
cleanup() { [ -z "$tmp" ] || rm -rf "$tmp"; }
trap cleanup EXIT

# --- download + unpack once --------------------------------------------------
if [ ! -f "$KDIR/.complete" ]; then
    pkg="linux-image-$ABI"
    tmp=$(mktemp -d "$CACHE/.dl.XXXXXX")
    log "downloading $pkg into $KDIR"
    if ! (cd "$tmp" && apt-get download -qq -o APT::Sandbox::User=root "$pkg" >&2); then
        apt_update_once
        (cd "$tmp" && apt-get download -qq -o APT::Sandbox::User=root "$pkg" >&2) \
            || die "apt-get download $pkg failed"
    fi
    deb=$(ls "$tmp"/*.deb 2>/dev/null | head -1)
    [ -n "$deb" ] || die "apt-get download produced no .deb"
    unpack_deb "$deb" "$tmp/x"
    rm -rf "$KDIR"
    mkdir -p "$KDIR"
    mv "$tmp/x/boot/vmlinuz-$ABI" "$VMLINUZ"
    mv "$deb" "$KDIR/"
    touch "$KDIR/.complete"
    rm -rf "$tmp"; tmp=
fi
echo "$ABI" >"$CACHE/current.tmp" && mv "$CACHE/current.tmp" "$CACHE/current"

# --- install modules where the guest (sharing our root fs) finds them --------
MODDIR=/lib/modules/$ABI
if [ ! -f "$MODDIR/.tether-lab" ] && [ -f "$MODDIR/modules.dep" ] \
    && [ -n "$(find "$MODDIR" -name 'ipvlan.ko*' 2>/dev/null)" ]; then
    : # installed by dpkg (or someone else): use as is, do not clobber
elif [ ! -f "$MODDIR/.tether-lab" ] || [ ! -f "$MODDIR/modules.dep" ]; then
    log "installing modules into $MODDIR"
    deb=$(ls "$KDIR"/linux-image-*.deb 2>/dev/null | head -1)
    [ -n "$deb" ] || die "no .deb in $KDIR (delete $KDIR and rerun)"
    tmp=$(mktemp -d "$CACHE/.mod.XXXXXX")
    unpack_deb "$deb" "$tmp"
    mkdir -p /lib/modules
    rm -rf "$MODDIR"
    mv "$tmp/lib/modules/$ABI" "$MODDIR"
    rm -rf "$tmp"; tmp=
    depmod "$ABI" || die "depmod $ABI failed"
    touch "$MODDIR/.tether-lab"
fi

[ -f "$VMLINUZ" ] || die "missing $VMLINUZ"
log "kernel $ABI"
echo "$VMLINUZ"
