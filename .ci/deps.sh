#!/usr/bin/env bash
# Everything `make test` needs on a brand-new Debian 12 machine, installed idempotently.
# Root is assumed (CI and the lab both run as root: CNI plugins and netns need it).
set -euo pipefail

apt_pkgs=(
  iproute2 iputils-ping kmod jq
  time                            # GNU time: the hostile-input suite bounds each call's peak RSS
  tcpdump python3                 # probe tests capture on the master and run small ARP/NDP responders
  qemu-system-x86                 # the lab VM (ipvlan is not in this machine's kernel)
  socat                           # the VM's one forwarded port to the host's API server (lab/run.sh)
  golang-go golang-github-appc-cni-dev  # the libcni driver, built against Debian's real libcni
  containernetworking-plugins     # reference ipvlan/macvlan/host-local, the baseline we test against
  curl openssl                    # the real API server of the tests (conformance/kube/up.sh)
  etcd-server                     # its store (Debian's etcd 3.4; the Kubernetes peers are built below)
  musl-tools                      # musl-gcc: ring's C for the static musl build (make build)
  gcc-aarch64-linux-gnu libc6-dev-arm64-cross  # make release: the arm64 link and ring's C (docs/releasing.md)
  qemu-user-static                # make release: the arm64 binaries run here under qemu-user
  binutils                        # readelf: make static-check
  buildah                         # make image: FROM scratch, offline
  containerd runc iptables        # make e2e: the real node's runtime (in the lab VM), its Service DNAT
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
  # Debian starts etcd and containerd services on install; the tests start their own (on their own
  # ports; containerd only inside the lab VM).
  if [[ -d /run/systemd/system ]]; then
    [[ " ${missing[*]} " != *" etcd-server "* ]] || systemctl disable --now etcd >/dev/null 2>&1 || true
    [[ " ${missing[*]} " != *" containerd "* ]] || systemctl disable --now containerd >/dev/null 2>&1 || true
  fi
fi
if ! command -v vng >/dev/null; then
  echo "deps: installing virtme-ng (pip)"
  pip install --quiet virtme-ng
fi
if ! python3 -c 'import kubernetes_validate' 2>/dev/null; then
  echo "deps: installing kubernetes-validate (pip; manifest schemas, offline)"
  pip install --quiet kubernetes-validate==1.37.0
fi
command -v cargo >/dev/null || { echo "deps: cargo is required (rustup toolchain)"; exit 1; }
# The shipped binaries are static musl builds (make build): the toolchain needs the target's std.
if ! rustup target list --installed 2>/dev/null | grep -qx x86_64-unknown-linux-musl; then
  echo "deps: adding the x86_64-unknown-linux-musl target (rustup)"
  rustup target add x86_64-unknown-linux-musl
fi
# make release cross-builds arm64 and writes the SBOM with cargo-cyclonedx (a CycloneDX project).
if ! rustup target list --installed 2>/dev/null | grep -qx aarch64-unknown-linux-musl; then
  echo "deps: adding the aarch64-unknown-linux-musl target (rustup)"
  rustup target add aarch64-unknown-linux-musl
fi
# (It prints its version as "cargo-cyclonedx-cyclonedx X".)
CYCLONEDX=0.5.9
if [ "$(cargo cyclonedx --version 2>/dev/null)" != "cargo-cyclonedx-cyclonedx $CYCLONEDX" ]; then
  echo "deps: installing cargo-cyclonedx $CYCLONEDX (crates.io)"
  cargo install --quiet --locked cargo-cyclonedx --version "$CYCLONEDX"
fi
# The real peers (kube-apiserver, kubelet, kube-controller-manager, kube-scheduler, kubectl, Multus,
# whereabouts, cnitool), built from the published Go modules pinned under conformance/peers/ into
# PEERS_BIN_DIR (default /var/cache/tether-peers/bin); a no-op when nothing changed.
conformance/peers/build.sh
