#!/usr/bin/env bash
# The docs' command blocks that run on the test host (make docs-check), as written: each block
# is taken from its page by blocks.py and run by bash -e, then what it promised is checked.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."

# docs/install.md: by hand into a DESTDIR.
rm -rf /tmp/tether-root
trap 'rm -rf /tmp/tether-root' EXIT
bash -euo pipefail -c "$(python3 conformance/docs/blocks.py extract docs/install.md install-by-hand)" >/dev/null
for f in opt/cni/bin/tether-ipvlan opt/cni/bin/tether-ipam usr/local/bin/tether; do
  [ -x "/tmp/tether-root/$f" ] || { echo "docs-check: install-by-hand left no /tmp/tether-root/$f" >&2; exit 1; }
done
[ "$(readlink /tmp/tether-root/usr/local/bin/kubectl-tether)" = tether ] ||
  { echo "docs-check: install-by-hand left no kubectl-tether -> tether" >&2; exit 1; }
CNI_COMMAND=VERSION /tmp/tether-root/opt/cni/bin/tether-ipam </dev/null | grep -q supportedVersions ||
  { echo "docs-check: the installed tether-ipam does not answer VERSION" >&2; exit 1; }
echo "docs-check: docs/install.md install-by-hand: the plugins, tether and kubectl-tether installed and answering"
