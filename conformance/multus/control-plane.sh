#!/usr/bin/env bash
# etcd + kube-apiserver for the Multus lab node, inside its netns (called by up.sh through
# `ip netns exec`). The same servers, flags, PKI layout, token and kubeconfig as
# ../shared/peers/k8s-up.sh (whose layout down.sh's k8s-down.sh expects: <dir>/{etcd,
# kube-apiserver}.pid, pki/, kubeconfig), with two differences that matter under qemu TCG on a busy
# machine: ECDSA keys instead of RSA (below), and this one: kube-apiserver's post-start
# hook rbac/bootstrap-roles gives up after 30 s and the server exits ("unable to initialize
# roles"). k8s-up.sh then stops everything; here etcd keeps running and kube-apiserver is started
# again on the same data, where the roles created so far already exist (up to 4 attempts).
#
#   control-plane.sh DIR API_PORT ETCD_PORT ETCD_PEER_PORT BIN_DIR READY_TIMEOUT LOG_DIR
#
# TETHER_MULTUS_API_SAN: more subjectAltNames for the serving certificate (host-api.sh: IP:10.0.2.100).
set -euo pipefail
DIR=$1 API_PORT=$2 ETCD_PORT=$3 ETCD_PEER_PORT=$4 BIN=$5 READY_TIMEOUT=$6 LOGS=$7
TOKEN=peers-admin-token
ATTEMPTS=4
log() { echo "control-plane: $(date +%T) $*" >&2; }

. "$(dirname "${BASH_SOURCE[0]}")/pids.sh"
alive() { ours "$@" >/dev/null; } # PIDFILE WORD

mkdir -p "$DIR/pki" "$DIR/etcd"
chmod 700 "$DIR/etcd"
PKI=$DIR/pki
# ECDSA P-256 keys where k8s-up.sh makes RSA 2048 ones: RSA key generation alone takes over a
# minute under TCG. kube-apiserver serves and signs service-account tokens (ES256) with them alike.
openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -days 365 -sha256 \
  -subj "/CN=peers-k8s-ca" -keyout "$PKI/ca.key" -out "$PKI/ca.crt" \
  -addext "basicConstraints=critical,CA:TRUE" -addext "keyUsage=critical,keyCertSign,cRLSign" 2>/dev/null
openssl req -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -sha256 -subj "/CN=kube-apiserver" \
  -keyout "$PKI/apiserver.key" -out "$PKI/apiserver.csr" 2>/dev/null
cat >"$PKI/apiserver.ext" <<EOF
basicConstraints=CA:FALSE
keyUsage=critical,digitalSignature,keyEncipherment
extendedKeyUsage=serverAuth
subjectAltName=IP:127.0.0.1,IP:10.96.0.1,DNS:localhost,DNS:kubernetes,DNS:kubernetes.default,DNS:kubernetes.default.svc,DNS:kubernetes.default.svc.cluster.local${TETHER_MULTUS_API_SAN:+,$TETHER_MULTUS_API_SAN}
EOF
openssl x509 -req -in "$PKI/apiserver.csr" -CA "$PKI/ca.crt" -CAkey "$PKI/ca.key" -CAcreateserial \
  -days 365 -sha256 -extfile "$PKI/apiserver.ext" -out "$PKI/apiserver.crt" 2>/dev/null
openssl ecparam -name prime256v1 -genkey -noout -out "$PKI/sa.key" 2>/dev/null
openssl ec -in "$PKI/sa.key" -pubout -out "$PKI/sa.pub" 2>/dev/null
echo "$TOKEN,admin,peers-admin,\"system:masters\"" >"$PKI/tokens.csv"
chmod 600 "$PKI"/*.key "$PKI/tokens.csv"
log "PKI ready"

setsid nohup "$BIN/etcd" \
  --name peers-k8s --data-dir "$DIR/etcd" \
  --listen-client-urls "http://127.0.0.1:$ETCD_PORT" --advertise-client-urls "http://127.0.0.1:$ETCD_PORT" \
  --listen-peer-urls "http://127.0.0.1:$ETCD_PEER_PORT" --initial-advertise-peer-urls "http://127.0.0.1:$ETCD_PEER_PORT" \
  --initial-cluster "peers-k8s=http://127.0.0.1:$ETCD_PEER_PORT" --initial-cluster-state new \
  --logger=zap >"$LOGS/etcd.log" 2>&1 </dev/null &
echo $! >"$DIR/etcd.pid"
ok=0
for _ in $(seq 1 240); do
  if curl -fsS --max-time 5 "http://127.0.0.1:$ETCD_PORT/health" 2>/dev/null | grep -q '"health":"true"'; then ok=1; break; fi
  alive "$DIR/etcd.pid" etcd || break
  sleep 0.5
done
[ $ok = 1 ] || { log "etcd did not become healthy"; tail -20 "$LOGS/etcd.log" >&2; exit 1; }
log "etcd healthy (pid $(cat "$DIR/etcd.pid"))"

ready() {
  [ "$(curl -sS --max-time 10 --cacert "$PKI/ca.crt" -H "Authorization: Bearer $TOKEN" \
         "https://127.0.0.1:$API_PORT/readyz" 2>/dev/null)" = ok ]
}
deadline=$(( $(date +%s) + READY_TIMEOUT ))
for attempt in $(seq 1 $ATTEMPTS); do
  # ServiceAccount admission off (no controller-manager creates "default" SAs); loopback advertise
  # address, so no endpoint reconciler (k8s-up.sh's reasons).
  setsid nohup "$BIN/kube-apiserver" \
    --bind-address=127.0.0.1 --advertise-address=127.0.0.1 --secure-port="$API_PORT" \
    --cert-dir="$PKI" --tls-cert-file="$PKI/apiserver.crt" --tls-private-key-file="$PKI/apiserver.key" \
    --client-ca-file="$PKI/ca.crt" --token-auth-file="$PKI/tokens.csv" --authorization-mode=RBAC \
    --etcd-servers="http://127.0.0.1:$ETCD_PORT" --service-cluster-ip-range=10.96.0.0/16 \
    --service-account-issuer=https://kubernetes.default.svc.cluster.local \
    --service-account-key-file="$PKI/sa.pub" --service-account-signing-key-file="$PKI/sa.key" \
    --disable-admission-plugins=ServiceAccount --endpoint-reconciler-type=none \
    --allow-privileged=true --profiling=false >>"$LOGS/apiserver.log" 2>&1 </dev/null &
  echo $! >"$DIR/kube-apiserver.pid"
  log "kube-apiserver pid $(cat "$DIR/kube-apiserver.pid") (attempt $attempt)"
  while [ "$(date +%s)" -lt "$deadline" ]; do
    if ready; then break 2; fi
    alive "$DIR/kube-apiserver.pid" kube-apiserver || break
    sleep 1
  done
  if alive "$DIR/kube-apiserver.pid" kube-apiserver; then
    log "kube-apiserver not ready within ${READY_TIMEOUT}s"; tail -30 "$LOGS/apiserver.log" >&2; exit 1
  fi
  log "kube-apiserver exited during startup: $(grep -E '^F[0-9]' "$LOGS/apiserver.log" | tail -n 1)"
  [ "$(date +%s)" -lt "$deadline" ] || { log "out of time"; exit 1; }
done
ready || { log "kube-apiserver did not start in $ATTEMPTS attempts"; tail -30 "$LOGS/apiserver.log" >&2; exit 1; }

cat >"$DIR/kubeconfig" <<EOF
apiVersion: v1
kind: Config
clusters:
- name: peers-k8s
  cluster:
    server: https://127.0.0.1:$API_PORT
    certificate-authority-data: $(base64 -w0 <"$PKI/ca.crt")
users:
- name: admin
  user:
    token: $TOKEN
contexts:
- name: peers-k8s
  context:
    cluster: peers-k8s
    user: admin
    namespace: default
current-context: peers-k8s
EOF
log "ready"
