#!/usr/bin/env bash
# `make bench-node`, in the lab VM after install.sh: how fast the real node brings pods with two
# attachments to Running, tether against the reference, same node, same run.
#
#   tether:    tether-ipvlan + tether-ipam (cluster store, the probe on: as the examples ship)
#   reference: the reference ipvlan plugin (Debian's containernetworking-plugins) + whereabouts
#              (built from its module by .ci/deps.sh; its CRDs from ../shared/peers)
#
# Each round creates a Deployment of N pods (default 50) whose pods select two NADs of one kind,
# net1 on enp5s0 and net2 on enp6s0 (disjoint ranges per kind), and times creation → all Running;
# then deletes it and waits until every pod is gone (and, for tether, every lease Released).
# Each round runs tether, then the reference (bounded, see below). Results: $E2E_DIR/bench-node.md (a markdown table
# and the ratio), which run.sh prints.
set -euo pipefail
. "$(dirname "${BASH_SOURCE[0]}")/checks.sh"
N=${TETHER_BENCH_NODE_PODS:-50}
ROUNDS=${TETHER_BENCH_NODE_ROUNDS:-1}
OUT=$E2E_DIR/bench-node.md

# ---- the reference plugins on the node ----------------------------------------------------------
cp /usr/lib/cni/ipvlan /opt/cni/bin/ipvlan
cp "$E2E_DIR/bin/whereabouts" /opt/cni/bin/whereabouts
for f in "$PEERS"/whereabouts-crds/*.yaml; do K apply -f "$f" >&2 || fail "kubectl apply -f $f"; done
# whereabouts with the admin's credential (its own RBAC is not what is measured here).
mkdir -p /etc/cni/net.d/whereabouts.d
cp "$E2E_DIR/cp/guest-admin.kubeconfig" /etc/cni/net.d/whereabouts.d/whereabouts.kubeconfig
chmod 600 /etc/cni/net.d/whereabouts.d/whereabouts.kubeconfig
# whereabouts also wants its flat config file (its default place), or every ADD fails with
# "config file not found" (seen: 0 of 50 pods Running); bench-kube writes one the same way.
printf '{"datastore": "kubernetes", "kubernetes": {"kubeconfig": "/etc/cni/net.d/whereabouts.d/whereabouts.kubeconfig"}}\n' \
  >/etc/cni/net.d/whereabouts.d/whereabouts.conf

ref_nad() { # name master range
  K apply -f - >&2 <<EOF || fail "creating NAD $1"
apiVersion: k8s.cni.cncf.io/v1
kind: NetworkAttachmentDefinition
metadata: {name: $1, namespace: default}
spec:
  config: |
    {"cniVersion": "1.0.0", "type": "ipvlan", "master": "$2", "mode": "l2",
     "ipam": {"type": "whereabouts", "range": "$3", "log_level": "error",
              "kubernetes": {"kubeconfig": "/etc/cni/net.d/whereabouts.d/whereabouts.kubeconfig"}}}
EOF
}
nad bench-t-mgmt enp5s0 10.20.30.100-10.20.30.199/24
nad bench-t-compute enp6s0 192.168.100.10-192.168.100.120/24
ref_nad bench-r-mgmt enp5s0 10.20.30.10-10.20.30.99/24
ref_nad bench-r-compute enp6s0 192.168.100.130-192.168.100.250/24

running_count() { K -n default get pods -l "app=$1" -o json | jq '[.items[] | select(.status.phase == "Running")] | length'; }
all_running() { [ "$(running_count "$1")" = "$N" ]; }
none_left() { [ -z "$(K -n default get pods -l "app=$1" -o name)" ]; }
tether_released() {
  [ "$(leases_json | jq '[.items[] | select(.spec.state == "Leased" and (.spec.pod.name | startswith("bench-t-")))] | length')" = 0 ]
}

# why_not APP: the three most frequent Warning event messages of the app's pods, counted, so a
# round that fails says what its sandboxes met.
why_not() {
  K -n default get events --field-selector type=Warning -o json |
    jq -r --arg app "$1-" '[.items[] | select(.involvedObject.name | startswith($app)) | .message[0:400]]
      | group_by(.) | map("\(length)x \(.[0])") | sort_by(-(split("x ")[0] | tonumber)) | .[0:3] | join(" || ")'
}

# round KIND (t|r) LIMIT: seconds from the Deployment's creation to all N Running; prints
# "seconds failed-sandboxes", or "- running-at-LIMIT" when the reference had not brought them all up
# by then (tether not reaching it fails the check). The Deployment is deleted either way.
round() {
  local kind=$1 limit=$2 app="bench-$1" t s failed p running
  t=$(now)
  K apply -f - >&2 <<EOF || fail "creating Deployment $app"
apiVersion: apps/v1
kind: Deployment
metadata: {name: $app, namespace: default}
spec:
  replicas: $N
  selector: {matchLabels: {app: $app}}
  template:
    metadata:
      labels: {app: $app}
      annotations:
        k8s.v1.cni.cncf.io/networks: '[{"name": "bench-$kind-mgmt", "interface": "net1"}, {"name": "bench-$kind-compute", "interface": "net2"}]'
    spec:
      terminationGracePeriodSeconds: 1
      containers:
      - name: main
        image: localhost/kubelet-lab/busybox:1.35
        imagePullPolicy: Never
        command: ["/bin/sh", "-c", "exec sleep 3600"]
EOF
  if ! wait_for "$limit" all_running "$app"; then
    running=$(running_count "$app")
    [ "$kind" = r ] || fail "$app: $running of $N Running after $limit s; most frequent warnings: $(why_not "$app")"
    e2e_log "$app: $running of $N Running after $limit s; most frequent warnings: $(why_not "$app")"
    K -n default delete deployment "$app" >&2
    # Its DELs queue behind the same lock: not waited for (the teardown forces what is left).
    echo "- $running"
    return
  fi
  s=$(since "$t")
  failed=0
  for p in $(K -n default get pods -l "app=$app" -o jsonpath='{.items[*].metadata.name}'); do
    failed=$(( failed + $(event_count "$p" FailedCreatePodSandBox) ))
  done
  [ "$failed" = 0 ] || e2e_log "$app: $failed failed sandboxes before all were Running; most frequent warnings: $(why_not "$app")"
  # Every pod really has both interfaces with an address (a sample of three).
  for p in $(K -n default get pods -l "app=$app" -o jsonpath='{.items[*].metadata.name}' | tr ' ' '\n' | head -n 3); do
    for i in net1 net2; do [ -n "$(addr_of "$p" $i)" ] || fail "$p of $app has no address on $i"; done
  done
  K -n default delete deployment "$app" >&2
  wait_for 600 none_left "$app" || fail "$app: pods left 600 s after the Deployment's deletion"
  [ "$kind" != t ] || wait_for 120 tether_released || fail "$app: tether leases still Leased after the pods are gone"
  echo "$s $failed"
}

# tether first, so its figure exists whatever the reference does; the reference's round is bounded
# (whereabouts' one cluster-wide Lease serialises every ADD and DEL; on this node its sandboxes
# have been seen to time out and retry without end: 0 of 50 Running after 900 s).
T_LIMIT=${TETHER_BENCH_NODE_TIMEOUT:-900}
R_LIMIT=${TETHER_BENCH_NODE_REFERENCE_TIMEOUT:-600}
declare -a T R
for i in $(seq 1 "$ROUNDS"); do
  out=$(round t "$T_LIMIT"); read -r s TF <<<"$out"; T+=("$s")
  e2e_log "round $i tether: $N pods Running in $s s ($TF failed sandboxes)"
  out=$(round r "$R_LIMIT"); read -r s RF <<<"$out"; R+=("$s")
  e2e_log "round $i reference: $( [ "$s" = - ] && echo "$RF of $N Running at $R_LIMIT s" || echo "$N pods Running in $s s ($RF failed sandboxes)")"
done
best() { printf '%s\n' "$@" | { grep -v '^-$' || true; } | sort -n | head -n 1; }
rate() { awk -v n="$1" -v s="$2" 'BEGIN{printf "%.3f", n/s}'; }
bt=$(best "${T[@]}"); br=$(best "${R[@]}")
{
  echo "| plugins (net1 + net2 per pod) | pods | rounds | creation → all Running, s (each round) | pods Running per second (best) | failed sandboxes (last round) |"
  echo "|---|---:|---:|---|---:|---:|"
  printf '| tether-ipvlan + tether-ipam (cluster store through the node-agent, node credential; probes each address, 100 ms) | %s | %s | %s | %s | %s |\n' "$N" "$ROUNDS" "${T[*]}" "$(rate "$N" "$bt")" "$TF"
  if [ -n "$br" ]; then
    printf '| reference ipvlan + whereabouts (admin kubeconfig; one cluster-wide Lease per call; no probe) | %s | %s | %s | %s | %s |\n' "$N" "$ROUNDS" "${R[*]}" "$(rate "$N" "$br")" "$RF"
    echo
    printf 'tether / reference, pods Running per second: x%.2f\n' "$(awk -v a="$br" -v b="$bt" 'BEGIN{print a/b}')"
  else
    # Never all Running: its rate is at most what it had Running at the limit over the limit.
    printf '| reference ipvlan + whereabouts (admin kubeconfig; one cluster-wide Lease per call; no probe) | %s | %s | not all Running within %s s (%s of %s) | ≤ %s | — |\n' \
      "$N" "$ROUNDS" "$R_LIMIT" "$RF" "$N" "$(rate "$RF" "$R_LIMIT")"
    echo
    if [ "$RF" -gt 0 ]; then
      printf 'tether / reference, pods Running per second: ≥ x%.2f (the reference had %s of %s Running after %s s)\n' \
        "$(awk -v n="$N" -v b="$bt" -v k="$RF" -v l="$R_LIMIT" 'BEGIN{print (n/b)/(k/l)}')" "$RF" "$N" "$R_LIMIT"
    else
      printf 'tether / reference: the reference brought 0 of %s pods to Running in %s s; tether all %s in %s s\n' "$N" "$R_LIMIT" "$N" "$bt"
    fi
  fi
} >"$OUT"
cat "$OUT" >&2
pass "bench-node: $(tail -n 1 "$OUT")"
