#!/usr/bin/env bash
# Smoke-test one architecture's release binaries: exactly what a node runs, on a machine that may
# not be of that architecture (arm64 runs here under qemu-user, qemu-aarch64-static).
#
#   conformance/release/smoke.sh amd64 DIR          # DIR holds tether, tether-ipam, tether-ipvlan
#   conformance/release/smoke.sh arm64 DIR          # the same through qemu-aarch64-static
#
# Checks: each binary is an ELF of that machine; `tether version -o json` names the version and
# target; the plugins answer CNI VERSION; tether-ipam ADDs from a node-local file store, the lease
# is listed by `tether leases`, DEL releases it; a broken range is CNI error 7 with a message and
# nothing written; tether-ipvlan without a netns is a CNI error, not a crash. Exit 0 only if all pass.
set -euo pipefail
arch=${1:?usage: smoke.sh amd64|arm64 DIR}
dir=${2:?usage: smoke.sh amd64|arm64 DIR}
version=$(sed -n 's/^version = "\(.*\)"/\1/p' "$(dirname "$0")/../../Cargo.toml" | head -1)
case $arch in
  amd64) machine="Advanced Micro Devices X86-64" triple=x86_64-unknown-linux-musl run=() ;;
  arm64) machine=AArch64 triple=aarch64-unknown-linux-musl run=(qemu-aarch64-static) ;;
  *) echo "smoke: unknown architecture $arch" >&2; exit 2 ;;
esac
if ((${#run[@]})) && ! command -v "${run[0]}" >/dev/null; then
  echo "smoke: FAILED: ${run[0]} is missing (Debian's qemu-user-static; .ci/deps.sh installs it)" >&2
  exit 1
fi
fail() { echo "smoke($arch): FAILED: $*" >&2; exit 1; }
state=$(mktemp -d)
trap 'rm -rf "$state"' EXIT

for b in tether tether-ipam tether-ipvlan; do
  [ -x "$dir/$b" ] || fail "no executable $dir/$b"
  got=$(LC_ALL=C readelf -h "$dir/$b" | sed -n 's/^ *Machine: *//p')
  [ "$got" = "$machine" ] || fail "$b is built for '$got', not $machine"
done

# The commit the binary names is this checkout's (a build that fell back to "unknown", e.g. git
# refusing the directory, would ship without one).
commit=$(git -C "$(dirname "$0")" rev-parse HEAD)
v=$("${run[@]}" "$dir/tether" version -o json) || fail "tether version -o json: exit $?"
jq -e --arg v "$version" --arg t "$triple" --arg c "$commit" \
  '.version == $v and .target == $t and (.commit | startswith($c))' <<<"$v" >/dev/null ||
  fail "tether version -o json said $v (want version $version, target $triple, commit $commit)"

cni() { # verb plugin [stdin] -> stdout; the exit status is the plugin's
  CNI_COMMAND=$1 CNI_CONTAINERID=smoke-c1 CNI_NETNS=${NETNS:-/var/run/netns/none} CNI_IFNAME=net1 \
    CNI_PATH="$dir" "${run[@]}" "$dir/$2" <<<"${3:-}" 2>>"$state/stderr"
}
for p in tether-ipam tether-ipvlan; do
  out=$(cni VERSION "$p" '{"cniVersion":"1.1.0"}') || fail "$p VERSION: exit $?"
  jq -e '.supportedVersions | index("1.1.0")' <<<"$out" >/dev/null || fail "$p VERSION said $out"
done

conf=$(jq -nc --arg d "$state/leases" '{cniVersion: "1.1.0", name: "smoke", type: "tether-ipam",
  ipam: {type: "tether-ipam", range: "192.0.2.0/29", dataDir: $d, probe: false, cooldown_s: 0}}')
out=$(cni ADD tether-ipam "$conf") || fail "ADD: exit $?: $out"
addr=$(jq -r '.ips[0].address' <<<"$out")
[[ $addr == 192.0.2.*/29 ]] || fail "ADD gave $out"
leases() { "${run[@]}" "$dir/tether" leases --data-dir "$state/leases" -o json 2>/dev/null; }
leases | jq -e --arg a "${addr%/*}" '.items[] | select(.address == $a and .containerID == "smoke-c1" and .state == "Leased")' \
  >/dev/null || fail "the lease of $addr is not listed as Leased: $(leases)"
cni DEL tether-ipam "$conf" >/dev/null || fail "DEL: exit $?"
leases | jq -e --arg a "${addr%/*}" '.items[] | select(.address == $a and .state == "Released")' >/dev/null ||
  fail "DEL did not release $addr: $(leases)"

bad=$(jq -c '.ipam.range = "192.0.2.0/33" | .ipam.dataDir += "-bad"' <<<"$conf")
if out=$(cni ADD tether-ipam "$bad"); then fail "ADD with range /33 succeeded: $out"; fi
jq -e '.code == 7 and (.msg | test("192.0.2.0/33"))' <<<"$out" >/dev/null || fail "a /33 range gave $out, not error 7 naming it"
[ ! -e "$state/leases-bad" ] || fail "a refused ADD left $state/leases-bad behind"

ipvlan=$(jq -c '.type = "tether-ipvlan" | .master = "smoke0"' <<<"$conf")
if out=$(NETNS=$state/no-such-netns cni ADD tether-ipvlan "$ipvlan"); then fail "tether-ipvlan ADD without a netns succeeded"; fi
jq -e '.code > 0 and (.msg | length > 0)' <<<"$out" >/dev/null || fail "tether-ipvlan without a netns gave '$out', not a CNI error"

echo "smoke($arch): $dir: $(jq -r '"\(.version) \(.target)"' <<<"$v"); VERSION, file-store ADD $addr/DEL, error paths: ok"
