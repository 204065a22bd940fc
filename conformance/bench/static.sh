#!/usr/bin/env bash
# Static (shipped) next to dynamic (glibc) binaries, in one run: is the static build as fast?
#
#   conformance/bench/static.sh          # (make bench-static) builds both, then measures
#
# 1. exec cost: CNI_COMMAND=VERSION round trips of each plugin, what a runtime pays before any
#    work; dynamic and static runs interleaved one by one, so load on the machine hits both alike.
#    p50/p90/mean in ms, and the ratio static/dynamic of the p50.
# 2. work: bench-ipam (tether-ipam ADD/DEL with the file store, each call a fresh process) with
#    TETHER_BIN_DIR pointing at each build in turn (BENCH_CONCURRENCY, default 1).
# The attach path in the lab VM: BENCH_BIN_DIR=target/x86_64-unknown-linux-musl/release make bench-attach.
#
# Knobs: BENCH_RUNS=400 (VERSION runs per binary), BENCH_SKIP_IPAM=1 (only the exec cost),
# BENCH_NO_BUILD=1 (measure the binaries as they are).
set -euo pipefail
export LC_ALL=C

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
ROOT=$(cd "$HERE/../.." && pwd)
RUNS=${BENCH_RUNS:-400}
DYN=$ROOT/target/release
STATIC=$ROOT/target/x86_64-unknown-linux-musl/release
cd "$ROOT"
if [ "${BENCH_NO_BUILD:-}" != 1 ]; then
  cargo build --release --locked --bin tether-ipvlan --bin tether-ipam >&2
  cargo build --release --locked --target x86_64-unknown-linux-musl --bin tether-ipvlan --bin tether-ipam >&2
fi

# one <binary>: microseconds of one VERSION round trip.
one() {
  local t0=$EPOCHREALTIME
  CNI_COMMAND=VERSION "$1" </dev/null >/dev/null
  local t1=$EPOCHREALTIME
  echo $(( (${t1/./} - ${t0/./}) ))
}
stats() { # stdin: microseconds, one a line -> "p50 p90 mean" in ms
  sort -n | awk '{a[NR]=$1; s+=$1} END {printf "%.2f %.2f %.2f\n", a[int(NR*0.5)+1]/1000, a[int(NR*0.9)+1]/1000, s/NR/1000}'
}

echo "bench-static: $RUNS CNI_COMMAND=VERSION runs per binary, dynamic and static interleaved"
printf '%-14s %-8s %9s %9s %9s %9s\n' binary build "size MiB" "p50 ms" "p90 ms" "mean ms"
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
for b in tether-ipvlan tether-ipam; do
  for _ in 1 2 3 4 5; do one "$DYN/$b" >/dev/null; one "$STATIC/$b" >/dev/null; done # warm-up
  for _ in $(seq "$RUNS"); do
    one "$DYN/$b" >>"$tmp/$b.dyn"
    one "$STATIC/$b" >>"$tmp/$b.static"
  done
  for kind in dyn static; do
    dir=$DYN; [ $kind = static ] && dir=$STATIC
    size=$(stat -c %s "$dir/$b")
    read -r p50 p90 mean < <(stats <"$tmp/$b.$kind")
    printf '%-14s %-8s %9.1f %9s %9s %9s\n' "$b" "$kind" "$(echo "$size / 1048576" | bc -l)" "$p50" "$p90" "$mean"
    echo "$p50" >"$tmp/$b.$kind.p50"
  done
  echo "  $b static/dynamic p50: $(echo "scale=2; $(cat "$tmp/$b.static.p50") / $(cat "$tmp/$b.dyn.p50")" | bc -l)"
done

if [ "${BENCH_SKIP_IPAM:-}" != 1 ]; then
  for dir in "$DYN" "$STATIC"; do
    echo
    echo "== bench-ipam with TETHER_BIN_DIR=${dir#"$ROOT"/}"
    TETHER_BIN_DIR=$dir BENCH_CONCURRENCY=${BENCH_CONCURRENCY:-1} \
      cargo run --release --locked -q -p tether-conformance --bin bench-ipam
  done
fi
