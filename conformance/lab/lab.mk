# Real-kernel lab (conformance/lab/): include from the top Makefile.
#   make lab-kernel   download/prepare the lab kernel once (prints vmlinuz)
#   make lab-shell    interactive root shell in the lab VM (cwd = repo root)
# Lab test targets run with: conformance/lab/run-tests.sh <target>...
LAB_DIR := $(patsubst %/,%,$(dir $(lastword $(MAKEFILE_LIST))))

.PHONY: lab-kernel lab-shell
lab-kernel:
	$(LAB_DIR)/kernel.sh

lab-shell:
	$(LAB_DIR)/run.sh --shell
