#!/usr/bin/env bash
# The monitoring that ships in deploy/monitoring, checked as Prometheus reads it (`make
# monitoring-check`, part of `make test`): the PrometheusRule's groups pass `promtool check rules`
# and the unit tests of rules-test.yaml (`promtool test rules`); the dashboard's queries parse and
# name only series the docs' metric table lists. promtool is the real one, built by .ci/deps.sh.
set -euo pipefail
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
ROOT=$(cd "$HERE/../.." && pwd)
PROMTOOL=${PROMTOOL:-${PEERS_BIN_DIR:-/var/cache/tether-peers/bin}/promtool}
[ -x "$PROMTOOL" ] || { echo "monitoring-check: no promtool at $PROMTOOL: run .ci/deps.sh (make peers)" >&2; exit 1; }
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
python3 "$HERE/extract.py" "$ROOT/deploy/monitoring" "$work"
"$PROMTOOL" check rules "$work/rules.yaml"
cp "$HERE/rules-test.yaml" "$work/"
"$PROMTOOL" test rules "$work/rules-test.yaml"
"$PROMTOOL" check rules "$work/dashboard-rules.yaml"
