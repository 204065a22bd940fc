#!/usr/bin/env bash
# The e2e node, INSIDE the lab VM (run by conformance/e2e/run.sh through conformance/lab/run.sh):
# containerd (Debian's 1.6, CRI) + runc + the v1.36 kubelet, on the lab kernel (Debian 6.1,
# which has ipvlan), against the control plane that runs on the host. Then it runs test.sh, and
# stops everything it started, by pid, in the order a node shuts down (pods deleted through the
# API so the kubelet runs CNI DEL, kubelet, containerd's leftovers, containerd, proxies).
#
# The VM is throwaway (its /etc /var /opt /usr are RAM overlays over the host's read-only root), so
# the node uses a real node's paths: /opt/cni/bin, /etc/cni/net.d, /var/lib/cni, /var/lib/kubelet,
# /var/lib/containerd, /run/containerd. Each of those gets a fresh tmpfs first: they start empty
# whatever the host has there, and containerd's overlayfs snapshotter needs an upper dir that is
# not itself on overlayfs (the VM's /var is).
#
# What differs from a real node, and why:
#   - The API server is at https://10.0.2.100:PORT (the VM's one forwarded port). The kubelet's
#     kubeconfig says so. Pods are told KUBERNETES_SERVICE_HOST=10.96.0.1:443 (the `kubernetes`
#     Service); there is no kube-proxy, so one iptables DNAT rule (OUTPUT, the node's own traffic:
#     host-network pods such as tether's agent, and the CNI plugins) stands in for it.
#   - Nothing can reach the kubelet (qemu user networking, restrict=on): `kubectl logs/exec` do not
#     work. The test looks into pods from here instead (test.sh: the sandbox's netns via ctr +
#     nsenter), and reads container logs from the kubelet's /var/log/pods.
#   - Multus' thin plugin reaches the API server through `kubectl proxy` on this node's loopback,
#     as in conformance/multus/up.sh: it gives its pod GET 2.5 s in all, which a fresh process's TLS
#     handshake under qemu TCG can exceed. Same requests, same RBAC (kube-system/multus' token).
#     TETHER_E2E_MULTUS_DIRECT=1 points it straight at the API server instead.
#   - The kubelet writes its kernel tunables (vm.overcommit_memory, kernel.panic, ...): inside
#     the throwaway VM that is harmless, so unlike ../shared/peers/kubelet-lab no shadow sysctls.
#   - The VM's root has every capability, so containerd's restrict_oom_score_adj stays off.
#   - cgroup v2 (the VM mounts cgroup2 only), cgroupfs driver: the kubelet-lab needed v1 on the host.
#   - / is made rshared before containerd starts: systemd does that on every real node, the VM's
#     init does not, and a HostToContainer mount (the thick Multus daemon's) needs it.
#   - The binaries run from RAM copies (/run/e2e/bin): the VM's root is 9p without a page cache,
#     where every exec of a big Go binary pages it in again over 9p.
# The node's NIC for ipvlan is enp5s0: one end of a veth pair whose other end is in netns
# e2e-wire, which plays the management segment (10.20.30.1/24, the NAD's gateway).
#
# Knobs: TETHER_E2E_NODE_TIMEOUT (s, node Ready; default 420), TETHER_E2E_MULTUS_DIRECT,
# TETHER_E2E_NODE_ONLY.
set -euo pipefail
. "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
export PATH=/run/e2e/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
W=/run/e2e
TEARDOWN_S=150   # the teardown's budget: pods' DEL, kubelet, containerd, copying the logs out
BOOT_S=40        # the VM's boot, before this script started (about 25 s under TCG)
CP=$E2E_DIR/cp
LOGS=$E2E_DIR/logs
mkdir -p "$W/bin" "$W/pids" "$W/logs" "$LOGS"
T0=$(cat "$E2E_DIR/t0" 2>/dev/null || now)   # run.sh's start, on the host's clock
mark() { echo "$1 $(since "$T0")" >>"$E2E_DIR/timings.txt"; e2e_log "$1 at +$(since "$T0") s"; }
ADMIN_PROXY=127.0.0.1:8001
MULTUS_PROXY=127.0.0.1:8002
K() { kubectl -s "http://$ADMIN_PROXY" "$@"; }
CTR() { ctr -n k8s.io "$@"; }

teardown() {
  local rc=$?
  set +e
  e2e_log "teardown (status $rc)"
  # What the API server and the pods' logs say, before the pods go (the kubelet removes their logs).
  if K get --raw /readyz >/dev/null 2>&1; then
    K get events -A -o wide >"$W/logs/events.txt" 2>&1
    K get pods -A -o yaml >"$W/logs/pods.yaml" 2>&1
    K get ipleases.ipam.tether.dev -o yaml --show-managed-fields >"$W/logs/ipleases.yaml" 2>&1
  fi
  [ -d /var/log/pods ] && cp -a /var/log/pods "$W/logs/" 2>/dev/null
  # Graceful first: delete every pod through the API, so the kubelet stops the sandboxes and
  # containerd calls CNI DEL (what frees tether's leases). Their controllers go first, or they
  # would re-create the pods (deploy/tether.yaml has a DaemonSet and a Deployment).
  if ours "$W/pids/kubelet.pid" kubelet >/dev/null && K get --raw /readyz >/dev/null 2>&1; then
    K delete daemonsets,deployments,statefulsets,replicasets,jobs --all -A --wait=false >/dev/null 2>&1
    K delete pods --all -A --grace-period=1 --wait=false >/dev/null 2>&1
    local until=$(( $(date +%s) + 60 ))
    while [ -n "$(K get pods -A -o name 2>/dev/null)" ] && [ "$(date +%s)" -lt "$until" ]; do sleep 1; done
    if [ -n "$(K get pods -A -o name 2>/dev/null)" ]; then
      # A pod whose DEL keeps failing never goes: forced out of the API (the kubelet keeps retrying
      # its sandbox until it is stopped below).
      e2e_log "pods still in the API after 60 s, forcing: $(K get pods -A -o name | tr '\n' ' ')"
      K delete pods --all -A --force --grace-period=0 >/dev/null 2>&1
    fi
    e2e_log "pods deleted"
  fi
  stop_pidfile "$W/pids/kubelet.pid" kubelet 20
  stop_pidfile "$E2E_DIR/node-b/pids/kubelet.pid" kubelet 20   # test-two-nodes.sh's node B
  stop_pidfile "$W/pids/controller.pid" tether   # test-node-gone.sh's
  if ours "$W/pids/containerd.pid" containerd >/dev/null; then
    for t in $(CTR tasks ls -q 2>/dev/null); do CTR tasks kill -s SIGKILL "$t" >/dev/null 2>&1; done
    sleep 1
    for t in $(CTR tasks ls -q 2>/dev/null); do CTR tasks delete -f "$t" >/dev/null 2>&1; done
  fi
  stop_pidfile "$W/pids/containerd.pid" containerd 20
  stop_pidfile "$E2E_DIR/node-b/pids/containerd.pid" containerd 20
  stop_pidfile "$E2E_DIR/node-b/pids/multus-proxy.pid" kubectl
  e2e_log "kubelet and containerd stopped"
  for p in /proc/[0-9]*; do   # shims of our containerd (it does not stop them), by pid
    case $(tr '\0' ' ' <"$p/cmdline" 2>/dev/null) in
      *containerd-shim-runc-v2*) kill -KILL "${p#/proc/}" 2>/dev/null ;;
    esac
  done
  stop_pidfile "$W/pids/multus-proxy.pid" kubectl
  stop_pidfile "$W/pids/admin-proxy.pid" kubectl
  # What the node's services logged, where it outlives the VM.
  cp -a "$W/logs/." "$W/cni-trace.log" "$W/cni-trace" "$LOGS/" 2>/dev/null
  e2e_log "node stopped"
  exit "$rc"
}
trap teardown EXIT

# ---- 0. binaries into RAM ------------------------------------------------------------------
t=$(now)
for b in kubelet kubectl multus helm; do cp "$E2E_DIR/bin/$b" "$W/bin/$b" || e2e_die "no $E2E_DIR/bin/$b"; done
for b in containerd containerd-shim-runc-v2 ctr runc; do cp "$(command -v "$b")" "$W/bin/$b" || e2e_die "no $b"; done
e2e_log "binaries in RAM ($(since "$t") s)"
hostname "$E2E_NODE"   # a node's hostname is its name: tether-ipam falls back to it (NODE_NAME unset under containerd)

# ---- 1. the node's network -----------------------------------------------------------------
modprobe -a virtio_net overlay bridge veth br_netfilter nf_tables iptable_nat 2>/dev/null
ip link set lo up
nic=
for _ in $(seq 1 100); do
  for d in /sys/class/net/*; do
    if [ "$(basename "$(readlink -f "$d/device/driver" 2>/dev/null)")" = virtio_net ]; then nic=$(basename "$d"); break 2; fi
  done
  sleep 0.1
done
[ -n "$nic" ] || e2e_die "no virtio NIC: the VM must boot with TETHER_LAB_FORWARD=$E2E_API_PORT (run.sh does)"
ip addr add 10.0.2.15/24 dev "$nic"
ip link set "$nic" up
ip route add default via 10.0.2.2 dev "$nic"
NODE_IP=10.0.2.15
# kube-proxy's part for the one Service the node needs: `kubernetes` (10.96.0.1:443).
iptables -t nat -A OUTPUT -d 10.96.0.1/32 -p tcp --dport 443 -j DNAT --to-destination "$E2E_GUEST_API_HOST:$E2E_API_PORT" ||
  e2e_die "iptables DNAT for the kubernetes Service failed"
for _ in $(seq 1 60); do
  curl -s --max-time 10 --cacert "$CP/pki/ca.crt" "https://$E2E_GUEST_API_HOST:$E2E_API_PORT/readyz" >/dev/null 2>&1 && break
  sleep 0.5
done
code=$(curl -s -o /dev/null -w '%{http_code}' --max-time 10 --cacert "$CP/pki/ca.crt" https://10.96.0.1/readyz) ||
  e2e_die "the API server is not reachable at 10.96.0.1:443 (DNAT to $E2E_GUEST_API_HOST:$E2E_API_PORT)"
e2e_log "API server reachable at $E2E_GUEST_API_HOST:$E2E_API_PORT and 10.96.0.1:443 (HTTP $code unauthenticated)"
# The management segment: enp5s0 cabled to netns e2e-wire (10.20.30.1, the NAD's gateway).
ip netns add e2e-wire
ip -n e2e-wire link set lo up
ip link add enp5s0 type veth peer name wire0 netns e2e-wire
ip link set enp5s0 up
ip -n e2e-wire link set wire0 up
ip -n e2e-wire addr add 10.20.30.1/24 dev wire0
# The compute network: enp6s0 cabled to netns e2e-compute (192.168.100.1). A third NIC, enp7s0, to
# netns e2e-wire (10.30.0.1) for the master-down check (test-events.sh turns it off and on).
ip netns add e2e-compute
ip link add enp6s0 type veth peer name wire1 netns e2e-compute
ip link add enp7s0 type veth peer name wire7 netns e2e-wire
ip link set enp6s0 up
ip link set enp7s0 up
ip -n e2e-compute link set lo up
ip -n e2e-compute link set wire1 up
ip -n e2e-compute addr add 192.168.100.1/24 dev wire1
ip -n e2e-wire link set wire7 up
ip -n e2e-wire addr add 10.30.0.1/24 dev wire7
mark node-network

# ---- 2. the node's directories, fresh ---------------------------------------------------------
# Mount propagation as systemd leaves it on a real node (runc refuses HostToContainer otherwise).
mount --make-rshared / || e2e_die "mount --make-rshared /"
for d in /opt/cni/bin /etc/cni/net.d /var/lib/cni /var/lib/kubelet /var/lib/containerd /var/log/pods /var/log/containers; do
  mkdir -p "$d" && mount -t tmpfs -o mode=0755 e2e "$d" || e2e_die "tmpfs on $d"
done
for p in bridge host-local loopback macvlan; do cp "/usr/lib/cni/$p" /opt/cni/bin/; done
# Multus under a tracer (cni-trace.sh): every call containerd makes to the node's CNI is logged.
mkdir -p "$W/cni-trace"
install -m 0755 "$E2E_HERE/cni-trace.sh" /opt/cni/bin/multus

# ---- 3. cluster network: Multus (thin) in front of bridge + host-local -------------------------
# containerd loads the first file of /etc/cni/net.d by name (max_conf_num = 1): 00-multus.conf.
# Its delegates[0] is the cluster network (the pod's eth0), as Multus' own entrypoint writes it.
mkdir -p /etc/cni/net.d/multus.d
if [ "${TETHER_E2E_MULTUS_DIRECT:-0}" = 1 ]; then
  cp "$CP/guest-multus.kubeconfig" /etc/cni/net.d/multus.d/multus.kubeconfig
else
  setsid nohup kubectl proxy --kubeconfig "$CP/guest-multus.kubeconfig" --address 127.0.0.1 --port "${MULTUS_PROXY#*:}" \
    --accept-hosts '^127\.0\.0\.1$' >"$W/logs/multus-proxy.log" 2>&1 </dev/null &
  echo $! >"$W/pids/multus-proxy.pid"
  printf 'apiVersion: v1\nkind: Config\nclusters:\n- name: e2e\n  cluster: {server: "http://%s"}\nusers:\n- name: multus\n  user: {}\ncontexts:\n- name: e2e\n  context: {cluster: e2e, user: multus}\ncurrent-context: e2e\n' \
    "$MULTUS_PROXY" >/etc/cni/net.d/multus.d/multus.kubeconfig
fi
chmod 600 /etc/cni/net.d/multus.d/multus.kubeconfig
cat >/etc/cni/net.d/00-multus.conf <<'EOF'
{
  "cniVersion": "0.3.1",
  "name": "multus-cni-network",
  "type": "multus",
  "kubeconfig": "/etc/cni/net.d/multus.d/multus.kubeconfig",
  "logFile": "/run/e2e/logs/multus.log",
  "logLevel": "verbose",
  "delegates": [
    {
      "cniVersion": "0.3.1",
      "name": "cluster",
      "plugins": [
        {
          "type": "bridge",
          "bridge": "cni0",
          "isGateway": true,
          "ipMasq": false,
          "hairpinMode": true,
          "ipam": {
            "type": "host-local",
            "ranges": [[{"subnet": "10.244.0.0/24", "gateway": "10.244.0.1"}]]
          }
        }
      ]
    }
  ]
}
EOF
# Node B's thin Multus starts from this file (node-b.sh): test-thick.sh replaces it on this node.
cp /etc/cni/net.d/00-multus.conf /run/e2e/00-multus.conf
# The test's own way to the API server (admin token), through one kept-alive TLS connection.
setsid nohup kubectl proxy --kubeconfig "$CP/guest-admin.kubeconfig" --address 127.0.0.1 --port "${ADMIN_PROXY#*:}" \
  --accept-hosts '^127\.0\.0\.1$' >"$W/logs/admin-proxy.log" 2>&1 </dev/null &
echo $! >"$W/pids/admin-proxy.pid"

# ---- 4. containerd ----------------------------------------------------------------------------
mkdir -p /run/containerd
cat >"$W/containerd.toml" <<EOF
version = 2
root = "/var/lib/containerd"
state = "/run/containerd"
disabled_plugins = ["io.containerd.internal.v1.opt", "io.containerd.snapshotter.v1.btrfs",
  "io.containerd.snapshotter.v1.zfs", "io.containerd.snapshotter.v1.devmapper",
  "io.containerd.snapshotter.v1.aufs",
  "io.containerd.tracing.processor.v1.otlp", "io.containerd.internal.v1.tracing"]
[grpc]
  address = "/run/containerd/containerd.sock"
[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "localhost/kubelet-lab/pause:3.10.2"
  enable_selinux = false
  disable_apparmor = true
  enable_cdi = false
  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "overlayfs"
    default_runtime_name = "runc"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
        SystemdCgroup = false
        BinaryName = "$W/bin/runc"
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "/opt/cni/bin"
    conf_dir = "/etc/cni/net.d"
    max_conf_num = 1
EOF
t=$(now)
setsid nohup containerd --config "$W/containerd.toml" >"$W/logs/containerd.log" 2>&1 </dev/null &
echo $! >"$W/pids/containerd.pid"
for _ in $(seq 1 240); do
  ctr version >/dev/null 2>&1 && break
  ours "$W/pids/containerd.pid" containerd >/dev/null || { tail -20 "$W/logs/containerd.log" >&2; e2e_die "containerd exited"; }
  sleep 0.5
done
ctr version >/dev/null 2>&1 || e2e_die "containerd not ready"
mark containerd-ready
# Before the kubelet: the agent's image (IfNotPresent, nothing can be pulled) must be there when
# the DaemonSet's pod is first synced.
imgs=("$E2E_DIR/images/pause.tar" "$E2E_DIR/images/busybox.tar" "$E2E_DIR/images/multus-thick.tar")
# tether's own image is not among them: the README's quick start imports the release's (install.sh).
[ "${TETHER_E2E_NODE_ONLY:-0}" = 1 ] || imgs+=("$E2E_DIR/images/tether-next.tar" "$E2E_DIR/previous/tether-image.tar")
for i in "${imgs[@]}"; do
  CTR images import "$i" >/dev/null || e2e_die "ctr images import $i failed"
done
# deploy/recipes name busybox:1.35 as users pull it; this busybox is Debian's 1.35, tagged so.
CTR images tag localhost/kubelet-lab/busybox:1.35 docker.io/library/busybox:1.35 >/dev/null ||
  e2e_die "ctr images tag busybox"
CTR images ls -q >"$W/images.txt"
e2e_log "images: $(tr '\n' ' ' <"$W/images.txt")"
mark images-imported

# ---- 5. kubelet -------------------------------------------------------------------------------
# cgroup v2: the controllers the kubelet and runc use, delegated from the root.
echo "+cpuset +cpu +io +memory +hugetlb +pids" >/sys/fs/cgroup/cgroup.subtree_control || e2e_die "cgroup controllers"
printf 'nameserver 127.0.0.1\noptions ndots:1\n' >"$W/resolv.conf"   # no DNS in this cluster
cat >"$W/kubelet-config.yaml" <<EOF
apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
failSwapOn: false
cgroupDriver: cgroupfs
cgroupsPerQOS: true
containerRuntimeEndpoint: unix:///run/containerd/containerd.sock
address: $NODE_IP
readOnlyPort: 0
healthzBindAddress: 127.0.0.1
authentication:
  anonymous: {enabled: false}
  webhook: {enabled: true}
  x509: {clientCAFile: $CP/pki/ca.crt}
authorization: {mode: Webhook}
resolvConf: $W/resolv.conf
clusterDomain: cluster.local
makeIPTablesUtilChains: false
protectKernelDefaults: false
serializeImagePulls: false
# The node's disks are RAM here: thresholds low enough that nothing is evicted for it.
evictionHard: {memory.available: 50Mi, nodefs.available: 1%, imagefs.available: 1%, nodefs.inodesFree: 1%}
imageGCHighThresholdPercent: 99
imageGCLowThresholdPercent: 98
maxPods: 110
EOF
setsid nohup kubelet --config="$W/kubelet-config.yaml" --kubeconfig="$CP/kubelet.kubeconfig" \
  --node-ip="$NODE_IP" --v=2 >"$W/logs/kubelet.log" 2>&1 </dev/null &
echo $! >"$W/pids/kubelet.pid"
TK=$(now)
mark kubelet-started
deadline=$(( $(date +%s) + ${TETHER_E2E_NODE_TIMEOUT:-420} ))
until [ "$(K get node "$E2E_NODE" -o jsonpath='{.status.conditions[?(@.type=="Ready")].status}' 2>/dev/null)" = True ]; do
  for n in kubelet containerd; do
    ours "$W/pids/$n.pid" "$n" >/dev/null || { tail -30 "$W/logs/$n.log" >&2; e2e_die "$n exited"; }
  done
  [ "$(date +%s)" -lt "$deadline" ] || { tail -30 "$W/logs/kubelet.log" >&2; e2e_die "node $E2E_NODE not Ready in time"; }
  sleep 1
done
mark node-ready
echo "kubelet-start-to-node-ready $(since "$TK")" >>"$E2E_DIR/timings.txt"
e2e_log "node $E2E_NODE Ready $(since "$TK") s after the kubelet started"

# ---- 6. the test -------------------------------------------------------------------------------
# TETHER_E2E_NODE_ONLY=1 (for working on the harness): stop here, with the node Ready.
# The checks get what is left of the VM's time less TEARDOWN_S for the teardown (the VM is killed
# at TETHER_LAB_TIMEOUT, and the logs are copied out only by the teardown).
left=$(( ${TETHER_LAB_TIMEOUT:-600} - TEARDOWN_S - ${SECONDS} - BOOT_S ))
[ "$left" -gt 30 ] || e2e_die "no time left for the checks (${left} s; raise TETHER_E2E_TIMEOUT)"
# Every exec of a tether plugin from now on, in the kernel's words (lib.sh): what the agent's
# count of CNI calls is held against.
exec_trace_start || e2e_die "cannot trace the plugins' execs (tracefs, sched_process_exec)"
# The scripts, in order (TETHER_E2E_CHECKS; `make bench-node`: install.sh bench-node.sh).
checks=${TETHER_E2E_CHECKS:-install.sh test-docs.sh test.sh test-events.sh test-thick.sh test-release.sh test-two-nodes.sh test-node-gone.sh}
# Each script's line in checks.txt (run.sh's summary): its name, the nodes in the cluster when it
# ended (node B once test-two-nodes.sh brought it up), its seconds, its exit status, and how many
# PASS lines it wrote.
run_checks() {
  local c t n rc nodes
  for c in "$@"; do
    t=$(date +%s); n=$(grep -c '^PASS' "$E2E_DIR/results.txt" 2>/dev/null || true)
    rc=0; bash "$E2E_HERE/$c" || rc=$?
    nodes=$E2E_NODE; [ ! -s "$E2E_DIR/node-b/pids/kubelet.pid" ] || nodes+=,$E2E_NODE_B
    echo "$c $nodes $(( $(date +%s) - t )) $rc $(( $(grep -c '^PASS' "$E2E_DIR/results.txt" 2>/dev/null || true) - ${n:-0} ))" >>"$E2E_DIR/checks.txt"
    [ "$rc" = 0 ] || return "$rc"
  done
}
export -f run_checks
[ "${TETHER_E2E_NODE_ONLY:-0}" = 1 ] ||
  timeout -k 5 "$left" bash -c '. "$1/lib.sh"; shift; run_checks "$@"' checks "$E2E_HERE" $checks ||
  { rc=$?; [ $rc != 124 ] || e2e_log "the checks did not finish in $left s"; exit $rc; }
