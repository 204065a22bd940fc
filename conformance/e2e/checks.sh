# shellcheck shell=bash
# Helpers of the e2e checks (test.sh, test-events.sh), sourced INSIDE the lab VM once the node is
# Ready. Every wait is bounded; a failed check exits 1 with what it saw.
# Why not `kubectl exec`: the API server cannot reach this kubelet (see node.sh). Pods are looked
# into through containerd: the sandbox task's pid, then nsenter.
. "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
export PATH=/run/e2e/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
K() { kubectl -s http://127.0.0.1:8001 "$@"; }
# GET PATH [curl args]: the API object or list at PATH, through the same proxy, for the reads the
# waits repeat every second: curl + jq took 23-29 ms a read against 63-83 ms for `kubectl get`
# (host, live API server), and the emulated VM multiplies both.
API=http://127.0.0.1:8001
GET() { local path=$1; shift; curl -fsS --max-time 30 -G "$@" "$API$path"; }
# The node's containerd; with CTR_NS=<pid of another containerd> (test-two-nodes.sh's node B,
# in namespaces of its own) that one's, seen from its mount and network namespaces.
CTR() { ${CTR_NS:+nsenter -t "$CTR_NS" -m -n} ctr -n k8s.io "$@"; }
# on_b COMMAND...: COMMAND with CTR on node B's containerd (sandbox_pid, assert_ipvlan, ping_from)
on_b() { CTR_NS=$(cat "$E2E_DIR/node-b/pids/containerd.pid") "$@"; }
RES=$E2E_DIR/results.txt
# Each result carries the seconds since run.sh started: the tail of a run that ran out of time
# shows where the time went.
E2E_T0=$(cat "$E2E_DIR/t0" 2>/dev/null || now)
pass() { echo "PASS +$(since "$E2E_T0" | cut -d. -f1)s $*" | tee -a "$RES" >&2; }
fail() { echo "FAIL +$(since "$E2E_T0" | cut -d. -f1)s $*" | tee -a "$RES" >&2; exit 1; }
# timing NAME SECONDS: a figure, with the script that measured it (run.sh's summary)
timing() { echo "$1 $2 ${0##*/}" >>"$E2E_DIR/timings.txt"; e2e_log "$1: $2 s"; }
# The management pool of deploy/examples/nad-management-pool.yaml: .241-.250 without .245.
POOL_RE='^10\.20\.30\.(24[1-46-9]|250)$'
COMPUTE_RE='^192\.168\.100\.([1-9][0-9]|1[0-9][0-9]|2[0-4][0-9]|250)$'
LEASES=ipleases.ipam.tether.dev

# wait_for SECONDS COMMAND...: until COMMAND succeeds (once a second); 1 if it never did
wait_for() {
  local s=$1; shift
  local deadline=$(( $(date +%s) + s ))
  until "$@" >/dev/null 2>&1; do
    [ "$(date +%s)" -lt "$deadline" ] || return 1
    sleep 1
  done
}
pod_events() { # namespace pod: the pod's events, oldest first (what `kubectl describe` shows)
  K -n "$1" get events --field-selector "involvedObject.name=$2" \
    -o custom-columns=TYPE:.type,REASON:.reason,COUNT:.count,MESSAGE:.message --sort-by=.lastTimestamp 2>&1 || true
}
pod_phase() { GET "/api/v1/namespaces/default/pods/$1" | jq -r '.status.phase // empty'; }
pod_uid() { GET "/api/v1/namespaces/default/pods/$1" | jq -r .metadata.uid; }
running() { [ "$(pod_phase "$1")" = Running ]; }
gone() { [ "$(curl -s -o /dev/null -w '%{http_code}' --max-time 30 "$API/api/v1/namespaces/default/pods/$1")" = 404 ]; }
# wait_running SECONDS POD...: every POD Running, or fail with their events
wait_running() {
  local s=$1 p; shift
  all_running() { local q; for q in "$@"; do running "$q" || return 1; done; }
  if ! wait_for "$s" all_running "$@"; then
    for p in "$@"; do
      running "$p" && continue
      K -n default get pod "$p" -o wide >&2 || true
      pod_events default "$p" >&2
    done
    fail "not Running within $s s: $(for p in "$@"; do running "$p" || printf '%s(%s) ' "$p" "$(pod_phase "$p" 2>/dev/null)"; done)"
  fi
}
# sandbox_id POD: the id of the pod's RUNNING sandbox (after a re-creation the dead one is still listed)
sandbox_id() {
  local id
  for id in $(CTR containers ls -q "labels.\"io.kubernetes.pod.name\"==$1,labels.\"io.kubernetes.pod.namespace\"==default,labels.\"io.cri-containerd.kind\"==sandbox"); do
    CTR tasks ls | awk -v id="$id" '$1 == id && $3 == "RUNNING" {found = 1} END {exit !found}' && { echo "$id"; return 0; }
  done
  return 1
}
# sandbox_pid POD: the pid of the pod's running sandbox task (its netns is the pod's)
sandbox_pid() {
  local id
  id=$(sandbox_id "$1") || return 1
  CTR tasks ls | awk -v id="$id" '$1 == id {print $2}'
}
in_pod() { local pid=$1; shift; nsenter -t "$pid" -n "$@"; }
# addr_of POD IFNAME: the IPv4 address of IFNAME in POD's netns
addr_of() {
  local pid
  pid=$(sandbox_pid "$1") || return 1
  in_pod "$pid" ip -j addr show dev "$2" | jq -r '.[0].addr_info[] | select(.family == "inet") | .local' | head -n 1
}
# assert_ipvlan POD IFNAME REGEX: IFNAME is an l2 ipvlan link whose address matches REGEX; prints it
assert_ipvlan() {
  local pid link kind mode addr
  pid=$(sandbox_pid "$1") || fail "no running sandbox task for $1 in containerd"
  link=$(in_pod "$pid" ip -j -d addr show dev "$2") || fail "no $2 in $1's netns: $(in_pod "$pid" ip -br addr 2>&1 | tr '\n' ';')"
  kind=$(jq -r '.[0].linkinfo.info_kind' <<<"$link")
  mode=$(jq -r '.[0].linkinfo.info_data.mode // empty' <<<"$link")
  addr=$(jq -r '.[0].addr_info[] | select(.family == "inet") | .local' <<<"$link" | head -n 1)
  [ "$kind" = ipvlan ] || fail "$2 of $1 is a '$kind' link, not ipvlan: $link"
  [ "$mode" = l2 ] || fail "$2 of $1 is ipvlan mode '$mode', not l2"
  [[ "$addr" =~ $3 ]] || fail "$2 of $1 has address '$addr', not one of $3"
  echo "$addr"
}
# ping_from POD IFNAME ADDRESS
ping_from() {
  local pid
  pid=$(sandbox_pid "$1") || fail "no running sandbox for $1"
  in_pod "$pid" ping -c 1 -W 5 -I "$2" "$3" >/dev/null || fail "$1 cannot ping $3 over $2"
}
# The lease records, without the mirrors kept under network names for a tether from before
# uniqueness domains (crates/kube-store/src/by_network.rs): a mirror repeats its record's address.
LEASES_API=/apis/ipam.tether.dev/v1alpha1/ipleases
leases_json() { GET "$LEASES_API" --data-urlencode 'labelSelector=!ipam.tether.dev/mirror'; }
mirrors_json() { GET "$LEASES_API" --data-urlencode 'labelSelector=ipam.tether.dev/mirror=true'; }
lease_of() { # address: that address's IPLease as one line of JSON (none: empty)
  leases_json | jq -c --arg a "$1" '.items[] | select(.spec.address == $a)'
}
lease_state() { lease_of "$1" | jq -r '.spec.state // empty'; }
# assert_leased ADDRESS POD IFNAME [NODE]: Leased to POD (name, namespace, UID) on NODE (this one)
# for IFNAME
assert_leased() {
  local lease uid node=${4:-$E2E_NODE}
  lease=$(lease_of "$1")
  uid=$(pod_uid "$2")
  jq -e --arg p "$2" --arg u "$uid" --arg n "$node" --arg i "$3" \
    '.spec.state == "Leased" and .spec.pod.name == $p and .spec.pod.namespace == "default" and .spec.pod.uid == $u and .spec.node == $n and .spec.ifname == $i' \
    <<<"$lease" >/dev/null || fail "IPLease of $1 is not Leased to default/$2 (uid $uid) $3 on $node: ${lease:-none}"
}
released() { [ "$(lease_state "$1")" = Released ]; }
pod_events_json() { # POD REASON: the pod's events of that reason, as the API lists them
  GET /api/v1/namespaces/default/events --data-urlencode "fieldSelector=involvedObject.name=$1,reason=$2" 2>/dev/null
}
# event_text POD REASON: the message of the newest REASON event of POD (empty if none)
event_text() {
  pod_events_json "$1" "$2" | jq -r '.items | sort_by(.lastTimestamp // .eventTime // .metadata.creationTimestamp) | .[-1].message // empty'
}
has_event() { [ -n "$(event_text "$1" "$2")" ]; }
# (`.count // 1` per item: over the whole stream, `//` would turn no event into one.)
event_count() { # POD REASON: how many times REASON was reported for POD (events aggregate repeats)
  pod_events_json "$1" "$2" | jq '[.items[] | .count // 1] | add // 0'
}
# expect_event POD WHAT STRING...: POD not Running, a FailedCreatePodSandBox event containing every STRING
expect_event() {
  local pod=$1 what=$2 msg s t; shift 2
  t=$(now)
  wait_for 120 has_event "$pod" FailedCreatePodSandBox || { pod_events default "$pod" >&2; fail "$what: no FailedCreatePodSandBox event for $pod in 120 s"; }
  timing "$what-create-to-event" "$(since "$t")"
  [ "$(pod_phase "$pod")" != Running ] || fail "$what: $pod is Running"
  msg=$(event_text "$pod" FailedCreatePodSandBox)
  echo "$msg" >"$E2E_DIR/event-$what.txt"
  for s in "$@"; do
    [[ "$msg" == *"$s"* ]] || fail "$what: the event of $pod does not say '$s': $msg"
  done
  [ -z "$(leases_json | jq -r --arg p "$pod" '.items[] | select(.spec.pod.name == $p and .spec.state == "Leased") | .spec.address')" ] ||
    fail "$what: $pod holds a lease although its sandbox failed"
  pass "$what: $pod not started, nothing leased; kubectl describe shows: ${msg#*error adding container to network }"
}
# recovers POD WHAT: after the fix, POD Running by itself (no one touches it)
recovers() {
  local t
  t=$(now)
  wait_running "${TETHER_E2E_RECOVER_TIMEOUT:-180}" "$1"
  timing "$2-fixed-to-running" "$(since "$t")"
}

# busybox_pod NAME NETWORKS_JSON [NODE]: a pod on the cluster network plus the selected networks
# (on NODE: bound there, not scheduled)
# (Created through the proxy, as YAML: a kubectl start costs ~1.5 s under TCG; the API server
# takes application/yaml.)
busybox_pod() {
  curl -fsS --max-time 30 -o /dev/null -X POST -H 'Content-Type: application/yaml' --data-binary @- \
    "$API/api/v1/namespaces/default/pods" <<EOF || fail "creating pod $1"
apiVersion: v1
kind: Pod
metadata:
  name: $1
  namespace: default
  annotations:
    k8s.v1.cni.cncf.io/networks: '$2'
spec:
  ${3:+nodeName: $3}
  terminationGracePeriodSeconds: 1
  containers:
  - name: main
    image: localhost/kubelet-lab/busybox:1.35
    imagePullPolicy: Never
    command: ["/bin/sh", "-c", "exec sleep 3600"]
EOF
}
# seed_nads: the NADs of deploy/examples, unchanged (idempotent, so a check can run without test.sh)
seed_nads() {
  local x=$E2E_ROOT/deploy/examples
  K apply -f "$x/nad-management-pool.yaml" -f "$x/nad-management-fixed.yaml" -f "$x/nad-compute.yaml" >&2 ||
    fail "kubectl apply -f deploy/examples/nad-{management-pool,management-fixed,compute}.yaml"
}
# nad NAME MASTER RANGE: a NAD as users write one (no "name": Multus names the network after the NAD)
nad() {
  K apply -f - >&2 <<EOF || fail "creating NAD $1"
apiVersion: k8s.cni.cncf.io/v1
kind: NetworkAttachmentDefinition
metadata: {name: $1, namespace: default}
spec:
  config: |
    {"cniVersion": "1.0.0", "type": "tether-ipvlan", "master": "$2", "mode": "l2",
     "ipam": {"type": "tether-ipam", "range": "$3",
              "kubernetes": {"kubeconfig": "/etc/cni/net.d/tether.d/tether.kubeconfig"}}}
EOF
}
# delete_pods SECONDS POD...: delete and wait until gone
delete_pods() {
  local s=$1 p; shift
  for p in "$@"; do curl -sS --max-time 30 -o /dev/null -X DELETE "$API/api/v1/namespaces/default/pods/$p" || true; done
  all_gone() { local q; for q in "$@"; do gone "$q" || return 1; done; }
  wait_for "$s" all_gone "$@" || fail "still in the API $s s after delete: $*"
}
agents_json() { GET /api/v1/namespaces/kube-system/pods --data-urlencode labelSelector=app.kubernetes.io/name=tether; }
# agent_json [NODE]: the agent pod on NODE (default: this node, A) that is not being deleted
agent_json() {
  agents_json | jq -c --arg n "${1:-$E2E_NODE}" '[.items[] | select(.spec.nodeName == $n and .metadata.deletionTimestamp == null)][0] // empty'
}
agent_pod() { agent_json "$@" | jq -r '.metadata.name'; }
agent_image() { agent_json "$@" | jq -r '.spec.containers[0].image'; }
agent_ready() { # [NODE]
  [ "$(agent_json "$@" | jq -r '.status.conditions[]? | select(.type == "Ready") | .status')" = True ]
}
