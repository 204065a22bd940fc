# shellcheck shell=bash
# Shared by the e2e scripts (conformance/e2e/): where things live, the ports, and the helpers that
# stop exactly the processes our pid files name. Sourced on the host and in the lab VM alike; the
# state directory is under target/lab, which the lab VM shares read-write with the host.
E2E_HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
E2E_ROOT=$(cd "$E2E_HERE/../.." && pwd)
# Everything one run writes (PKI, kubeconfigs, binaries, images, logs, results). Cleared at the
# start of a run, kept after it for post-mortems.
E2E_DIR=${TETHER_E2E_DIR:-$E2E_ROOT/target/lab/e2e}
# The host's control plane. Ports of their own: other API servers run beside this one on this
# machine (conformance/kube: 26443/33790, a dev server on 27443/34790, a fleet bench on 28443/35790).
E2E_API_PORT=${TETHER_E2E_API_PORT:-47443}
E2E_ETCD_PORT=${TETHER_E2E_ETCD_PORT:-47379}
E2E_ETCD_PEER_PORT=${TETHER_E2E_ETCD_PEER_PORT:-47380}
E2E_KCM_PORT=${TETHER_E2E_KCM_PORT:-47257}
E2E_SCHED_PORT=${TETHER_E2E_SCHED_PORT:-47259}
# What the lab VM's one forwarded port looks like from inside the VM (conformance/lab/run.sh).
E2E_GUEST_API_HOST=10.0.2.100
E2E_NODE=${TETHER_E2E_NODE:-e2e-node}
E2E_NODE_B=e2e-node-b   # test-two-nodes.sh's second node (node-b.sh), in the same VM
E2E_TOKEN=e2e-admin-token
PEERS_BIN_DIR=${PEERS_BIN_DIR:-/var/cache/tether-peers/bin}
PEERS=${TETHER_PEERS:-$E2E_ROOT/../shared/peers}

e2e_log() { echo "e2e/${0##*/}: $(date +%T) $*" >&2; }
e2e_die() { echo "e2e/${0##*/}: FAILED: $*" >&2; exit 1; }

# ours PIDFILE WORD: print the pid if that process is alive and its command line has WORD
# (never a recycled pid that now belongs to someone else).
ours() {
  local pid
  [ -s "$1" ] || return 1
  pid=$(cat "$1")
  [ "$pid" != "$$" ] && [ -d "/proc/$pid" ] && tr '\0' ' ' <"/proc/$pid/cmdline" 2>/dev/null | grep -q -- "$2" && echo "$pid"
}
# alive PIDFILE: the process started in the background is still there. For readiness loops right
# after `cmd &`: until the forked shell has exec'd, /proc/PID/cmdline is still this shell's, which
# `ours` would take for a dead process (seen: "kube-apiserver not ready" 7 s into a run, log empty).
alive() { [ -s "$1" ] && kill -0 "$(cat "$1")" 2>/dev/null; }
# stop_pidfile PIDFILE WORD [SECONDS]: TERM, then KILL after SECONDS (default 10).
stop_pidfile() {
  local pid t=${3:-10}
  pid=$(ours "$1" "$2") || { rm -f "$1"; return 0; }
  kill -TERM "$pid" 2>/dev/null || true
  for _ in $(seq 1 $((t * 4))); do [ -d "/proc/$pid" ] || break; sleep 0.25; done
  if [ -d "/proc/$pid" ]; then e2e_log "$2 (pid $pid) ignored SIGTERM: SIGKILL"; kill -KILL "$pid" 2>/dev/null || true; fi
  rm -f "$1"
}
# The e2e CA (control-plane.sh makes it; node-b.sh issues node B's credential from it too).
E2E_PKI=$E2E_DIR/cp/pki
issue() { # name subject ext-lines...: a key and a cert from the CA
  local n=$1 subj=$2; shift 2
  openssl req -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -sha256 -subj "$subj" \
    -keyout "$E2E_PKI/$n.key" -out "$E2E_PKI/$n.csr" 2>/dev/null
  printf '%s\n' "basicConstraints=CA:FALSE" "keyUsage=critical,digitalSignature,keyEncipherment" "$@" >"$E2E_PKI/$n.ext"
  openssl x509 -req -in "$E2E_PKI/$n.csr" -CA "$E2E_PKI/ca.crt" -CAkey "$E2E_PKI/ca.key" -CAcreateserial \
    -days 30 -sha256 -extfile "$E2E_PKI/$n.ext" -out "$E2E_PKI/$n.crt" 2>/dev/null
  chmod 600 "$E2E_PKI/$n.key"
}
kubeconfig() { # name server user-yaml...: a kubeconfig with inline CA, on stdout
  local n=$1 server=$2; shift 2
  cat <<EOF
apiVersion: v1
kind: Config
clusters:
- name: e2e
  cluster:
    server: $server
    certificate-authority-data: $(base64 -w0 <"$E2E_PKI/ca.crt")
users:
- name: $n
  user:
$(printf '    %s\n' "$@")
contexts:
- name: e2e
  context: {cluster: e2e, user: $n}
current-context: e2e
EOF
}
certkubeconfig() { # name server: a kubeconfig with the client cert and key of NAME inline
  kubeconfig "$1" "$2" "client-certificate-data: $(base64 -w0 <"$E2E_PKI/$1.crt")" \
    "client-key-data: $(base64 -w0 <"$E2E_PKI/$1.key")"
}
# now: seconds since the epoch, with decimals (for the measured times)
now() { date +%s.%N; }
since() { awk -v a="$1" -v b="$(now)" 'BEGIN{printf "%.1f", b-a}'; }

# The kernel's own count of tether's CNI calls, independent of tether: an ftrace instance
# recording every exec of a tether plugin (sched_process_exec, filtered by file name), whoever
# runs it (containerd's Multus, the thick daemon's chroot, tether-ipvlan's delegation, a check by
# hand). node.sh starts it before tether is installed; test-node-gone.sh holds the agent's
# tether_cni_call_duration_seconds_count against it.
E2E_TRACE=/sys/kernel/tracing/instances/tether-e2e-calls
exec_trace_start() {
  mountpoint -q /sys/kernel/tracing || mount -t tracefs nodev /sys/kernel/tracing || return 1
  [ ! -d "$E2E_TRACE" ] || rmdir "$E2E_TRACE" || return 1
  mkdir "$E2E_TRACE" &&
    echo 4096 >"$E2E_TRACE/buffer_size_kb" &&
    echo 'filename ~ "*/tether-ip*"' >"$E2E_TRACE/events/sched/sched_process_exec/filter" &&
    echo 1 >"$E2E_TRACE/events/sched/sched_process_exec/enable" &&
    echo 1 >"$E2E_TRACE/tracing_on"
}
# traced_execs PLUGIN: how many times the kernel exec'd PLUGIN since exec_trace_start; fails if
# the ring buffer lost events (the count would be short).
traced_execs() {
  local lost
  lost=$(awk '/^overrun:/ {n += $2} END {print n + 0}' "$E2E_TRACE"/per_cpu/cpu*/stats) || return 1
  [ "$lost" = 0 ] || { echo "the exec trace lost $lost events" >&2; return 1; }
  grep -c "sched_process_exec: filename=[^ ]*/$1 " "$E2E_TRACE/trace" || true
}
