#!/usr/bin/env bash
# The HelmChart for RKE2's manifests directory, on stdout: helmchart.yaml.in with spec.chartContent
# set to charts/tether as `helm package` makes it (base64), and, given a values file, that file
# as spec.valuesContent (docs/install.md#rke2-with-helm).
#
#   deploy/rke2/helmchart.sh [VALUES_FILE] > tether-helmchart.yaml
#
# helm: $HELM, else the one conformance/peers/build.sh builds (PEERS_BIN_DIR), else helm on PATH.
set -euo pipefail
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd -P)
ROOT=$(cd "$HERE/../.." && pwd)
if [ -z "${HELM:-}" ]; then
  HELM=${PEERS_BIN_DIR:-/var/cache/tether-peers/bin}/helm
  [ -x "$HELM" ] || HELM=helm
fi
values=${1:-}
if [ -n "$values" ] && [ ! -r "$values" ]; then echo "helmchart.sh: cannot read $values" >&2; exit 1; fi

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
"$HELM" package "$ROOT/charts/tether" --destination "$work" >/dev/null
tgz=("$work"/tether-*.tgz)
[ ${#tgz[@]} = 1 ] && [ -s "${tgz[0]}" ] || { echo "helmchart.sh: helm package made no chart" >&2; exit 1; }
base64 -w0 "${tgz[0]}" >"$work/content"

# valuesContent is the template's last key: with a values file, its block is replaced whole.
awk -v content_file="$work/content" -v values="$values" '
  BEGIN { getline content <content_file }
  /@CHART_CONTENT@/ { sub(/@CHART_CONTENT@/, content) }
  skip { next }
  /^  valuesContent: \|-$/ && values != "" {
    print
    while ((getline line <values) > 0) print (line == "" ? "" : "    " line)
    skip = 1
    next
  }
  { print }
' "$HERE/helmchart.yaml.in"
