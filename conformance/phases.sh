#!/usr/bin/env bash
# `make test`, phase by phase: run each make target given, one after another, and record how long
# it took; stop at the first that fails (its status is ours). `--report` prints the phases this
# run recorded and their total, which `make test` does at the end, also after a failure.
#
#   conformance/phases.sh deps driver bins      # times appended to target/phases.txt
#   conformance/phases.sh --report
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
LOG=${TETHER_PHASES_LOG:-target/phases.txt}
mkdir -p "$(dirname "$LOG")"

if [ "${1:-}" = --report ]; then
    [ -s "$LOG" ] || { echo "phases: none recorded in $LOG"; exit 0; }
    echo
    echo "== make test, time by phase"
    awk '{ printf "   %-18s %7.1f s  %s\n", $1, $2, ($3 == 0 ? "ok" : "FAILED (" $3 ")"); t += $2 }
         END { printf "   %-18s %7.1f s  (%.1f min)\n", "total", t, t / 60 }' "$LOG"
    exit 0
fi

for target in "$@"; do
    start=$(date +%s.%N)
    make --no-print-directory "$target"
    rc=$?
    end=$(date +%s.%N)
    awk -v t="$target" -v s="$start" -v e="$end" -v rc="$rc" 'BEGIN { printf "%s %.1f %d\n", t, e - s, rc }' >> "$LOG"
    [ "$rc" = 0 ] || exit "$rc"
done
