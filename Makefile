# tether — build, install, test. Run as root: tests create network namespaces and links.
CARGO     ?= cargo
DESTDIR   ?=
BINDIR    ?= /opt/cni/bin
BINS      := tether-ipvlan tether-ipam

# Conformance tests are split by what they need: host_* run on this kernel (netns, veth, macvlan),
# lab_* need ipvlan and run on a kernel that has it — here, or in the lab VM (conformance/lab/).
HOST_TESTS := $(sort $(basename $(notdir $(wildcard conformance/tests/host_*.rs))))
LAB_TESTS  := $(sort $(basename $(notdir $(wildcard conformance/tests/lab_*.rs))))

.PHONY: all build install test unit host-tests lab-tests manifests driver deps demo fmt clippy clean

all: build

build:
	$(CARGO) build --release --locked $(addprefix --bin ,$(BINS))

# Copy to a temporary name and rename, so a runtime never executes a half-written binary.
install: build
	install -d -m 0755 $(DESTDIR)$(BINDIR)
	@for b in $(BINS); do \
	  tmp=$(DESTDIR)$(BINDIR)/.$$b.tmp.$$$$; \
	  install -m 0755 target/release/$$b $$tmp && mv -f $$tmp $(DESTDIR)$(BINDIR)/$$b || { rm -f $$tmp; exit 1; }; \
	  echo "installed $(DESTDIR)$(BINDIR)/$$b"; \
	done

deps:
	.ci/deps.sh

driver:
	conformance/libcni-driver/build.sh

test: deps driver
	$(CARGO) build --locked --workspace --bins
	$(MAKE) --no-print-directory unit manifests host-tests lab-tests

unit:
	$(CARGO) test --locked --workspace --exclude tether-conformance
	$(CARGO) test --locked -p tether-conformance --lib

host-tests:
ifneq ($(HOST_TESTS),)
	$(CARGO) test --locked -p tether-conformance $(addprefix --test ,$(HOST_TESTS))
endif

# Every manifest under deploy/ against Kubernetes schemas and the plugin's own config parser.
manifests:
	python3 deploy/validate.py

lab-tests:
	conformance/lab/run-tests.sh $(LAB_TESTS)

demo: deps driver
	$(CARGO) build --locked --workspace --bins
	conformance/lab/run.sh conformance/demo/demo.sh

fmt:
	$(CARGO) fmt --all

clippy:
	$(CARGO) clippy --workspace --all-targets -- -D warnings

clean:
	$(CARGO) clean

include conformance/lab/lab.mk
