#!/usr/bin/env bash
# `make e2e`: a real node — kubelet + containerd — creates pods that tether-ipvlan attaches on
# REAL ipvlan, with tether installed as the README says (deploy/tether.yaml, unchanged).
#
#   HOST (native):   etcd, kube-apiserver, kube-controller-manager, kube-scheduler
#                    (control-plane.sh; v1.36 from PEERS_BIN_DIR)
#   LAB VM (qemu TCG, Debian 6.1 kernel with ipvlan; conformance/lab/run.sh):
#                    containerd 1.6 + runc + kubelet v1.36 (node.sh), Multus thin in front of
#                    bridge + host-local, the tether node-agent pod, the test pods; the checks
#                    (test.sh) run here too: they look into the pods' netns through containerd.
#   The VM reaches the API server, and nothing else, through one forwarded port
#   (TETHER_LAB_FORWARD): 10.0.2.100:$E2E_API_PORT in the VM is 127.0.0.1:$E2E_API_PORT here.
#
# Bounded: the VM is killed after TETHER_E2E_TIMEOUT s (default 3000); everything started is stopped
# by pid (the VM's own services by node.sh, the control plane here, also on failure or Ctrl-C).
# Exit status 0 only if every check passed. State and logs: target/lab/e2e/ (cleared at the start
# of each run): timings.txt, results.txt, cp/logs/ (control plane), logs/ (containerd, kubelet,
# kubectl proxies, pod logs).
#
# Needs: root; the peers' binaries in PEERS_BIN_DIR (kube-apiserver, kube-controller-manager,
# kube-scheduler, kubelet, kubectl, multus: .ci/deps.sh); target/tether-image.tar (`make image`;
# `make e2e` builds it first); Debian's containerd + runc (installed here if missing), etcd,
# socat, jq. Ports (host loopback): TETHER_E2E_API_PORT 47443, _ETCD_PORT 47379,
# _ETCD_PEER_PORT 47380, _KCM_PORT 47257, _SCHED_PORT 47259.
set -euo pipefail
. "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
[ "$(id -u)" = 0 ] || e2e_die "must run as root"
cd "$E2E_ROOT"

# ---- preflight: fail before starting anything ----
need=()
command -v containerd >/dev/null || need+=(containerd)
command -v runc >/dev/null || need+=(runc)
command -v socat >/dev/null || need+=(socat)
command -v jq >/dev/null || need+=(jq)
command -v tcpdump >/dev/null || need+=(tcpdump)  # test-events.sh: the conflict guard's defence on the wire
command -v iptables >/dev/null || need+=(iptables)
[ -x /usr/lib/cni/bridge ] || need+=(containernetworking-plugins)
if ((${#need[@]})); then
  e2e_log "installing ${need[*]}"
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null ||
    { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null; } ||
    e2e_die "cannot install ${need[*]}"
fi
for b in kube-apiserver kube-controller-manager kube-scheduler kubelet kubectl multus multus-daemon multus-shim whereabouts; do
  [ -x "$PEERS_BIN_DIR/$b" ] || e2e_die "no $PEERS_BIN_DIR/$b (PEERS_BIN_DIR; .ci/deps.sh builds the peers)"
done
[ -s target/tether-image.tar ] && [ -x target/image/tether-ipam ] || [ "${TETHER_E2E_NODE_ONLY:-0}" = 1 ] ||
  e2e_die "no target/tether-image.tar or target/image/: run \`make image\` (make e2e does)"
[ -s target/release-artifacts/SHA256SUMS ] || [ "${TETHER_E2E_NODE_ONLY:-0}" = 1 ] ||
  e2e_die "no target/release-artifacts: run \`make release\` (make e2e does); the README's quick start installs from it"
[ -f "$PEERS/nad-crd.yaml" ] || e2e_die "no $PEERS/nad-crd.yaml (TETHER_PEERS)"

# ---- state ----
if [ -d "$E2E_DIR/cp" ]; then "$E2E_HERE/control-plane.sh" down 2>/dev/null || true; fi   # a killed run's leftovers
rm -rf "$E2E_DIR" && mkdir -p "$E2E_DIR/bin" "$E2E_DIR/logs"
T0=$(now); echo "$T0" >"$E2E_DIR/t0"
: >"$E2E_DIR/timings.txt"
# In the VM the host's /var/cache is not visible: the binaries it runs are copied into the shared dir.
for b in kubelet kubectl multus whereabouts helm; do cp "$PEERS_BIN_DIR/$b" "$E2E_DIR/bin/$b"; done
if [ "${TETHER_E2E_NODE_ONLY:-0}" != 1 ]; then
  # The previous release, which test-release.sh upgrades from (built once per machine).
  prev=$(conformance/upgrade/previous-release.sh) || e2e_die "cannot build the previous release"
  cp -r "$prev" "$E2E_DIR/previous"
fi
"$E2E_HERE/images.sh" "$E2E_DIR/images"
if [ "${TETHER_E2E_NODE_ONLY:-0}" != 1 ]; then
  # The image test.sh rolls the DaemonSet to: the binaries of `make image`, each with bytes
  # appended (an ELF runs the same), so the new agent really replaces both plugins on the node.
  next=$E2E_DIR/images/next/usr/local/bin
  mkdir -p "$next"
  for b in tether tether-ipam tether-ipvlan; do
    cp "target/image/$b" "$next/$b" && printf '\ntether e2e rollout\n' >>"$next/$b"
  done
  python3 "$E2E_HERE/mkimage.py" "$E2E_DIR/images/tether-next.tar" localhost/tether:0.1.1-e2e "$E2E_DIR/images/next" \
    --entrypoint '["/usr/local/bin/tether"]' --env PATH=/usr/local/bin >/dev/null
fi

status=1
finish() {
  local rc=$?
  # An exit of its own (a signal's trap: 130) fails a run the node had not failed yet.
  [ "$rc" = 0 ] || [ "$status" != 0 ] || status=$rc
  "$E2E_HERE/control-plane.sh" down || true
  echo "---- e2e timings (s; +N = since the start of make e2e) ----" >&2
  cat "$E2E_DIR/timings.txt" >&2 2>/dev/null || true
  if [ -s "$E2E_DIR/logs/cni-trace.log" ]; then
    # What containerd called on the node's CNI (Multus), per sandbox: the finding-rich part.
    echo "---- CNI calls by containerd (logs/cni-trace.log; netns <empty> = CNI_NETNS unset) ----" >&2
    awk '$4 ~ /^netns=/ { a = $0; sub(/.* args=/, "", a); sub(/ path=.*/, "", a)
                          pod = a; sub(/.*K8S_POD_NAME=/, "", pod); sub(/;.*/, "", pod)
                          t[$3] = $1; line[$3] = sprintf("%s %-4s %s pod=%s %s", strftime("%T", $1), $2, substr($3, 4, 12), pod, $4) }
         $4 ~ /^exit=/ { printf "%s -> %s in %.1f s\n", line[$3], $4, $1 - t[$3] }' "$E2E_DIR/logs/cni-trace.log" >&2
    grep -m1 ' ADD ' "$E2E_DIR/logs/cni-trace.log" | sed 's/^/first ADD: /' >&2 || true
  fi
  [ ! -s "$E2E_DIR/bench-node.md" ] || { echo "---- bench-node ----" >&2; cat "$E2E_DIR/bench-node.md" >&2; }
  echo "---- e2e results ----" >&2
  cat "$E2E_DIR/results.txt" >&2 2>/dev/null || echo "(no results: the node did not get to the checks)" >&2
  if [ -s "$E2E_DIR/checks.txt" ]; then
    # Each check script with the nodes it ran on, its time, its result, and its figures (the
    # timings it recorded, in timings.txt's order).
    echo "---- e2e summary: node A $E2E_NODE (the VM's namespaces), node B $E2E_NODE_B (netns nodeb) ----" >&2
    awk 'FNR == NR {fig[$3] = fig[$3] (fig[$3] == "" ? "" : ", ") $1 " " $2; next}
         {printf "%-20s %-22s %5d s  %s (%d PASS)  %s\n", $1, $2, $3, ($4 == 0 ? "passed" : "FAILED " $4), $5, fig[$1]}' \
      "$E2E_DIR/timings.txt" "$E2E_DIR/checks.txt" >&2
  fi
  if [ "$status" = 0 ]; then e2e_log "PASSED in $(since "$T0") s"; else e2e_log "FAILED (status $status) after $(since "$T0") s; logs in ${E2E_DIR#"$E2E_ROOT"/}/{cp/logs,logs}"; fi
  exit "$status"
}
trap finish EXIT
trap 'e2e_log interrupted; exit 130' INT TERM

"$E2E_HERE/control-plane.sh" up
echo "control-plane-ready $(since "$T0")" >>"$E2E_DIR/timings.txt"

# ---- the node, in the lab VM ----
export TETHER_LAB_FORWARD=$E2E_API_PORT
export TETHER_LAB_MEMORY=${TETHER_LAB_MEMORY:-4G}
export TETHER_LAB_TIMEOUT=${TETHER_E2E_TIMEOUT:-3000}
status=0
conformance/lab/run.sh "bash $(printf '%q' "$E2E_HERE/node.sh")" || status=$?
