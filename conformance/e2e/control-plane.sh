#!/usr/bin/env bash
# The e2e cluster's control plane, on the HOST at native speed: etcd, kube-apiserver,
# kube-controller-manager, kube-scheduler (v1.36 from PEERS_BIN_DIR, built by .ci/deps.sh; etcd
# from Debian). The node (containerd + kubelet) runs in the lab VM and reaches the API server
# through the VM's one forwarded port: 10.0.2.100:$E2E_API_PORT in the guest is 127.0.0.1 here.
#
#   conformance/e2e/control-plane.sh up     # $E2E_DIR/cp: pki/, *.kubeconfig, *.pid, logs/
#   conformance/e2e/control-plane.sh down   # stops exactly the pids in $E2E_DIR/cp/*.pid
#
# Adapted from ../shared/peers/kubelet-lab/{k8s-up.sh,up.sh} (Node+RBAC authorization,
# ServiceAccount + NodeRestriction admission, controller-manager with per-controller service
# accounts, scheduler), with these differences:
#   - ECDSA P-256 keys (RSA generation is slow; the API server signs SA tokens with ES256 alike);
#   - the serving certificate is also valid for 10.0.2.100 (the VM's way to it) and 10.96.0.1 (the
#     `kubernetes` Service, which the VM's stand-in for kube-proxy DNATs to 10.0.2.100);
#   - the kubelet's kubeconfig points at https://10.0.2.100:PORT; its client cert is issued here;
#   - no --kubelet-client-certificate: the API server cannot reach the kubelet (qemu's user
#     networking with restrict=on lets the guest connect out to one address and nothing in), so
#     `kubectl exec/logs/port-forward` do not work in this cluster at all.
# After the API server is ready: the NetworkAttachmentDefinition CRD (../shared/peers/nad-crd.yaml),
# the ServiceAccount kube-system/multus with upstream Multus' ClusterRole and a token for it.
# tether itself (CRD, RBAC, DaemonSet) is NOT installed here: the test applies deploy/tether.yaml.
set -euo pipefail
. "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
CP=$E2E_DIR/cp
PKI=$E2E_PKI
KUBECTL=${KUBECTL:-$PEERS_BIN_DIR/kubectl}
NICE=${NICE:-nice -n 5}
READY_TIMEOUT=${TETHER_E2E_API_TIMEOUT:-120}

down() {
  local n
  for n in kube-scheduler kube-controller-manager kube-apiserver etcd; do
    stop_pidfile "$CP/$n.pid" "$n"
  done
  e2e_log "control plane stopped"
}

K() { "$KUBECTL" --kubeconfig "$CP/admin.kubeconfig" "$@"; }

up() {
  [ -x "$PEERS_BIN_DIR/kube-apiserver" ] || e2e_die "no $PEERS_BIN_DIR/kube-apiserver (PEERS_BIN_DIR; .ci/deps.sh builds it)"
  [ -x /usr/bin/etcd ] || e2e_die "no /usr/bin/etcd (apt-get install etcd-server)"
  local p
  for p in "$E2E_API_PORT" "$E2E_ETCD_PORT" "$E2E_ETCD_PEER_PORT" "$E2E_KCM_PORT" "$E2E_SCHED_PORT"; do
    if ss -Hltn "sport = :$p" | grep -q .; then e2e_die "port $p is in use (TETHER_E2E_*_PORT)"; fi
  done
  rm -rf "$CP" && mkdir -p "$PKI" "$CP/etcd" "$CP/logs"
  chmod 700 "$CP/etcd"
  local t0; t0=$(now)

  # ---- PKI ----
  openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -days 30 -sha256 \
    -subj "/CN=tether-e2e-ca" -keyout "$PKI/ca.key" -out "$PKI/ca.crt" \
    -addext "basicConstraints=critical,CA:TRUE" -addext "keyUsage=critical,keyCertSign,cRLSign" 2>/dev/null
  issue apiserver "/CN=kube-apiserver" "extendedKeyUsage=serverAuth" \
    "subjectAltName=IP:127.0.0.1,IP:$E2E_GUEST_API_HOST,IP:10.96.0.1,DNS:localhost,DNS:kubernetes,DNS:kubernetes.default,DNS:kubernetes.default.svc,DNS:kubernetes.default.svc.cluster.local"
  issue kubelet "/O=system:nodes/CN=system:node:$E2E_NODE" "extendedKeyUsage=clientAuth"
  issue kube-controller-manager "/CN=system:kube-controller-manager" "extendedKeyUsage=clientAuth"
  issue kube-scheduler "/CN=system:kube-scheduler" "extendedKeyUsage=clientAuth"
  openssl ecparam -name prime256v1 -genkey -noout -out "$PKI/sa.key" 2>/dev/null
  openssl ec -in "$PKI/sa.key" -pubout -out "$PKI/sa.pub" 2>/dev/null
  echo "$E2E_TOKEN,admin,e2e-admin,\"system:masters\"" >"$PKI/tokens.csv"
  chmod 600 "$PKI"/*.key "$PKI/tokens.csv"
  kubeconfig admin "https://127.0.0.1:$E2E_API_PORT" "token: $E2E_TOKEN" >"$CP/admin.kubeconfig"
  kubeconfig admin "https://$E2E_GUEST_API_HOST:$E2E_API_PORT" "token: $E2E_TOKEN" >"$CP/guest-admin.kubeconfig"
  certkubeconfig kubelet "https://$E2E_GUEST_API_HOST:$E2E_API_PORT" >"$CP/kubelet.kubeconfig"
  for n in kube-controller-manager kube-scheduler; do
    certkubeconfig "$n" "https://127.0.0.1:$E2E_API_PORT" >"$CP/$n.kubeconfig"
  done
  chmod 600 "$CP"/*.kubeconfig

  # ---- etcd ----
  setsid nohup $NICE /usr/bin/etcd --name e2e --data-dir "$CP/etcd" \
    --listen-client-urls "http://127.0.0.1:$E2E_ETCD_PORT" --advertise-client-urls "http://127.0.0.1:$E2E_ETCD_PORT" \
    --listen-peer-urls "http://127.0.0.1:$E2E_ETCD_PEER_PORT" --initial-advertise-peer-urls "http://127.0.0.1:$E2E_ETCD_PEER_PORT" \
    --initial-cluster "e2e=http://127.0.0.1:$E2E_ETCD_PEER_PORT" --initial-cluster-state new \
    --logger=zap >"$CP/logs/etcd.log" 2>&1 </dev/null &
  echo $! >"$CP/etcd.pid"
  local ok=0
  for _ in $(seq 1 120); do
    if curl -fsS --max-time 2 "http://127.0.0.1:$E2E_ETCD_PORT/health" 2>/dev/null | grep -q '"health":"true"'; then ok=1; break; fi
    alive "$CP/etcd.pid" || break
    sleep 0.5
  done
  [ $ok = 1 ] || { tail -20 "$CP/logs/etcd.log" >&2; e2e_die "etcd did not become healthy"; }

  # ---- kube-apiserver ----
  # --endpoint-reconciler-type=none: the advertise address is loopback, which the API server
  # refuses to put into the default/kubernetes Endpoints. The `kubernetes` Service still gets
  # 10.96.0.1:443, which the kubelet passes to every pod as KUBERNETES_SERVICE_HOST/PORT.
  setsid nohup $NICE "$PEERS_BIN_DIR/kube-apiserver" \
    --bind-address=127.0.0.1 --advertise-address=127.0.0.1 --secure-port="$E2E_API_PORT" \
    --cert-dir="$PKI" --tls-cert-file="$PKI/apiserver.crt" --tls-private-key-file="$PKI/apiserver.key" \
    --client-ca-file="$PKI/ca.crt" --token-auth-file="$PKI/tokens.csv" \
    --authorization-mode=Node,RBAC --enable-admission-plugins=NodeRestriction \
    --kubelet-preferred-address-types=InternalIP \
    --etcd-servers="http://127.0.0.1:$E2E_ETCD_PORT" --service-cluster-ip-range=10.96.0.0/16 \
    --service-account-issuer=https://kubernetes.default.svc.cluster.local \
    --service-account-key-file="$PKI/sa.pub" --service-account-signing-key-file="$PKI/sa.key" \
    --endpoint-reconciler-type=none --allow-privileged=true --profiling=false \
    >"$CP/logs/kube-apiserver.log" 2>&1 </dev/null &
  echo $! >"$CP/kube-apiserver.pid"
  ok=0
  local deadline=$(( $(date +%s) + READY_TIMEOUT ))
  while [ "$(date +%s)" -lt "$deadline" ]; do
    if [ "$(curl -sS --max-time 3 --cacert "$PKI/ca.crt" -H "Authorization: Bearer $E2E_TOKEN" \
            "https://127.0.0.1:$E2E_API_PORT/readyz" 2>/dev/null)" = ok ]; then ok=1; break; fi
    alive "$CP/kube-apiserver.pid" || break
    sleep 0.5
  done
  [ $ok = 1 ] || { tail -30 "$CP/logs/kube-apiserver.log" >&2; e2e_die "kube-apiserver not ready in ${READY_TIMEOUT}s"; }
  e2e_log "kube-apiserver ready on 127.0.0.1:$E2E_API_PORT in $(since "$t0") s"

  # ---- kube-controller-manager + kube-scheduler ----
  setsid nohup $NICE "$PEERS_BIN_DIR/kube-controller-manager" \
    --kubeconfig="$CP/kube-controller-manager.kubeconfig" \
    --authentication-kubeconfig="$CP/kube-controller-manager.kubeconfig" \
    --authorization-kubeconfig="$CP/kube-controller-manager.kubeconfig" \
    --bind-address=127.0.0.1 --secure-port="$E2E_KCM_PORT" --leader-elect=false \
    --use-service-account-credentials=true --service-account-private-key-file="$PKI/sa.key" \
    --root-ca-file="$PKI/ca.crt" --cluster-signing-cert-file="$PKI/ca.crt" --cluster-signing-key-file="$PKI/ca.key" \
    --cluster-name=tether-e2e --allocate-node-cidrs=false --service-cluster-ip-range=10.96.0.0/16 \
    --flex-volume-plugin-dir="$CP/volume-plugins" --profiling=false --v=1 \
    >"$CP/logs/kube-controller-manager.log" 2>&1 </dev/null &
  echo $! >"$CP/kube-controller-manager.pid"
  setsid nohup $NICE "$PEERS_BIN_DIR/kube-scheduler" \
    --kubeconfig="$CP/kube-scheduler.kubeconfig" \
    --authentication-kubeconfig="$CP/kube-scheduler.kubeconfig" \
    --authorization-kubeconfig="$CP/kube-scheduler.kubeconfig" \
    --bind-address=127.0.0.1 --secure-port="$E2E_SCHED_PORT" --leader-elect=false --profiling=false --v=1 \
    >"$CP/logs/kube-scheduler.log" 2>&1 </dev/null &
  echo $! >"$CP/kube-scheduler.pid"

  # ---- what a cluster with Multus has before tether is installed ----
  local nad_crd=$PEERS/nad-crd.yaml
  [ -f "$nad_crd" ] || e2e_die "no $nad_crd (TETHER_PEERS)"
  K apply -f "$nad_crd" >/dev/null
  K apply -f - >/dev/null <<'EOF'
apiVersion: v1
kind: ServiceAccount
metadata: {name: multus, namespace: kube-system}
---
# Upstream Multus' ClusterRole (deployments/multus-daemonset-thick.yml, v4.3.0).
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRole
metadata: {name: multus}
rules:
- {apiGroups: ["k8s.cni.cncf.io"], resources: ["*"], verbs: ["*"]}
- {apiGroups: [""], resources: ["pods", "pods/status"], verbs: ["get", "list", "update", "watch"]}
- {apiGroups: ["", "events.k8s.io"], resources: ["events"], verbs: ["create", "patch", "update"]}
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRoleBinding
metadata: {name: multus}
roleRef: {apiGroup: rbac.authorization.k8s.io, kind: ClusterRole, name: multus}
subjects: [{kind: ServiceAccount, name: multus, namespace: kube-system}]
EOF
  K wait --for condition=established --timeout=60s crd/network-attachment-definitions.k8s.cni.cncf.io >/dev/null
  # What the thin plugin's kubeconfig carries on a node (Multus' DaemonSet writes one from its SA).
  kubeconfig multus "https://$E2E_GUEST_API_HOST:$E2E_API_PORT" \
    "token: $(K -n kube-system create token multus --duration=2h)" >"$CP/guest-multus.kubeconfig"
  chmod 600 "$CP/guest-multus.kubeconfig"
  for p in "https://127.0.0.1:$E2E_KCM_PORT/healthz" "https://127.0.0.1:$E2E_SCHED_PORT/healthz"; do
    until [ "$(curl -sk --max-time 3 "$p")" = ok ]; do
      [ "$(date +%s)" -lt "$deadline" ] || e2e_die "$p not ok"
      ours "$CP/kube-controller-manager.pid" kube-controller-manager >/dev/null || e2e_die "kube-controller-manager exited: $(tail -3 "$CP/logs/kube-controller-manager.log")"
      ours "$CP/kube-scheduler.pid" kube-scheduler >/dev/null || e2e_die "kube-scheduler exited: $(tail -3 "$CP/logs/kube-scheduler.log")"
      sleep 0.5
    done
  done
  e2e_log "control plane up in $(since "$t0") s (API 127.0.0.1:$E2E_API_PORT, etcd $E2E_ETCD_PORT/$E2E_ETCD_PEER_PORT, kcm $E2E_KCM_PORT, scheduler $E2E_SCHED_PORT)"
}

case ${1:-} in
  up) up ;;
  down) down ;;
  *) echo "usage: $0 up|down" >&2; exit 2 ;;
esac
