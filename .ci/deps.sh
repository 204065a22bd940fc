#!/usr/bin/env bash
# Everything `make test` needs on a brand-new Debian 12 machine, installed idempotently.
# Root is assumed (CI and the lab both run as root: CNI plugins and netns need it).
set -euo pipefail

apt_pkgs=(
  iproute2 iputils-ping kmod jq
  tcpdump python3                 # probe tests capture on the master and run small ARP/NDP responders
  qemu-system-x86                 # the lab VM (ipvlan is not in this machine's kernel)
  socat                           # the VM's one forwarded port to the host's API server (lab/run.sh)
  golang-go golang-github-appc-cni-dev  # the libcni driver, built against Debian's real libcni
  containernetworking-plugins     # reference ipvlan/macvlan/host-local, the baseline we test against
  curl openssl                    # the real API server of the tests (conformance/kube/up.sh; etcd-server
                                  # and xz-utils are installed by ../shared/peers/unpack.sh)
  musl-tools                      # musl-gcc: ring's C for the static musl build (make build)
  binutils                        # readelf: make static-check
  buildah                         # make image: FROM scratch, offline
)
missing=()
for p in "${apt_pkgs[@]}"; do
  [[ $p == \#* ]] && continue
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  echo "deps: installing ${missing[*]}"
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi
if ! command -v vng >/dev/null; then
  echo "deps: installing virtme-ng (pip)"
  pip install --quiet virtme-ng
fi
if ! python3 -c 'import kubernetes_validate' 2>/dev/null; then
  echo "deps: installing kubernetes-validate (pip; manifest schemas, offline)"
  pip install --quiet kubernetes-validate==1.37.0
fi
# kubectl is not a Debian package; the machine image has it (/usr/bin/kubectl, with kustomize).
# `make manifests` needs it (the deploy/tether.yaml render check, the server-side dry-runs);
# conformance/kube/up.sh falls back to curl without it.
command -v kubectl >/dev/null || echo "deps: WARNING: no kubectl: \`make manifests\` will fail (render check, server-side dry-run)"
command -v cargo >/dev/null || { echo "deps: cargo is required (rustup toolchain)"; exit 1; }
# The shipped binaries are static musl builds (make build): the toolchain needs the target's std.
if ! rustup target list --installed 2>/dev/null | grep -qx x86_64-unknown-linux-musl; then
  echo "deps: adding the x86_64-unknown-linux-musl target (rustup)"
  rustup target add x86_64-unknown-linux-musl
fi
