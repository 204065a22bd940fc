#!/usr/bin/env bash
# Run a shell command as root inside a throwaway VM booted on the lab kernel
# (Debian 6.1, which has ipvlan/dummy/8021q), sharing the host's root fs.
#
#   conformance/lab/run.sh '<shell command>'   # exit status = the command's
#   conformance/lab/run.sh --shell             # interactive shell in the VM
#
# Inside the VM: cwd = the repo root; `modprobe ipvlan` already done; the root
# fs is READ-ONLY (9p) except:
#   - <repo>/target/lab            rw, shared with the host (persisted)
#   - /tmp /etc /var /usr /home    writable overlays in guest RAM (discarded)
#   - /run /var/tmp /var/cache ... tmpfs (discarded)
# so /run/netns, /var/lib/cni, /tmp all work; <repo>/target is otherwise RO.
#
# vng does not reliably propagate the exit status (without udev on the host
# the guest cannot find its virtio-serial script ports, falls back to the
# console, and vng always exits 255), so the command runs under a wrapper that
# writes its output and exit status into a per-run dir under target/lab/runs;
# this script streams the output and exits with that status. It FAILS loudly
# if the VM does not boot or the status cannot be read.
#
# Environment passed into the VM: PATH, HOME, USER, LANG, TERM and every
# TETHER_*, RUST_*, CARGO_* variable (TETHER_LAB=1 is always set).
#
# The VM has no network to the outside. With TETHER_LAB_FORWARD=<port> it has one NIC (qemu user
# networking with restrict=on) on which exactly one thing is reachable: 10.0.2.100:<port>, each
# connection relayed (socat) to 127.0.0.1:<port> on the host. The guest configures that NIC
# itself (see conformance/multus/up.sh: a server the host runs natively instead of under TCG).
#
# Knobs: TETHER_LAB_TIMEOUT (s, default 1800), TETHER_LAB_MEMORY (default 2G),
# TETHER_LAB_CPUS (default: all host cpus), TETHER_LAB_KVM (default 0),
# TETHER_LAB_VERBOSE=1 (print the kernel boot log), TETHER_LAB_FORWARD, plus kernel.sh's.
set -euo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
ROOT=$(cd "$HERE/../.." && pwd)
log() { printf 'lab/run: %s\n' "$*" >&2; }
die() { printf 'lab/run: FAILED: %s\n' "$*" >&2; exit 1; }

SHELL_MODE=0
if [ "${1:-}" = --shell ]; then
    SHELL_MODE=1
    shift
elif [ $# -ne 1 ] || [ -z "$1" ]; then
    echo "usage: $0 '<shell command>' | --shell" >&2
    exit 2
fi

[ "$(id -u)" = 0 ] || die "must run as root"
VMLINUZ=$("$HERE/kernel.sh") || die "cannot prepare the lab kernel (conformance/lab/kernel.sh failed)"
[ -f "$VMLINUZ" ] || die "kernel.sh printed '$VMLINUZ', which is not a file"
VNG=$(command -v vng) || die "vng not on PATH"

LAB_DIR="$ROOT/target/lab"
mkdir -p "$LAB_DIR/runs"
RUN=$(mktemp -d "$LAB_DIR/runs/run.XXXXXX")

vng_args=(--run "$VMLINUZ" --force-9p --memory "${TETHER_LAB_MEMORY:-2G}"
          --rwdir "$LAB_DIR" --cwd "$ROOT")
[ -z "${TETHER_LAB_CPUS:-}" ] || vng_args+=(--cpus "$TETHER_LAB_CPUS")
# KVM is OFF by default: on the project's machines /dev/kvm exists and opens
# but qemu aborts with it ("failed to set MSR 0x10a", nested virt). TCG boots
# in ~7 s anyway. TETHER_LAB_KVM=1 opts in where KVM really works.
[ "${TETHER_LAB_KVM:-0}" = 1 ] || vng_args+=(--disable-kvm)
# vng hands --qemu-opts to a shell: the relay is a script, so the option has no spaces.
if [ -n "${TETHER_LAB_FORWARD:-}" ]; then
    [[ "$TETHER_LAB_FORWARD" =~ ^[0-9]+$ ]] || die "TETHER_LAB_FORWARD must be a port number"
    command -v socat >/dev/null || die "TETHER_LAB_FORWARD needs socat (apt-get install socat)"
    relay="$RUN/forward-$TETHER_LAB_FORWARD.sh"
    printf '#!/bin/sh\nexec socat - TCP:127.0.0.1:%s\n' "$TETHER_LAB_FORWARD" >"$relay"
    chmod +x "$relay"
    vng_args+=("--qemu-opts=-netdev user,id=fwd,restrict=on,guestfwd=tcp:10.0.2.100:$TETHER_LAB_FORWARD-cmd:$relay -device virtio-net-pci,netdev=fwd")
fi

# Environment for the guest (the guest init starts from a near-empty env).
{
    echo "export TETHER_LAB=1"
    for v in PATH HOME USER LANG TERM; do
        [ -z "${!v:-}" ] || printf 'export %s=%q\n' "$v" "${!v}"
    done
    while IFS= read -r v; do
        printf 'export %s=%q\n' "$v" "${!v}"
    done < <(compgen -e | grep -E '^(TETHER_|RUST_|CARGO_)' | grep -vx TETHER_LAB || true)
} >"$RUN/env.sh"

if [ "$SHELL_MODE" = 1 ]; then
    log "interactive shell (kernel $(basename "$VMLINUZ")); exit the shell to stop the VM"
    log "inside: 'source $RUN/env.sh; modprobe ipvlan' for the test environment"
    exec "$VNG" "${vng_args[@]}"
fi

printf '%s\n' "$1" >"$RUN/cmd.sh"
cat >"$RUN/guest.sh" <<EOF
#!/bin/bash
# Runs inside the VM. Everything persisted goes to $RUN (an rwdir).
echo started >"$RUN/started"
exec >"$RUN/output" 2>&1 </dev/null
source "$RUN/env.sh"
cd "$ROOT" || { echo 125 >"$RUN/status"; exit 125; }
if ! modprobe ipvlan; then
    echo "lab/run(guest): modprobe ipvlan failed" >&2
    echo 124 >"$RUN/status.tmp"; mv "$RUN/status.tmp" "$RUN/status"
    exit 124
fi
set +e
bash "$RUN/cmd.sh"
rc=\$?
sync
echo \$rc >"$RUN/status.tmp"; mv "$RUN/status.tmp" "$RUN/status"
exit \$rc
EOF
: >"$RUN/output"

TIMEOUT=${TETHER_LAB_TIMEOUT:-1800}
log "booting $(basename "$VMLINUZ") (run dir ${RUN#"$ROOT"/}, timeout ${TIMEOUT}s)"
t0=$(date +%s.%N)
# -v puts the kernel console into boot.log (useful when it does not boot).
timeout --kill-after=20 "$TIMEOUT" "$VNG" -v "${vng_args[@]}" \
    --exec "bash $(printf '%q' "$RUN/guest.sh")" </dev/null >"$RUN/boot.log" 2>&1 &
vm_pid=$!
# `timeout` runs in its own process group, so a Ctrl-C here would not reach
# the VM: forward INT/TERM to it (timeout passes them on to qemu).
stop_vm() { kill -TERM "$vm_pid" 2>/dev/null || true; }
trap 'stop_vm; die "interrupted"' INT TERM

# Stream the command's output while the VM runs.
printed_boot=0
tail -n +1 -s 0.3 -F --pid="$vm_pid" "$RUN/output" 2>/dev/null &
tail_pid=$!
while kill -0 "$vm_pid" 2>/dev/null; do
    if [ "$printed_boot" = 0 ] && [ -f "$RUN/started" ]; then
        printed_boot=1   # measured on the host clock (the guest's may differ)
        log "VM booted in $(awk -v a="$t0" -v b="$(date +%s.%N)" 'BEGIN{printf "%.1f", b-a}') s"
    fi
    sleep 0.3
done
set +e
wait "$vm_pid"
vng_rc=$?
wait "$tail_pid"
set -e
t1=$(date +%s.%N)
total=$(awk -v a="$t0" -v b="$t1" 'BEGIN{printf "%.1f", b-a}')

trap - INT TERM
if [ "${TETHER_LAB_VERBOSE:-0}" = 1 ]; then log "---- boot log ----"; cat "$RUN/boot.log" >&2; fi

if [ ! -f "$RUN/started" ]; then
    tail -n 40 "$RUN/boot.log" >&2 || true
    [ "$vng_rc" = 124 ] && die "VM did not boot within ${TIMEOUT}s (boot log: $RUN/boot.log)"
    die "VM did not boot (vng exit $vng_rc; boot log: $RUN/boot.log)"
fi
[ "$printed_boot" = 1 ] || log "VM booted (boot time not measured: the command ended within 0.3 s)"
if [ ! -f "$RUN/status" ]; then
    grep -E 'Kernel panic|Oops|BUG:|Out of memory|oom-kill' "$RUN/boot.log" >&2 || true
    [ "$vng_rc" = 124 ] && die "command timed out after ${TIMEOUT}s (boot log: $RUN/boot.log)"
    die "command did not report an exit status (VM died? vng exit $vng_rc; boot log: $RUN/boot.log)"
fi
status=$(cat "$RUN/status")
[[ "$status" =~ ^[0-9]+$ ]] || die "unreadable exit status '$status' in $RUN/status"
log "command exited $status (VM total ${total} s)"
# Keep the last few run dirs for post-mortems.
ls -1dt "$LAB_DIR"/runs/run.* 2>/dev/null | tail -n +11 | xargs -r rm -rf
exit "$status"
