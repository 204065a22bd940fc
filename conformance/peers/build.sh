#!/usr/bin/env bash
# Build the real peers the tests run (kube-apiserver, kubelet, kube-controller-manager,
# kube-scheduler, kubectl, Multus thin and thick, whereabouts, cnitool, promtool, helm) from the published Go modules,
# with this machine's Go through the module registry, into PEERS_BIN_DIR
# (default /var/cache/tether-peers/bin, where ../shared/peers looks for them).
#
# Each directory beside this script is one small build module whose committed go.mod/go.sum pin
# exactly what is built; nothing else of it is committed. A module is rebuilt only when its go.mod,
# go.sum, the flags below or the Go version changed (a stamp per module in the bin dir), so a second
# run with nothing changed takes a second. Binaries are static (CGO off), -trimpath, and replace the
# old ones only once the whole module built (a runtime never sees half a set).
#
#   conformance/peers/build.sh            # build what is missing or stale, print what and how long
#   conformance/peers/build.sh --check    # exit 1 naming what is missing or stale, build nothing
set -euo pipefail
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
BIN=${PEERS_BIN_DIR:-/var/cache/tether-peers/bin}
log() { echo "peers: $*" >&2; }

# module directory | binary=package ... | ldflags. The -X flags put the released version where each
# program reports it (kubelet registers its version with the node; `multus --version`).
K8S=v1.36.3 MULTUS=v4.3.0 WHEREABOUTS=v0.9.2 CNI=v1.3.0 PROMETHEUS=3.16.0
# The oldest Kubernetes tether claims (docs/compatibility.md): its API server and kubectl, under
# their own names beside the newest's (conformance/kube/oldest.sh runs them).
K8S_OLDEST=v1.30.14
kv=k8s.io/component-base/version
mv=gopkg.in/k8snetworkplumbingwg/multus-cni.v4/pkg/multus
wv=github.com/k8snetworkplumbingwg/whereabouts/pkg/version
pv=github.com/prometheus/common/version
MODULES=(
  "kubernetes|kube-apiserver=k8s.io/kubernetes/cmd/kube-apiserver kubelet=k8s.io/kubernetes/cmd/kubelet kube-controller-manager=k8s.io/kubernetes/cmd/kube-controller-manager kube-scheduler=k8s.io/kubernetes/cmd/kube-scheduler kubectl=k8s.io/kubernetes/cmd/kubectl|-X $kv.gitVersion=$K8S -X $kv.gitMajor=1 -X $kv.gitMinor=36 -X $kv.gitTreeState=clean"
  "kubernetes-oldest|kube-apiserver-1.30=k8s.io/kubernetes/cmd/kube-apiserver kubectl-1.30=k8s.io/kubernetes/cmd/kubectl|-X $kv.gitVersion=$K8S_OLDEST -X $kv.gitMajor=1 -X $kv.gitMinor=30 -X $kv.gitTreeState=clean"
  "multus|multus=gopkg.in/k8snetworkplumbingwg/multus-cni.v4/cmd/multus multus-daemon=gopkg.in/k8snetworkplumbingwg/multus-cni.v4/cmd/multus-daemon multus-shim=gopkg.in/k8snetworkplumbingwg/multus-cni.v4/cmd/multus-shim|-X $mv.version=$MULTUS -X $mv.releaseStatus=,released"
  "whereabouts|whereabouts=github.com/k8snetworkplumbingwg/whereabouts/cmd|-X $wv.Version=$WHEREABOUTS -X $wv.ReleaseStatus=released"
  "cni|cnitool=github.com/containernetworking/cni/cnitool|"
  "prometheus|promtool=github.com/prometheus/prometheus/cmd/promtool|-X $pv.Version=$PROMETHEUS"
  # helm v3.21.4 as its release build is: the Kubernetes version of its client-go (1.36) as the
  # default .Capabilities of template and lint (unset, helm assumes 1.20, below the chart's kubeVersion).
  "helm|helm=helm.sh/helm/v3/cmd/helm|-X helm.sh/helm/v3/internal/version.version=v3.21.4 -X helm.sh/helm/v3/internal/version.gitTreeState=clean -X helm.sh/helm/v3/pkg/chartutil.k8sVersionMajor=1 -X helm.sh/helm/v3/pkg/chartutil.k8sVersionMinor=36 -X helm.sh/helm/v3/pkg/lint/rules.k8sVersionMajor=1 -X helm.sh/helm/v3/pkg/lint/rules.k8sVersionMinor=36"
)

command -v go >/dev/null || { log "Go is required (the machine's toolchain builds the peers)"; exit 1; }
# The machine's own Go, never one fetched because a go.mod asks for a newer one.
export GOTOOLCHAIN=local CGO_ENABLED=0 GOFLAGS="-trimpath -buildvcs=false -mod=readonly"
GOVERSION=$(go env GOVERSION)

stamp_of() { # module-dir ldflags binaries
  { cat "$HERE/$1/go.mod" "$HERE/$1/go.sum"; echo "$GOVERSION|$GOFLAGS|$2|$3"; } | sha256sum | cut -c1-16
}

check=0
[ "${1:-}" = --check ] && check=1
mkdir -p "$BIN"
total=$(date +%s)
stale=()
for entry in "${MODULES[@]}"; do
  IFS='|' read -r dir pairs ldflags <<<"$entry"
  names=() pkgs=()
  for p in $pairs; do names+=("${p%%=*}"); pkgs+=("${p#*=}"); done
  stamp=$(stamp_of "$dir" "$ldflags" "$pairs")
  fresh=1
  [ "$(cat "$BIN/.$dir.stamp" 2>/dev/null)" = "$stamp" ] || fresh=0
  for n in "${names[@]}"; do [ -x "$BIN/$n" ] || fresh=0; done
  if [ $fresh = 1 ]; then log "$dir: up to date (${names[*]})"; continue; fi
  if [ $check = 1 ]; then stale+=("$dir (${names[*]})"); continue; fi

  log "$dir: building ${names[*]} with $GOVERSION"
  t0=$(date +%s)
  # Downloads first, quietly and timed on their own: what a fresh machine pays the registry.
  # (`go list -deps` fetches just the modules whose packages the build loads. Its package list
  # goes nowhere: Go 1.26 prints every import path even with an empty -f.)
  (cd "$HERE/$dir" && go list -deps "${pkgs[@]}" 2>&1 >/dev/null | grep -v '^go: downloading' >&2; exit "${PIPESTATUS[0]}") ||
    { log "$dir: FAILED loading its packages (go list -deps ${pkgs[*]})"; exit 1; }
  t1=$(date +%s)
  tmp=$(mktemp -d "$BIN/.build.XXXXXX")
  trap 'rm -rf "$tmp"' EXIT
  # One `go build` for the whole module: the packages its programs share compile once, and the links
  # run side by side. Each lands under its package's last element ("cmd" for whereabouts).
  (cd "$HERE/$dir" && go build -ldflags "-s -w $ldflags" -o "$tmp/" "${pkgs[@]}") ||
    { log "$dir: FAILED building ${names[*]} (go build ${pkgs[*]})"; exit 1; }
  for i in "${!names[@]}"; do
    built=$tmp/${pkgs[$i]##*/}
    [ "$built" = "$tmp/${names[$i]}" ] || mv "$built" "$tmp/${names[$i]}"
  done
  for n in "${names[@]}"; do mv -f "$tmp/$n" "$BIN/$n"; done
  echo "$stamp" >"$BIN/.$dir.stamp"
  rm -rf "$tmp"
  trap - EXIT
  log "$dir: built in $(( $(date +%s) - t0 )) s (modules $(( t1 - t0 )) s, compile and link $(( $(date +%s) - t1 )) s)"
done

# Not programs: the Prometheus Operator's PodMonitor and PrometheusRule CRDs, which the server-side
# dry-run of deploy/monitoring needs (make manifests), copied from its published module (the Go
# module registry checks them against the checksum database) into $BIN/../crds.
PROMOP=github.com/prometheus-operator/prometheus-operator@v0.85.0
CRDS=$(dirname "$BIN")/crds
crd_files=(monitoring.coreos.com_podmonitors.yaml monitoring.coreos.com_prometheusrules.yaml)
crds_fresh=1
[ "$(cat "$CRDS/.stamp" 2>/dev/null)" = "$PROMOP" ] || crds_fresh=0
for f in "${crd_files[@]}"; do [ -s "$CRDS/$f" ] || crds_fresh=0; done
if [ $crds_fresh = 0 ] && [ $check = 1 ]; then
  stale+=("crds ($PROMOP)")
elif [ $crds_fresh = 0 ]; then
  dir=$(cd "$HERE/prometheus" && go mod download -json "$PROMOP" | python3 -c 'import json, sys; print(json.load(sys.stdin)["Dir"])') ||
    { log "crds: FAILED downloading $PROMOP"; exit 1; }
  mkdir -p "$CRDS"
  for f in "${crd_files[@]}"; do install -m 0644 "$dir/example/prometheus-operator-crd/$f" "$CRDS/$f"; done
  echo "$PROMOP" >"$CRDS/.stamp"
  log "crds: ${crd_files[*]} from $PROMOP in $CRDS"
fi
if [ $check = 1 ] && ((${#stale[@]})); then log "missing or stale in $BIN: ${stale[*]}"; exit 1; fi
log "all peers in $BIN ($(( $(date +%s) - total )) s)"
