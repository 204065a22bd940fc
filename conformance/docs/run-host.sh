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

# docs/install.md: the image, offline (make test built it already: this is the incremental run).
before=$(stat -c %Y target/tether-image.tar 2>/dev/null || echo 0)
bash -euo pipefail -c "$(python3 conformance/docs/blocks.py extract docs/install.md build-image)" >/dev/null
python3 deploy/check-image.py target/tether-image.tar >/dev/null ||
  { echo "docs-check: build-image left no valid target/tether-image.tar" >&2; exit 1; }
[ "$(stat -c %Y target/tether-image.tar)" -ge "$before" ] || { echo "docs-check: build-image did not write the image" >&2; exit 1; }
echo "docs-check: docs/install.md build-image: target/tether-image.tar built and valid"

# docs/install.md: a release's artifacts checked and opened as a user does (make test ran make
# release already), in a copy so the run leaves target/release-artifacts as it was.
rel=$(mktemp -d)
mkdir -p "$rel/target" && cp -r target/release-artifacts "$rel/target/"
python3 conformance/docs/blocks.py extract docs/install.md release-verify >"$rel/block.sh"
(cd "$rel" && bash -euo pipefail block.sh) >"$rel/out" ||
  { cat "$rel/out" >&2; echo "docs-check: release-verify failed" >&2; exit 1; }
grep -q '"target": "x86_64-unknown-linux-musl"' "$rel/out" ||
  { echo "docs-check: release-verify did not print the amd64 tether's version:" >&2; cat "$rel/out" >&2; exit 1; }
rm -rf "$rel"
echo "docs-check: docs/install.md release-verify: SHA256SUMS hold, the amd64 tether runs"
