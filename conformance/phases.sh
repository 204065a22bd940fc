#!/usr/bin/env bash
# `make test`, phase by phase: run each make target given, one after another, and record how long
# it took; stop at the first that fails (its status is ours). `--report` prints the phases this
# run recorded and their total, which `make test` does at the end, also after a failure.
#
#   conformance/phases.sh deps driver bins      # times appended to target/phases.txt
#   conformance/phases.sh conformance+build     # two phases at the same time (below)
#   conformance/phases.sh --report
#
# `A+B` runs A as usual and B beside it in the background at the lowest CPU priority, its output in
# target/phases/B.log (shown when it ends). What this is for: the lab VM (phase `conformance`) keeps
# about one and a half of a 2-core machine busy for most of the run; the static release build
# (`build`) fills what is left without slowing the VM, which has the timing-sensitive tests. B runs
# in a session of its own whose autogroup is niced too: with autogroup scheduling (the default on
# most distributions) a plain `nice` only counts inside one session. When A fails, B is stopped.
# The report counts B's time once, as the wait for it after A ended (`B (waited)`).
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
LOG=${TETHER_PHASES_LOG:-target/phases.txt}
mkdir -p "$(dirname "$LOG")"

if [ "${1:-}" = --report ]; then
    [ -s "$LOG" ] || { echo "phases: none recorded in $LOG"; exit 0; }
    echo
    echo "== make test, time by phase (a phase marked ‖ ran beside the one above it)"
    awk '{ status = ($3 == 0 ? "ok" : ($3 == 143 ? "stopped" : "FAILED (" $3 ")"))
           if ($4 == "bg") { printf " ‖ %-18s %7.1f s  %s\n", $1, $2, status }
           else { printf "   %-18s %7.1f s  %s\n", $1, $2, status; t += $2 } }
         END { printf "   %-18s %7.1f s  (%.1f min)\n", "total", t, t / 60 }' "$LOG"
    exit 0
fi

now() { date +%s.%N; }
# record NAME START END RC [bg]
record() {
    awk -v t="$1" -v s="$2" -v e="$3" -v rc="$4" -v bg="${5:-}" 'BEGIN { printf "%s %.1f %d %s\n", t, e - s, rc, bg }' >> "$LOG"
}

for target in "$@"; do
    fg=${target%%+*}
    bg=
    [ "$fg" = "$target" ] || bg=${target#*+}
    if [ -n "$bg" ]; then
        mkdir -p target/phases
        bglog=target/phases/$bg.log
        bgstart=$(now)
        # shellcheck disable=SC2016
        setsid bash -c 'echo 19 > /proc/self/autogroup 2>/dev/null; exec nice -n 19 make --no-print-directory "$1" >"$2" 2>&1' _ "$bg" "$bglog" &
        bgpid=$!
        echo "phases: $bg runs beside $fg at the lowest priority (pid $bgpid, output in $bglog)"
    fi
    start=$(now)
    make --no-print-directory "$fg"
    rc=$?
    end=$(now)
    record "$fg" "$start" "$end" "$rc"
    if [ -n "$bg" ]; then
        if [ "$rc" != 0 ]; then
            kill -TERM -- "-$bgpid" 2>/dev/null
        fi
        wait "$bgpid"
        bgrc=$?
        # Stopped because A failed: reported as "stopped", not as a failure of its own.
        [ "$rc" = 0 ] || bgrc=143
        bgend=$(now)
        record "$bg" "$bgstart" "$bgend" "$bgrc" bg
        record "$bg(waited)" "$end" "$bgend" "$bgrc"
        echo "== phases: output of $bg (ran beside $fg)"
        if [ "$bgrc" = 0 ]; then cat "$bglog"; else tail -n 60 "$bglog"; fi
        [ "$rc" != 0 ] || rc=$bgrc
    fi
    [ "$rc" = 0 ] || exit "$rc"
done
