# tether — build, install, test. Run as root: tests create network namespaces and links.
SHELL     := /bin/bash
CARGO     ?= cargo
DESTDIR   ?=
BINDIR    ?= /opt/cni/bin
# The CNI plugins (installed into BINDIR, exec'd by the runtime for every pod) and the operator and
# node-agent program `tether` (SBINDIR; in the image, the DaemonSet's entrypoint).
PLUGINS   := tether-ipvlan tether-ipam
OPERATOR  := tether
BINS      := $(PLUGINS) $(OPERATOR)
SBINDIR   ?= /usr/local/bin
# What ships (make build/install/image) is static musl binaries: they run on every node whatever its
# libc (RHEL/Rocky 8, Ubuntu 20.04, ...). .cargo/config.toml sets the target's flags (crt-static,
# non-PIE) and ring's C compiler (musl-gcc, Debian's musl-tools). The glibc builds in
# target/{debug,release} stay what the tests and the lab VM run.
MUSL      := x86_64-unknown-linux-musl
STATIC    := target/$(MUSL)/release
# arm64 (Grace Hopper / Grace Blackwell GPU nodes) is cross-built for make release with Debian's
# gcc-aarch64-linux-gnu (.cargo/config.toml; why: docs/releasing.md) and run here under qemu-user.
ARM64     := aarch64-unknown-linux-musl
# The release version: the workspace's (Cargo.toml), also the image's tag and the chart's version.
VERSION   := $(shell sed -n 's/^version = "\(.*\)"/\1/p' Cargo.toml | head -1)
IMAGE     ?= tether:$(VERSION)
# Building FROM scratch as root here: vfs storage (no overlay mount needed), chroot isolation.
BUILDAH   ?= buildah --storage-driver vfs

# The real peers (kube-apiserver, kubelet, controllers, kubectl, Multus, whereabouts, cnitool), built from
# published Go modules by .ci/deps.sh (conformance/peers/build.sh). Every script and test finds them here,
# and uses that kubectl (the machine's own may be missing, or of another version than the API server).
export PEERS_BIN_DIR ?= /var/cache/tether-peers/bin
export KUBECTL ?= $(PEERS_BIN_DIR)/kubectl

# Conformance tests are split by what they need: host_* run on this kernel (netns, veth, macvlan),
# lab_* need ipvlan and run on a kernel that has it — here, or in the lab VM (conformance/lab/).
HOST_TESTS := $(sort $(basename $(notdir $(wildcard conformance/tests/host_*.rs))))
LAB_TESTS  := $(sort $(basename $(notdir $(wildcard conformance/tests/lab_*.rs))))

BENCH_BIN := $(CARGO) run --release --locked -p tether-conformance --bin

.PHONY: kube-oldest release previous peers bins bench bench-agents bench-attach bench-kube bench-ipam bench-probe bench-static all build install image render static-check test unit kube-up kube-down host-tests lab-tests conformance manifests fuzz-regressions fuzz driver deps demo fmt clippy clean docs-check

all: build

build:
	$(CARGO) build --release --locked --target $(MUSL) $(addprefix --bin ,$(BINS))

# Copy to a temporary name and rename, so a runtime never executes a half-written binary.
install: build
	install -d -m 0755 $(DESTDIR)$(BINDIR) $(DESTDIR)$(SBINDIR)
	@for b in $(BINS); do \
	  dir=$(DESTDIR)$(BINDIR); [ $$b = $(OPERATOR) ] && dir=$(DESTDIR)$(SBINDIR); \
	  tmp=$$dir/.$$b.tmp.$$$$; \
	  install -m 0755 $(STATIC)/$$b $$tmp && mv -f $$tmp $$dir/$$b || { rm -f $$tmp; exit 1; }; \
	  echo "installed $$dir/$$b"; \
	done
	@# The same binary is kubectl's plugin `kubectl tether` under this name.
	ln -sfn $(OPERATOR) $(DESTDIR)$(SBINDIR)/kubectl-tether

deps:
	.ci/deps.sh

# The peers alone (what deps does last): rebuilds a module whose go.mod/go.sum changed.
peers:
	conformance/peers/build.sh

# The shipped binaries are static: no INTERP, ET_EXEC, no dynamic section, no GLIBC_ symbol
# versions, ldd agrees, and each runs in an empty root. Then the check's self-test: it must refuse
# the (dynamic) glibc debug builds.
static-check: build
	deploy/check-static.sh $(addprefix $(STATIC)/,$(BINS))
	$(CARGO) build --locked $(addprefix --bin ,$(BINS))
	deploy/check-static.sh --expect-dynamic $(addprefix target/debug/,$(BINS))

# The node-agent image, offline: FROM scratch (no base image, nothing pulled) holding the three static
# binaries, built with Debian's buildah; also saved as target/tether-image.tar (docker-archive) for
# registries (skopeo/podman load) or RKE2's /var/lib/rancher/rke2/agent/images/ (imported on start).
image: build
	rm -rf target/image && mkdir -p target/image
	cp $(addprefix $(STATIC)/,$(BINS)) target/image/
	$(BUILDAH) build --pull=never --isolation chroot --build-arg VERSION=$(VERSION) -f deploy/Containerfile -t $(IMAGE) target/image
	rm -f target/tether-image.tar
	$(BUILDAH) push $(IMAGE) docker-archive:target/tether-image.tar:$(IMAGE)
	python3 deploy/check-image.py target/tether-image.tar

# The release artifacts in target/release-artifacts/ (deploy/release.sh): per architecture (amd64,
# arm64) the binaries' tarball and an OCI image archive, both under one multi-arch image index, the
# YAML naming $(IMAGE), the chart, a CycloneDX SBOM and SHA256SUMS. Offline, as make image is;
# each architecture is checked static and smoke-tested first (conformance/release/smoke.sh).
release: build
	$(CARGO) build --release --locked --target $(ARM64) $(addprefix --bin ,$(BINS))
	IMAGE=$(IMAGE) deploy/release.sh

# deploy/tether.yaml, the one-file install (RKE2 auto-deploy), from deploy/base.
render:
	python3 deploy/validate.py --render

driver:
	conformance/libcni-driver/build.sh

# One real Kubernetes API server (kube-apiserver + etcd from ../shared/peers, conformance/kube/)
# for the whole run: started before the test phases, TETHER_TEST_KUBECONFIG exported to them,
# stopped at the end, also on failure.
# The API-server suites against the oldest Kubernetes tether claims (1.30.14, docs/compatibility.md),
# on a server of its own (target/peers-k8s-oldest, port 27443); about 90 s.
kube-oldest:
	conformance/kube/oldest.sh

# Each phase is timed (conformance/phases.sh); the times are printed at the end, also on failure.
# Last, `e2e`: a real node (kubelet + containerd in the lab VM) with tether installed from its image.
# One phase at a time: on this 2-core machine a build beside the lab VM, even at the lowest
# priority, slowed the VM's tests by a third and saved nothing (measured: 1,207 s for both, side by
# side, against 389 + ~800 s one after the other).
PHASES := target/phases.txt
test:
	@rm -f $(PHASES)
	@status=0; \
	  conformance/phases.sh deps driver bins && \
	  $(KUBE) conformance/phases.sh clippy unit fuzz-regressions manifests kube-oldest build static-check image release docs-check conformance e2e || status=$$?; \
	  conformance/phases.sh --report; exit $$status

bins:
	$(CARGO) build --locked --workspace --bins

# Test output is kept in target/conformance/ for the checklist table (conformance/report.py).
LOGS := target/conformance
# Tests of the Kubernetes store, engine, reconciler and CLI need a real API server: they are
# #[ignore = "needs a real API server: ..."] and run here with --include-ignored when one is up
# (`make unit` alone starts and stops its own; TETHER_TEST_KUBECONFIG set: that one). Without
# ../shared/peers they are NOT RUN: a banner, and the checklist table says NOT RUN; that alone
# does not fail the run unless TETHER_REQUIRE_KUBE=1 (CI). KUBE_SKIP: ignored for another reason.
KUBE      := conformance/kube/with-server.sh
KUBE_SKIP := --skip rss_with_5000_pods
unit: previous
	@mkdir -p $(LOGS)
	$(KUBE) bash -c 'set -o pipefail; args=(); [ -n "$${TETHER_TEST_KUBECONFIG:-}" ] && args=(--include-ignored $(KUBE_SKIP)); \
	  $(CARGO) test --locked --workspace -- "$${args[@]}" 2>&1 | tee $(LOGS)/unit.log'

# tether-ipam of the commit before uniqueness domains (it names leases <network>.<address>), for the
# upgrade test beside this version (ipam/operator/tests/lease_names.rs); built once from git history.
previous:
	conformance/upgrade/previous.sh

# The API server alone, e.g. to run single tests against it by hand:
#   make kube-up && export TETHER_TEST_KUBECONFIG=$PWD/target/peers-k8s/kubeconfig
#   cargo test -p tether-kube-store --test store -- --include-ignored; make kube-down
kube-up:
	conformance/kube/up.sh

kube-down:
	conformance/kube/down.sh

host-tests:
	@mkdir -p $(LOGS)
	set -o pipefail; $(CARGO) test --locked --workspace $(addprefix --test ,$(HOST_TESTS)) 2>&1 | tee $(LOGS)/host.log

# Saved fuzz inputs (crashes found by `make fuzz`, edge cases) replayed on stable Rust. The fuzz
# crate is a workspace of its own; building it in the workspace's target dir reuses the debug
# builds of the dependencies they share instead of compiling them again; without default features
# it skips libFuzzer's C++ and the fuzz targets, which only `make fuzz` needs.
fuzz-regressions:
	CARGO_TARGET_DIR=$(CURDIR)/target $(CARGO) test --locked --manifest-path conformance/fuzz/Cargo.toml --no-default-features --test regressions

# Each cargo-fuzz target for FUZZ_SECONDS (not in CI). A crash is copied into
# conformance/fuzz/regressions/<target>/ so it becomes a regression test, and the run fails.
# cargo-fuzz needs nightly flags; RUSTC_BOOTSTRAP lets this machine's stable toolchain take them.
FUZZ_SECONDS ?= 60
FUZZ_TARGETS := netconf cni_args range result store_file
fuzz:
	@command -v cargo-fuzz >/dev/null || $(CARGO) install cargo-fuzz --locked
	@status=0; for t in $(FUZZ_TARGETS); do \
	  echo "== fuzz $$t ($(FUZZ_SECONDS) s)"; \
	  if ! RUSTC_BOOTSTRAP=1 $(CARGO) fuzz run --fuzz-dir conformance/fuzz $$t -- -max_total_time=$(FUZZ_SECONDS) >conformance/fuzz/$$t.log 2>&1; then \
	    status=1; tail -30 conformance/fuzz/$$t.log; \
	    for a in conformance/fuzz/artifacts/$$t/crash-* conformance/fuzz/artifacts/$$t/oom-* conformance/fuzz/artifacts/$$t/timeout-*; do \
	      [ -f "$$a" ] && cp "$$a" conformance/fuzz/regressions/$$t/ && echo "saved $$a as a regression input"; done; \
	  else grep -E '^Done' conformance/fuzz/$$t.log; fi; \
	done; exit $$status

# Every manifest under deploy/ against Kubernetes schemas and the plugin's own config parser
# (`validate --strict`: no NAD shares a range across nodes through file stores; the README's NAD
# too), deploy/tether.yaml against a fresh render, and every manifest with a server-side dry-run on
# the real API server (started here unless TETHER_TEST_KUBECONFIG is set); then charts/tether with the
# real helm (conformance/helm/check.py: lint, its default render equal to deploy/tether.yaml object
# for object, other values' renders, the docs' helm blocks on an API server of its own).
manifests:
	$(CARGO) build --locked --bin tether
	$(KUBE) python3 deploy/validate.py
	conformance/monitoring/check.sh
	$(KUBE) python3 conformance/helm/check.py

# The docs' command blocks: each has a runner (conformance/docs/blocks.py), and those that run on
# this host run here; the e2e runs those of the real node.
docs-check: build
	python3 conformance/docs/blocks.py check .
	conformance/docs/run-host.sh

lab-tests:
	@mkdir -p $(LOGS)
	set -o pipefail; conformance/lab/run-tests.sh $(LAB_TESTS) 2>&1 | tee $(LOGS)/lab.log

# The checklist (conformance/checklist.md) item by item, from the host and lab runs.
conformance: host-tests lab-tests
	python3 conformance/report.py $(LOGS)/unit.log $(LOGS)/host.log $(LOGS)/lab.log

demo: deps driver
	$(CARGO) build --locked --workspace --bins
	conformance/lab/run.sh conformance/demo/demo.sh

# A real node (issue 23, docs/e2e.md): etcd, kube-apiserver, controller-manager and scheduler here on
# the host; containerd + kubelet in the lab VM (ipvlan), reaching the API server through its one
# forwarded port; tether installed from the image by deploy/tether.yaml, unchanged; the seed's pods,
# their lifecycle through the kubelet and five faults as users see them (docs/e2e.md). The VM is
# killed after E2E_TIMEOUT s; everything started is stopped by pid. Logs and times:
# target/lab/e2e/. Ports (host loopback) 47443, 47379, 47380, 47257, 47259: TETHER_E2E_*_PORT.
E2E_TIMEOUT ?= 3000
.PHONY: e2e e2e-two-nodes bench-node
e2e: image release
	TETHER_E2E_TIMEOUT=$(E2E_TIMEOUT) conformance/e2e/run.sh

# Only the two-node part of `make e2e` (docs/e2e.md#two-nodes-on-one-wire), on a fresh install: a
# second kubelet + containerd in the same VM, in namespaces of its own, its NICs on the same
# segments; pods across, B's partition, A's deletion.
e2e-two-nodes: image release
	TETHER_E2E_TIMEOUT=1500 TETHER_E2E_PARTITION=1 TETHER_E2E_CHECKS="install.sh test-two-nodes.sh test-node-gone.sh" conformance/e2e/run.sh

# The same node, benchmarked (conformance/e2e/bench-node.sh): BENCH_NODE_PODS pods with two
# attachments each to Running, tether-ipvlan + tether-ipam vs the reference ipvlan + whereabouts,
# same node, same run; the table lands in target/lab/e2e/bench-node.md.
BENCH_NODE_PODS ?= 50
BENCH_NODE_ROUNDS ?= 1
# The reference's round alone may use 600 s and its teardown minutes more (see bench-node.sh).
BENCH_NODE_TIMEOUT ?= 3000
bench-node: image release
	TETHER_E2E_TIMEOUT=$(BENCH_NODE_TIMEOUT) TETHER_E2E_CHECKS="install.sh bench-node.sh" \
	  TETHER_BENCH_NODE_PODS=$(BENCH_NODE_PODS) TETHER_BENCH_NODE_ROUNDS=$(BENCH_NODE_ROUNDS) conformance/e2e/run.sh

# Benchmarks (not tests): each prints a table with ratios against the reference measured in the same run.
bench-ipam:
	$(CARGO) build --release --locked --bin tether-ipam
	$(BENCH_BIN) bench-ipam

bench-probe:
	$(CARGO) build --release --locked --bin tether-ipam
	$(BENCH_BIN) bench-probe

# bench-attach and bench-kube measure what ships: the static musl binaries of `make build`.
bench-attach: build
	BENCH_BIN_DIR=$(CURDIR)/$(STATIC) conformance/bench/attach.sh

# The shipped static binaries next to the glibc builds: VERSION exec cost and bench-ipam for each.
bench-static:
	conformance/bench/static.sh

# tether-ipam's Kubernetes store next to whereabouts on a real kube-apiserver + etcd of its own
# (../shared/peers or TETHER_PEERS; loopback, ports 36443/43790/43800, stopped at the end).
# Options go in BENCH_KUBE_ARGS, e.g. BENCH_KUBE_ARGS="--n 100 --n-whereabouts 50".
BENCH_KUBE_ARGS ?=
bench-kube: build
	TETHER_BIN_DIR=$(CURDIR)/$(STATIC) $(BENCH_BIN) bench-kube $(if $(BENCH_KUBE_ARGS),-- $(BENCH_KUBE_ARGS))

# The lease reconciler at 10, 50 and 200 simulated nodes (each a `tether node-agent` process with its
# own node credential) with pod churn, node deletion, node silence and a real outage (kube-apiserver
# killed, etcd kept), on a server of its own (conformance/kube/up.sh: target/bench-agents-k8s,
# loopback, ports 38443/45790/45800, stopped at the end). `make test` runs the same scenario small
# (ipam/operator/tests/agents_faults.rs). Options in BENCH_AGENTS_ARGS, e.g. BENCH_AGENTS_ARGS="--nodes 10,100".
BENCH_AGENTS_ARGS ?=
bench-agents: build
	TETHER_BIN_DIR=$(CURDIR)/$(STATIC) $(BENCH_BIN) bench-agents $(if $(BENCH_AGENTS_ARGS),-- $(BENCH_AGENTS_ARGS))

# All of the above and bench-node in one run, then BENCHMARKS.md and docs/benchmarks.png, whole, from
# their output (conformance/bench/report.py). The tree must be clean: each benchmark records the
# commit and the tree's state as it starts and ends (target/bench/<name>.rev), and the report
# refuses inputs of different commits or of a tree with changes, and names the commit it measured.
# To bench a tree others are editing, bench a clean clone at a commit. About an hour here from a
# clean clone (2 cores, builds included): bench-node about 22 min, bench-agents about 5 min per
# cluster size. BENCH_NODE_PODS, BENCH_AGENTS_ARGS, BENCH_KUBE_ARGS apply.
BENCH_OUT := target/bench
BENCH_STEPS := attach ipam kube static probe agents node
bench:
	python3 conformance/bench/report.py --check-tree
	@rm -rf $(BENCH_OUT) && mkdir -p $(BENCH_OUT)/samples
	python3 -c 'import matplotlib' 2>/dev/null || pip install --quiet matplotlib
	set -o pipefail; export BENCH_SAMPLES_DIR=$(CURDIR)/$(BENCH_OUT)/samples; \
	  for s in $(BENCH_STEPS); do \
	    python3 conformance/bench/report.py --stamp $$s start && \
	    $(MAKE) --no-print-directory bench-$$s | tee $(BENCH_OUT)/$$s.txt && \
	    python3 conformance/bench/report.py --stamp $$s end || exit 1; \
	  done
	@# bench-node's table is its own generated file (run.sh empties target/lab/e2e first).
	cp target/lab/e2e/bench-node.md $(BENCH_OUT)/node.md
	python3 conformance/bench/report.py

fmt:
	$(CARGO) fmt --all

# The style gate of `make test`: formatting and the layout rules first (cheap: no import circle
# between modules, no product file over 600 lines, no per-pod function over 80; see
# conformance/structure.py), then clippy with warnings as errors, and every unsafe block with
# the SAFETY comment that says why it is sound.
clippy:
	$(CARGO) fmt --all --check
	python3 conformance/structure.py --self-test
	python3 conformance/structure.py
	$(CARGO) fmt --all --check --manifest-path conformance/fuzz/Cargo.toml
	$(CARGO) clippy --locked --workspace --all-targets -- -D warnings -D clippy::undocumented_unsafe_blocks

clean:
	$(CARGO) clean

include conformance/lab/lab.mk
