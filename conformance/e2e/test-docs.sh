#!/usr/bin/env bash
# The e2e checks of the docs, run by node.sh INSIDE the lab VM right after install.sh: the command
# blocks the README and the docs show for a node, taken from the pages (conformance/docs/blocks.py)
# and run as written, as root on the node with an admin kubeconfig in KUBECONFIG, as a user
# would. What each promised is then checked, so a page that drifts from the product fails here.
#
#   1. README.md quick-start: tether applied (already, by install.sh: unchanged), the rollout, the
#      example NADs, the smoke-test pod Succeeded with "PASS", `kubectl tether leases`.
#   2. docs/recipes.md smoke-test: the same pod again, its message, deleted.
#   3. docs/troubleshooting.md troubleshooting-installed: the agent, the files, the CRD.
set -euo pipefail
. "$(dirname "${BASH_SOURCE[0]}")/checks.sh"
export KUBECONFIG=$E2E_DIR/cp/guest-admin.kubeconfig
# `kubectl tether`: the CLI of the image, under kubectl's plugin name (what `make install` links).
cp "$E2E_ROOT/target/image/tether" /run/e2e/bin/tether
ln -sfn tether /run/e2e/bin/kubectl-tether
cd "$E2E_ROOT"

t=$(now)
OUT=$(bash -euo pipefail -c "$(python3 conformance/docs/blocks.py extract README.md quick-start)" 2>&1) ||
  { echo "$OUT" >&2; pod_events default tether-smoke-test >&2; fail "README.md quick-start failed as written"; }
grep -q '^PASS: 10.20.30.1 answers on net1' <<<"$OUT" || { echo "$OUT" >&2; fail "the quick start's smoke test did not say PASS"; }
grep -q '^NETWORK  *ADDRESS' <<<"$OUT" && grep -q 'mgmt-pool' <<<"$OUT" ||
  { echo "$OUT" >&2; fail "the quick start's kubectl tether leases listed no lease of mgmt-pool"; }
timing readme-quick-start "$(since "$t")"
pass "README quick start as written: $(grep -m1 '^net1 ' <<<"$OUT"), $(grep -m1 '^PASS' <<<"$OUT"); kubectl tether leases lists mgmt-pool"

OUT=$(bash -euo pipefail -c "$(python3 conformance/docs/blocks.py extract docs/recipes.md smoke-test)" 2>&1) ||
  { echo "$OUT" >&2; fail "docs/recipes.md smoke-test failed as written"; }
grep -q '^PASS: 10.20.30.1 answers on net1' <<<"$OUT" && grep -q 'pod "tether-smoke-test" deleted' <<<"$OUT" ||
  { echo "$OUT" >&2; fail "docs/recipes.md smoke-test: no PASS, or the pod not deleted"; }
pass "docs/recipes.md smoke test as written: PASS, pod deleted"

OUT=$(bash -euo pipefail -c "$(python3 conformance/docs/blocks.py extract docs/troubleshooting.md troubleshooting-installed)" 2>&1) ||
  { echo "$OUT" >&2; fail "docs/troubleshooting.md troubleshooting-installed failed as written"; }
grep -q "tether-.* Running .* $E2E_NODE" <<<"$OUT" && grep -q -- '-rw------- .*tether.kubeconfig' <<<"$OUT" &&
  grep -q '^ipleases.ipam.tether.dev' <<<"$OUT" ||
  { echo "$OUT" >&2; fail "docs/troubleshooting.md troubleshooting-installed does not show what the page says"; }
pass "docs/troubleshooting.md 'is tether installed' as written: agent Running on $E2E_NODE, plugins and kubeconfig (0600), CRD"
