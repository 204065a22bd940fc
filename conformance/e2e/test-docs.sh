#!/usr/bin/env bash
# The e2e checks of the docs, run by node.sh INSIDE the lab VM right after install.sh: the command
# blocks the README and the docs show for a node, taken from the pages (conformance/docs/blocks.py)
# and run as written, as root on the node with an admin kubeconfig in KUBECONFIG, as a user
# would. What each promised is then checked, so a page that drifts from the product fails here.
#
#   0. docs/install.md install-apply: deploy/tether.yaml (unchanged) and the example NADs.
#   1. README.md quick-start: run by install.sh, the first install on the fresh node.
#   2. docs/recipes.md smoke-test: the same pod again, its message, deleted.
#   3. docs/troubleshooting.md troubleshooting-installed: the agent, the files, the CRD.
#   4. docs/install.md: install-apply (unchanged), rke2-manifests, doctor-on-node (every check
#      passes on the example pool).
set -euo pipefail
. "$(dirname "${BASH_SOURCE[0]}")/checks.sh"
export KUBECONFIG=$E2E_DIR/cp/guest-admin.kubeconfig
# `kubectl tether`: the CLI of the image, under kubectl's plugin name (what `make install` links).
cp "$E2E_ROOT/target/image/tether" /run/e2e/bin/tether
ln -sfn tether /run/e2e/bin/kubectl-tether
cd "$E2E_ROOT"

# Run block $2 of page $1 as written (bash -euo pipefail), its output in OUT. If it fails: the
# output, then what $3 prints (e.g. a pod's events), and the check fails naming the block.
run_block() {
  OUT=$(bash -euo pipefail -c "$(python3 conformance/docs/blocks.py extract "$1" "$2")" 2>&1) && return 0
  echo "$OUT" >&2
  if [ -n "${3:-}" ]; then eval "$3" >&2 || true; fi
  fail "$1 $2 failed as written"
}

# docs/install.md, the long way (install.sh applied the same already: unchanged).
run_block docs/install.md install-apply
grep -q 'daemonset.apps/tether unchanged' <<<"$OUT" && grep -q 'networkattachmentdefinition.k8s.cni.cncf.io/mgmt-pool' <<<"$OUT" ||
  { echo "$OUT" >&2; fail "docs/install.md install-apply did not apply tether and the NADs"; }
pass "docs/install.md install-apply as written: deploy/tether.yaml unchanged, the example NADs"

run_block docs/recipes.md smoke-test
grep -q '^PASS: 10.20.30.1 answers on net1' <<<"$OUT" && grep -q 'pod "tether-smoke-test" deleted' <<<"$OUT" ||
  { echo "$OUT" >&2; fail "docs/recipes.md smoke-test: no PASS, or the pod not deleted"; }
pass "docs/recipes.md smoke test as written: PASS, pod deleted"

run_block docs/troubleshooting.md troubleshooting-installed
grep -q "tether-.* Running .* $E2E_NODE" <<<"$OUT" && grep -q -- '-rw------- .*tether.kubeconfig' <<<"$OUT" &&
  grep -q '^ipleases.ipam.tether.dev' <<<"$OUT" ||
  { echo "$OUT" >&2; fail "docs/troubleshooting.md troubleshooting-installed does not show what the page says"; }
pass "docs/troubleshooting.md 'is tether installed' as written: agent Running on $E2E_NODE, plugins and kubeconfig (0600), CRD"

# docs/install.md on RKE2: the server's auto-deploy directory (this node is no RKE2 server: the
# directory is made as RKE2 makes it, and the copy must be the manifest, byte for byte).
mkdir -p /var/lib/rancher/rke2/server/manifests
run_block docs/install.md rke2-manifests
cmp -s deploy/tether.yaml /var/lib/rancher/rke2/server/manifests/tether.yaml ||
  fail "docs/install.md rke2-manifests did not put deploy/tether.yaml in RKE2's manifests directory"
rm -rf /var/lib/rancher
pass "docs/install.md rke2-manifests as written: deploy/tether.yaml in /var/lib/rancher/rke2/server/manifests"

# docs/install.md: tether doctor on the node, as root, on the example pool.
run_block docs/install.md doctor-on-node
grep -q 'mgmt-pool' <<<"$OUT" && grep -q 'enp5s0' <<<"$OUT" ||
  { echo "$OUT" >&2; fail "docs/install.md doctor-on-node did not check mgmt-pool on enp5s0"; }
pass "docs/install.md doctor-on-node as written: mgmt-pool on enp5s0 passes every check"
