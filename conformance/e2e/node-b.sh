#!/usr/bin/env bash
# Node B, the second node of test-two-nodes.sh, INSIDE the lab VM beside node.sh's node (A): one
# kernel, two nodes, each with its own kubelet (v1.36), containerd, Multus thin and tether agent.
#
#   - Network namespace `nodeb`: node IP 10.0.3.2 on a veth to the VM's root namespace, masqueraded
#     there to the VM's own way to the API server; its stand-in for kube-proxy DNATs 10.96.0.1:443
#     like node A's. Its NICs enp5s0 and enp6s0 are cabled to the same segments as node A's: the
#     veths of both nodes are ports of a bridge in netns e2e-wire (br-mgmt, 10.20.30.1, the
#     gateway) and e2e-compute (br-compute, 192.168.100.1). One wire, two hosts' NICs on it.
#   - Mount namespace of its own (kubelet, containerd, their shims and pods): fresh tmpfs on the
#     paths a node keeps to itself (/opt/cni/bin, /etc/cni/net.d, /var/lib/{cni,kubelet,
#     containerd}, /var/log/{pods,containers}, /run/containerd, /run/tether, /run/netns), so
#     tether's DaemonSet installs its plugins and keeps its journal and socket apart from A's.
#   - cgroup root /nodeb for its kubelet (A's is /).
#   - Its own credential: a client certificate for system:node:e2e-node-b from the e2e CA.
# Leaves B Ready with tether's agent Ready on it. Config, logs, pids: $E2E_DIR/node-b/ (shared
# with the host, so they outlive the VM); node.sh's teardown stops B's kubelet and containerd.
set -euo pipefail
. "$(dirname "${BASH_SOURCE[0]}")/checks.sh"
B=$E2E_NODE_B
BD=$E2E_DIR/node-b
CP=$E2E_DIR/cp
mkdir -p "$BD/logs" "$BD/pids"
tb=$(now)

# ---- the wire: node A's veths become ports of a bridge, node B's join it --------------------
bridge_in() { # NETNS BRIDGE PORT ADDRESS: move ADDRESS from PORT to a new BRIDGE with PORT in it
  ip -n "$1" link add "$2" type bridge
  ip -n "$1" link set "$2" up
  ip -n "$1" addr del "$4" dev "$3"
  ip -n "$1" link set "$3" master "$2"
  ip -n "$1" addr add "$4" dev "$2"
}
bridge_in e2e-wire br-mgmt wire0 10.20.30.1/24
bridge_in e2e-compute br-compute wire1 192.168.100.1/24
ip netns add nodeb
ip -n nodeb link set lo up
ip link add enp5s0b type veth peer name wireb0 netns e2e-wire
ip link set enp5s0b netns nodeb
ip -n nodeb link set enp5s0b name enp5s0
ip -n e2e-wire link set wireb0 master br-mgmt up
ip link add enp6s0b type veth peer name wireb1 netns e2e-compute
ip link set enp6s0b netns nodeb
ip -n nodeb link set enp6s0b name enp6s0
ip -n e2e-compute link set wireb1 master br-compute up
ip -n nodeb link set enp5s0 up
ip -n nodeb link set enp6s0 up
# Its way to the API server: a veth to the VM's root namespace, masqueraded to the VM's address.
ip link add nodeb0 type veth peer name eth0 netns nodeb
ip addr add 10.0.3.1/24 dev nodeb0
ip link set nodeb0 up
ip -n nodeb addr add 10.0.3.2/24 dev eth0
ip -n nodeb link set eth0 up
ip -n nodeb route add default via 10.0.3.1
sysctl -qw net.ipv4.ip_forward=1
iptables -t nat -A POSTROUTING -s 10.0.3.0/24 ! -d 10.0.3.0/24 -j MASQUERADE
ip netns exec nodeb iptables -t nat -A OUTPUT -d 10.96.0.1/32 -p tcp --dport 443 -j DNAT --to-destination "$E2E_GUEST_API_HOST:$E2E_API_PORT"
ip netns exec nodeb curl -s --max-time 10 -o /dev/null --cacert "$E2E_PKI/ca.crt" https://10.96.0.1/readyz ||
  fail "node B cannot reach the API server"

# ---- its credential ---------------------------------------------------------------------------
issue kubelet-b "/O=system:nodes/CN=system:node:$B" "extendedKeyUsage=clientAuth"
certkubeconfig kubelet-b "https://$E2E_GUEST_API_HOST:$E2E_API_PORT" >"$BD/kubelet.kubeconfig"

# ---- its filesystem view, containerd and kubelet, inside its namespaces -----------------------
mkdir -p /sys/fs/cgroup/nodeb
echo "+cpuset +cpu +io +memory +hugetlb +pids" >/sys/fs/cgroup/nodeb/cgroup.subtree_control
# A's files, but B's node IP and cgroup root (the paths are B's own in its mount namespace).
cp /run/e2e/containerd.toml "$BD/containerd.toml"
sed -e "s|^address: .*|address: 10.0.3.2|" -e "s|^resolvConf: .*|resolvConf: /run/e2e/resolv.conf\ncgroupRoot: /nodeb|" \
  /run/e2e/kubelet-config.yaml >"$BD/kubelet-config.yaml"
cat >"$BD/inside.sh" <<EOF
set -eux
mount --make-rslave /
# ip netns exec mounted a sysfs of this netns, without the cgroup2 tree under it.
mount -t cgroup2 none /sys/fs/cgroup
for d in /opt/cni/bin /etc/cni/net.d /var/lib/cni /var/lib/kubelet /var/lib/containerd /var/log/pods /var/log/containers /run/containerd /run/tether /var/run/netns; do
  mkdir -p "\$d" && mount -t tmpfs -o mode=0755 nodeb "\$d"
done
mount --make-rshared /
for p in bridge host-local loopback macvlan; do cp "/usr/lib/cni/\$p" /opt/cni/bin/; done
cp /run/e2e/bin/multus /opt/cni/bin/multus
mkdir -p /etc/cni/net.d/multus.d
printf 'apiVersion: v1\nkind: Config\nclusters:\n- name: e2e\n  cluster: {server: "http://127.0.0.1:8002"}\nusers:\n- name: multus\n  user: {}\ncontexts:\n- name: e2e\n  context: {cluster: e2e, user: multus}\ncurrent-context: e2e\n' >/etc/cni/net.d/multus.d/multus.kubeconfig
sed -e 's|10.244.0.0/24|10.244.1.0/24|; s|10.244.0.1|10.244.1.1|; s|/run/e2e/logs/multus.log|$BD/logs/multus.log|' /run/e2e/00-multus.conf >/etc/cni/net.d/00-multus.conf
setsid nohup kubectl proxy --kubeconfig "$CP/guest-multus.kubeconfig" --address 127.0.0.1 --port 8002 --accept-hosts '^127\.0\.0\.1\$' >"$BD/logs/multus-proxy.log" 2>&1 </dev/null &
echo \$! >"$BD/pids/multus-proxy.pid"
setsid nohup containerd --config "$BD/containerd.toml" >"$BD/logs/containerd.log" 2>&1 </dev/null &
echo \$! >"$BD/pids/containerd.pid"
for _ in \$(seq 1 240); do ctr version >/dev/null 2>&1 && break; sleep 0.5; done
for i in "$E2E_DIR/images/pause.tar" "$E2E_DIR/images/busybox.tar" /run/e2e/quick-start/tether-*-image.oci.tar; do
  ctr -n k8s.io images import "\$i" >/dev/null
done
ctr -n k8s.io images tag localhost/kubelet-lab/busybox:1.35 docker.io/library/busybox:1.35 >/dev/null
setsid nohup kubelet --config="$BD/kubelet-config.yaml" --kubeconfig="$BD/kubelet.kubeconfig" --hostname-override=$B \
  --node-ip=10.0.3.2 --v=2 >"$BD/logs/kubelet.log" 2>&1 </dev/null &
echo \$! >"$BD/pids/kubelet.pid"
# The namespaces live as long as their processes; this shell waits with them.
wait
EOF
[ -s /run/e2e/00-multus.conf ] || fail "no /run/e2e/00-multus.conf (node.sh keeps the thin one for node B)"
setsid nohup ip netns exec nodeb unshare -m --propagation unchanged bash "$BD/inside.sh" >"$BD/logs/inside.log" 2>&1 </dev/null &
echo $! >"$BD/pids/inside.pid"
b_ready() { [ "$(GET "/api/v1/nodes/$B" | jq -r '.status.conditions[]? | select(.type == "Ready") | .status')" = True ]; }
wait_for 150 b_ready || { tail -n 30 "$BD/logs/inside.log" "$BD/logs/kubelet.log" "$BD/logs/containerd.log" >&2 || true; fail "node $B not Ready in 150 s"; }
pass "node $B Ready $(since "$tb") s after its start (network, credential, containerd, images, kubelet)"
wait_for 300 agent_ready "$B" || { tail -n 30 "$BD/logs/kubelet.log" >&2 || true; fail "tether's agent not Ready on $B"; }
pass "tether's agent Ready on $B $(since "$tb") s after its start"
