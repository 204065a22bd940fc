#!/usr/bin/env bash
# Prove that the shipped binaries (the plugins and `tether`) run on any Linux node whatever its libc (RHEL/Rocky 8, Ubuntu
# 20.04, ...): each binary given is a static, non-PIE executable with no dynamic loader, no needed
# library and no glibc symbol version, and runs in an empty root with nothing but itself.
#
#   deploy/check-static.sh target/x86_64-unknown-linux-musl/release/tether{-ipvlan,-ipam,}
#   deploy/check-static.sh --expect-dynamic target/release/tether-ipam   # the check's own self-test
#
# `make static-check` runs both: the second proves the check fails on today's glibc build, so a
# check that always passes cannot slip in. Needs root (chroot) and readelf/ldd (binutils, libc-bin).
# QEMU=qemu-aarch64-static: the binaries are of another architecture (make release's arm64); the
# static emulator is copied into the empty root beside each and runs it there.
set -uo pipefail

expect=static
if [ "${1:-}" = --expect-dynamic ]; then expect=dynamic; shift; fi
[ $# -ge 1 ] || { echo "usage: $0 [--expect-dynamic] BINARY..." >&2; exit 2; }

status=0
for bin in "$@"; do
  name=$(basename "$bin")
  problems=()
  [ -x "$bin" ] || { echo "check-static: $bin: no such executable" >&2; status=1; continue; }
  export LC_ALL=C
  headers=$(readelf -hlW "$bin") || { echo "check-static: readelf failed on $bin" >&2; status=1; continue; }
  dynamic=$(readelf -dW "$bin")
  versions=$(readelf -VW "$bin")
  # 1. No program interpreter: the kernel runs it without ld.so.
  grep -q 'INTERP' <<<"$headers" && problems+=("has a PT_INTERP ($(grep -o 'interpreter: [^]]*' <<<"$headers"))")
  # 2. A plain executable (ET_EXEC), not PIE/static-pie (ET_DYN): nothing to relocate at start-up.
  grep -qE 'Type:[[:space:]]+EXEC' <<<"$headers" || problems+=("ELF type is not EXEC: $(grep -E 'Type:' <<<"$headers" | tr -s ' ')")
  # 3. No dynamic section at all, so no DT_NEEDED library.
  grep -q '(NEEDED)' <<<"$dynamic" && problems+=("needs $(grep '(NEEDED)' <<<"$dynamic" | grep -o '\[.*\]' | tr '\n' ' ')")
  grep -q 'There is no dynamic section' <<<"$dynamic" || problems+=("has a dynamic section")
  # 4. No symbol versions: no GLIBC_2.x requirement that an older node could not meet.
  grep -qE 'GLIBC_|\.gnu\.version_r' <<<"$versions" && problems+=("requires symbol versions: $(grep -oE 'GLIBC_[0-9.]+' <<<"$versions" | sort -uV | tail -1) ...")
  # 5. ldd agrees.
  ldd_out=$(ldd "$bin" 2>&1)
  grep -qE 'not a dynamic executable|statically linked' <<<"$ldd_out" || problems+=("ldd lists: $(tr '\n' ' ' <<<"$ldd_out")")
  # 6. It runs with nothing around it: an empty root holding only the binary (no libc, no /lib).
  if [ ${#problems[@]} -eq 0 ]; then
    root=$(mktemp -d)
    cp "$bin" "$root/$name"
    run=("/$name")
    if [ -n "${QEMU:-}" ]; then cp "$(command -v "$QEMU")" "$root/qemu" && run=(/qemu "/$name"); fi
    case $name in
      # The operator CLI prints its version; a plugin answers a runtime's VERSION.
      tether) out=$(chroot "$root" "${run[@]}" version 2>&1) ;;
      *) out=$(CNI_COMMAND=VERSION chroot "$root" "${run[@]}" </dev/null 2>&1) ;;
    esac
    rc=$?
    rm -rf "$root"
    [ $rc -eq 0 ] && grep -qE '^tether [0-9]|supportedVersions' <<<"$out" || problems+=("does not run in an empty root (exit $rc): $out")
  fi

  if [ $expect = static ]; then
    if [ ${#problems[@]} -eq 0 ]; then
      echo "check-static: $bin: static (no INTERP, ET_EXEC, no dynamic section, no symbol versions; runs in an empty root)"
    else
      echo "check-static: FAILED: $bin is not a static executable:" >&2
      printf '  - %s\n' "${problems[@]}" >&2
      status=1
    fi
  else
    if [ ${#problems[@]} -eq 0 ]; then
      echo "check-static: FAILED: self-test: $bin (a dynamic build) passed the static check" >&2
      status=1
    else
      echo "check-static: self-test: $bin is rightly refused (${problems[0]})"
    fi
  fi
done
exit $status
