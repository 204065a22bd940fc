#!/usr/bin/env bash
# `make release`: the release artifacts of this checkout, offline, into target/release-artifacts/:
#
#   tether-<v>-linux-{amd64,arm64}.tar.gz   the three static binaries, kubectl-tether (a link to
#                                           tether), LICENSE, CHANGELOG.md, examples/ (the example
#                                           NADs) and recipes/smoke-test.yaml: the README's quick start
#   tether-<v>-image-{amd64,arm64}.oci.tar  the node-agent image of one architecture (OCI archive)
#   tether-<v>-image.oci.tar                both, under one multi-arch image index
#   tether-<v>.yaml                         deploy/tether.yaml naming this release's image
#   tether-<v>.tgz                          the Helm chart (charts/tether), when the chart exists
#   tether-<v>-linux-{amd64,arm64}.cdx.json the SBOM of the crates in that architecture's binaries
#                                           (CycloneDX 1.5, by cargo-cyclonedx: deploy/sbom.py)
#   SHA256SUMS                              of all of the above
#
# The binaries must be built already (make release builds both targets first). Each architecture is
# checked before anything of it is packed: static (deploy/check-static.sh), then run through
# conformance/release/smoke.sh (arm64 under qemu-user). IMAGE (default tether:<v>) names the image
# in the archives and in the YAML; the archives name it fully (docker.io/library/tether:<v>), which
# is what a kubelet pulls for `tether:<v>`, so `ctr -n k8s.io images import` makes it present.
set -euo pipefail
cd "$(dirname "$0")/.."
VERSION=$(sed -n 's/^version = "\(.*\)"/\1/p' Cargo.toml | head -1)
IMAGE=${IMAGE:-tether:$VERSION}
OUT=${RELEASE_OUT:-target/release-artifacts}
BUILDAH=(buildah --storage-driver vfs)
log() { echo "release: $*" >&2; }

# The image reference as containerd stores it: a bare name is Docker Hub's library.
full_ref() {
  local first=${1%%/*}
  if [[ $1 != */* ]]; then echo "docker.io/library/$1"
  elif [[ $first == *.* || $first == *:* || $first == localhost ]]; then echo "$1"
  else echo "docker.io/$1"; fi
}
REF=$(full_ref "$IMAGE")
[[ $REF == *:* && ${REF##*/} == *:* ]] || { log "IMAGE=$IMAGE has no tag"; exit 2; }

commit=$(git rev-parse HEAD 2>/dev/null || echo unknown)
# Neither git call here writes the index: crates/build-info rebuilds (and cargo relinks every
# binary) when it changes. `git diff` refreshes it even with --no-optional-locks; diff-index does not.
if [ -n "$(git --no-optional-locks status --porcelain --untracked-files=no 2>/dev/null)" ]; then
  log "WARNING: the tree has uncommitted changes: these artifacts are not of commit $commit alone"
  commit+=-dirty
fi
# Files get the commit's time, not the build's: the binaries' tarballs and the SBOMs of one
# commit are the same bytes whoever packs them (the image archives are not: their format stamps
# times of its own).
export SOURCE_DATE_EPOCH=${SOURCE_DATE_EPOCH:-$(git log -1 --format=%ct 2>/dev/null || echo 0)}

declare -A TRIPLE=([amd64]=x86_64-unknown-linux-musl [arm64]=aarch64-unknown-linux-musl)
BINS=(tether-ipvlan tether-ipam tether)

# What the artifacts are made of: the binaries, the commit, any change to tracked files (every other
# input is tracked) and the image name. Artifacts of the same inputs that still match their
# SHA256SUMS are kept: make e2e after make release does not spend minutes on smoke tests again.
inputs=$(
  for arch in amd64 arm64; do sha256sum "${BINS[@]/#/target/${TRIPLE[$arch]}/release/}"; done
  echo "commit $commit image $REF"
  git diff-index -p HEAD 2>/dev/null | sha256sum
)
if [ -f "$OUT/.inputs" ] && [ "$(cat "$OUT/.inputs")" = "$inputs" ] &&
  (cd "$OUT" && sha256sum --quiet --strict -c SHA256SUMS >/dev/null 2>&1); then
  log "$OUT is up to date (same binaries, commit $commit, image $REF)"
  exit 0
fi

rm -rf "$OUT" && mkdir -p "$OUT"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

list=localhost/tether-release:$VERSION
"${BUILDAH[@]}" manifest rm "$list" >/dev/null 2>&1 || true
"${BUILDAH[@]}" manifest create "$list" >/dev/null
for arch in amd64 arm64; do
  bin=target/${TRIPLE[$arch]}/release
  qemu=()
  [ "$arch" = amd64 ] || qemu=(env QEMU=qemu-aarch64-static)
  "${qemu[@]}" deploy/check-static.sh "${BINS[@]/#/$bin/}" >&2
  conformance/release/smoke.sh "$arch" "$bin" >&2

  name=tether-$VERSION-linux-$arch
  mkdir -p "$tmp/$name/examples" "$tmp/$name/recipes"
  cp "${BINS[@]/#/$bin/}" LICENSE CHANGELOG.md "$tmp/$name/"
  ln -s tether "$tmp/$name/kubectl-tether"
  cp deploy/examples/*.yaml "$tmp/$name/examples/"
  cp deploy/recipes/smoke-test.yaml "$tmp/$name/recipes/"
  tar -C "$tmp" --sort=name --owner=0 --group=0 --numeric-owner --mtime="@$SOURCE_DATE_EPOCH" -cf - "$name" |
    gzip -n9 >"$OUT/$name.tar.gz"

  # FROM scratch with COPY only: nothing runs during the build, so no emulator is needed for arm64.
  ctx=$tmp/image-$arch
  mkdir -p "$ctx" && cp "${BINS[@]/#/$bin/}" "$ctx/"
  "${BUILDAH[@]}" build --quiet --pull=never --isolation chroot --platform "linux/$arch" \
    --build-arg VERSION="$VERSION" --timestamp "$SOURCE_DATE_EPOCH" \
    -f deploy/Containerfile -t "$list-$arch" "$ctx" >/dev/null
  "${BUILDAH[@]}" push --quiet "$list-$arch" "oci-archive:$OUT/tether-$VERSION-image-$arch.oci.tar:$REF"
  "${BUILDAH[@]}" manifest add "$list" "containers-storage:$list-$arch" >/dev/null
  python3 deploy/check-image.py --arch "$arch" "$OUT/tether-$VERSION-image-$arch.oci.tar" >&2
done
"${BUILDAH[@]}" manifest push --quiet --all "$list" "oci-archive:$OUT/tether-$VERSION-image.oci.tar:$REF"
python3 deploy/check-image.py --arch amd64 --arch arm64 "$OUT/tether-$VERSION-image.oci.tar" >&2
"${BUILDAH[@]}" manifest rm "$list" >/dev/null
"${BUILDAH[@]}" rmi "$list-amd64" "$list-arm64" >/dev/null

# The one-file install, naming this release's image (deploy/tether.yaml names tether:<v>).
n=$(grep -c "^ *image: tether:$VERSION\$" deploy/tether.yaml || true)
[ "$n" = 2 ] || { log "deploy/tether.yaml names image tether:$VERSION $n times, expected 2 (make render?)"; exit 1; }
sed "s|^\( *image: \)tether:$VERSION\$|\1$IMAGE|" deploy/tether.yaml >"$OUT/tether-$VERSION.yaml"

if [ -d charts/tether ]; then
  helm=${HELM:-${PEERS_BIN_DIR:-/var/cache/tether-peers/bin}/helm}
  "$helm" package charts/tether --version "$VERSION" --app-version "$VERSION" -d "$tmp/chart" >/dev/null
  mv "$tmp/chart/tether-$VERSION.tgz" "$OUT/"
fi

python3 deploy/sbom.py "$OUT"

(cd "$OUT" && sha256sum -- * >SHA256SUMS)
echo "$inputs" >"$OUT/.inputs"
log "$OUT (version $VERSION, commit $commit, image $REF):"
(cd "$OUT" && ls -l --time-style=+ -- * | awk '{printf "  %10d  %s\n", $5, $NF}') >&2
