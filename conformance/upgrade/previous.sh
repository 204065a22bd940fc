#!/usr/bin/env bash
# tether-ipam as the last commit before uniqueness domains built it: it names a lease
# <network>.<address>. The upgrade test (ipam/operator/tests/lease_names.rs) runs it beside this
# version's, as old and new node-agents run side by side during a DaemonSet roll.
#
# Built from this repository's own history (git archive of that commit; nothing is downloaded
# but crates from the registry), once: target/previous/<commit>/tether-ipam. A clone without that
# commit (a shallow one) cannot run the upgrade test: fetch its history.
set -euo pipefail
cd "$(dirname "$0")/../.."
COMMIT=6c980264c91ee7e2346783ccf5a1128cf782cabc
OUT=target/previous/$COMMIT
if [[ -x $OUT/tether-ipam ]]; then
  exit 0
fi
if ! git cat-file -e "$COMMIT^{commit}" 2>/dev/null; then
  echo "previous: commit $COMMIT is not in this clone (shallow?): the upgrade test needs the" \
       "tether-ipam of the commit before uniqueness domains; fetch the history (git fetch --unshallow)" >&2
  exit 1
fi
src=target/previous/src
rm -rf "$src" && mkdir -p "$src" "$OUT"
git archive "$COMMIT" | tar -x -C "$src"
start=$(date +%s)
CARGO_TARGET_DIR=$PWD/target/previous/build cargo build --quiet --locked \
  --manifest-path "$src/Cargo.toml" -p tether-ipam
install -m 0755 target/previous/build/debug/tether-ipam "$OUT/tether-ipam"
rm -rf "$src"
echo "previous: tether-ipam of $COMMIT in $OUT ($(( $(date +%s) - start )) s)"
