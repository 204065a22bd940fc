#!/usr/bin/env bash
# Exit 0 when the RUNNING kernel can create an ipvlan link, else 1.
# Tries in a throwaway netns (veth end as master) and cleans up; never touches
# the caller's namespace. Tries `modprobe ipvlan` first (quietly).
set -u
[ "$(id -u)" = 0 ] || { echo "has-ipvlan: must run as root" >&2; exit 1; }
command -v ip >/dev/null || { echo "has-ipvlan: 'ip' (iproute2) missing" >&2; exit 1; }

ns="tether-hasipvlan-$$-$RANDOM"
cleanup() { ip netns del "$ns" 2>/dev/null || true; }
trap cleanup EXIT

modprobe -q ipvlan 2>/dev/null || true
ip netns add "$ns" || exit 1
ip -n "$ns" link add tiv0 type veth peer name tiv1 || exit 1
if ip -n "$ns" link add link tiv0 name tivl0 type ipvlan mode l2 2>/dev/null; then
    exit 0
fi
exit 1
