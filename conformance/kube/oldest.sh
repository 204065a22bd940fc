#!/usr/bin/env bash
# The API-server suites against the oldest Kubernetes tether claims (docs/compatibility.md):
# kube-apiserver and kubectl v1.30, which conformance/peers/build.sh builds beside the newest as
# kube-apiserver-1.30 and kubectl-1.30. The server is one of its own (up.sh with another
# kube-apiserver, directory and ports), never the newest one that `make unit` and `make kube-up` use.
#
#   conformance/kube/oldest.sh            # start it, run the checks below, stop it
#   conformance/kube/oldest.sh --up       # start it only; prints its kubeconfig (for tests by hand)
#   conformance/kube/oldest.sh --down     # stop it
#
# The checks, in this order (a failure fails the run; after the first, the rest still run):
#   1. the server is v1.30 (the knob that chose its binary was not ignored), else nothing runs;
#   2. deploy/validate.py with kubectl 1.30: every manifest dry-run by this server;
#   3. what degrades there, as docs/compatibility.md says: the CRD's selectableFields are dropped
#      and a field selector on IPLeases is refused;
#   4. the suites below (`--include-ignored`: their real-server tests). Tests of a feature this
#      server lacks assert tether's fallback there and print DEGRADED (repeated at the end).
# Its output is in target/conformance/oldest.log, the server's logs in
# target/conformance/kube-oldest-{apiserver,etcd}.log.
#
# Without ../shared/peers or the 1.30 binaries the checks are NOT RUN (a banner, exit 0), unless
# TETHER_REQUIRE_KUBE=1 (CI), as with the newest server.
#
# Knobs: TETHER_OLDEST_DIR ($ROOT/target/peers-k8s-oldest), TETHER_OLDEST_API_PORT (27443),
# TETHER_OLDEST_ETCD_PORT (34790), TETHER_OLDEST_ETCD_PEER_PORT (34800), PEERS_BIN_DIR, CARGO.
set -uo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
ROOT=$(cd "$HERE/../.." && pwd)
BIN=${PEERS_BIN_DIR:-/var/cache/tether-peers/bin}
MINOR=1.30
LOGS=$ROOT/target/conformance
LOG=$LOGS/oldest.log
CARGO=${CARGO:-cargo}

# The suites that exercise the API surface tether uses: the CRD and its CEL rules, the store's
# requests (conditional writes, lists from the watch cache, watches), the engine over it, the
# reconciler, the CLI, the node-agent's lease service and monitor, the node-scope policies and the
# plugin's token (node_scope), the old lease names. Left to the newest server, for time (each
# passed against 1.30.14 when run by hand; seconds there): agents_faults (72), import_whereabouts
# (36), node_lost (15), sticky (8), multiprocess (6), and two controller tests of node_scope whose
# requests its other tests make too (18 and 11).
SUITES=(
  -p tether-kube-store --test store --test engine --test by_network --test domains --test errors
  --test objects_read
  -p tether-operator --test node_scope --test reconcile --test cli_kube --test kube_cni
  --test lease_service --test monitor --test lease_names --test whereabouts_nad
)
SKIP=(
  --skip two_controllers_elect_one_and_the_standby_takes_over
  --skip a_deleted_nodes_pods_collected_together_are_reclaimed_within_seconds
)

# Our own server (up.sh's knobs), never the caller's: `make test` runs its phases with the
# newest server's TETHER_TEST_KUBECONFIG exported.
export TETHER_KUBE_DIR=${TETHER_OLDEST_DIR:-$ROOT/target/peers-k8s-oldest}
export TETHER_KUBE_API_PORT=${TETHER_OLDEST_API_PORT:-27443}
export TETHER_KUBE_ETCD_PORT=${TETHER_OLDEST_ETCD_PORT:-34790}
export TETHER_KUBE_ETCD_PEER_PORT=${TETHER_OLDEST_ETCD_PEER_PORT:-34800}
# ../shared/peers/k8s-up.sh starts the kube-apiserver PEERS_APISERVER_BIN names; the tests and
# validate.py run the kubectl KUBECTL names.
export PEERS_APISERVER_BIN=$BIN/kube-apiserver-$MINOR
export KUBECTL=$BIN/kubectl-$MINOR
unset TETHER_TEST_KUBECONFIG TETHER_KUBE

log() { echo "kube/oldest: $*" >&2; }

down() {
  mkdir -p "$LOGS"
  [ -f "$TETHER_KUBE_DIR/apiserver.log" ] && cp "$TETHER_KUBE_DIR/apiserver.log" "$LOGS/kube-oldest-apiserver.log"
  [ -f "$TETHER_KUBE_DIR/etcd.log" ] && cp "$TETHER_KUBE_DIR/etcd.log" "$LOGS/kube-oldest-etcd.log"
  # --quiet: down.sh would keep the logs under the newest server's names.
  "$HERE/down.sh" --quiet
}

not_run() {
  cat >&2 <<EOF

##########################################################################################
##  NOT RUN: the API-server suites against Kubernetes $MINOR (the oldest tether claims)
##  $1
##  They have NOT passed. docs/compatibility.md lists what they check.
##########################################################################################

EOF
  if [ "${TETHER_REQUIRE_KUBE:-}" = 1 ]; then log "TETHER_REQUIRE_KUBE=1: failing"; exit 1; fi
  exit 0
}

case ${1:-} in
  --down) down; exit 0 ;;
  --up | "") ;;
  *) echo "usage: $0 [--up|--down]" >&2; exit 2 ;;
esac

for b in "$PEERS_APISERVER_BIN" "$KUBECTL"; do
  [ -x "$b" ] || not_run "No $b: conformance/peers/build.sh (make peers) builds it."
done

owner=1
if "$HERE/up.sh" --check 2>/dev/null; then owner=0; fi
kc=$("$HERE/up.sh")
case $? in
  0) ;;
  3) not_run "No ../shared/peers (TETHER_PEERS): no API server can be started." ;;
  *) log "FAILED to start the $MINOR API server (see above)"; down; exit 1 ;;
esac
if [ "${1:-}" = --up ]; then echo "$kc"; exit 0; fi
if [ $owner = 1 ]; then trap down EXIT; fi
trap 'exit 130' INT
trap 'exit 143' TERM
export TETHER_TEST_KUBECONFIG=$kc
K() { "$KUBECTL" --kubeconfig "$kc" "$@"; }

mkdir -p "$LOGS"
: >"$LOG"
failed=()
step() { echo "== $*" | tee -a "$LOG" >&2; }
start=$(date +%s)

# 1. The server we meant.
version=$(K version -o json 2>>"$LOG" | python3 -c 'import json, sys; print(json.load(sys.stdin)["serverVersion"]["gitVersion"])')
step "server $version, kubectl $("$KUBECTL" version --client -o json | python3 -c 'import json, sys; print(json.load(sys.stdin)["clientVersion"]["gitVersion"])')"
case $version in
  v$MINOR.*) ;;
  *) log "FAILED: the server at $kc is $version, not $MINOR (was PEERS_APISERVER_BIN ignored?)"; exit 1 ;;
esac

# 2. Every manifest, dry-run by this server, with this kubectl.
step "deploy/validate.py"
t=$(date +%s)
if ! "$CARGO" build --locked --bin tether >>"$LOG" 2>&1 || ! python3 "$ROOT/deploy/validate.py" 2>&1 | tee -a "$LOG" >&2; then
  failed+=("validate.py")
fi
log "validate.py: $(( $(date +%s) - t )) s"

# 3. The CRD without selectableFields (CustomResourceFieldSelectors: off by default before 1.31):
#    a field selector on IPLeases is refused, the node label that stands in for it still works.
step "selectableFields"
stored=$(K get crd ipleases.ipam.tether.dev -o jsonpath='{.spec.versions[0].selectableFields}')
if [ -n "$stored" ]; then
  log "FAILED: this server kept the CRD's selectableFields ($stored): docs/compatibility.md says $MINOR drops them"
  failed+=("selectableFields")
elif out=$(K get ipleases --field-selector spec.node=n1 2>&1); then
  log "FAILED: a field selector on spec.node was served without selectableFields: $out"
  failed+=("selectableFields")
elif ! by_label=$(K get ipleases -l ipam.tether.dev/node=n1 2>&1); then
  log "FAILED: listing IPLeases by the node label: $by_label"
  failed+=("selectableFields")
else
  echo "DEGRADED: this API server drops the CRD's selectableFields: \`kubectl get ipleases --field-selector spec.node=...\` is refused ($(grep -o 'field label not supported.*' <<<"$out")); \`-l ipam.tether.dev/node=...\` works" | tee -a "$LOG" >&2
fi

# 4. The suites. --show-output: the DEGRADED lines of passing tests reach the log.
step "cargo test ${SUITES[*]} -- --include-ignored ${SKIP[*]}"
t=$(date +%s)
if ! "$CARGO" test --locked "${SUITES[@]}" -- --include-ignored "${SKIP[@]}" --show-output >>"$LOG" 2>&1; then
  failed+=("cargo test")
  # Each failing binary's "failures:" section: the panics, then the failed tests' names.
  awk '/^failures:$/ { on = 1 } on { print } /^test result:/ { on = 0 }' "$LOG" >&2
fi
grep -E '^test result:|^     Running ' "$LOG" | sed 's/^/   /' >&2
log "suites: $(( $(date +%s) - t )) s"

echo >&2
grep -h '^DEGRADED' "$LOG" | sort -u | sed 's/^/kube\/oldest: /' >&2
if ((${#failed[@]})); then
  log "FAILED against $version: ${failed[*]} (target/conformance/oldest.log) in $(( $(date +%s) - start )) s"
  exit 1
fi
log "all passed against $version in $(( $(date +%s) - start )) s"
