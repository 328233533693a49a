# The interface for people and for CI: .ci/run calls these targets and nothing else.
SHELL := /bin/bash
.DEFAULT_GOAL := help

PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
K8S_VERSION ?= v1.37.2
DRA_GPU_CACHE ?= $(HOME)/.cache/dra-gpu
DRA_GPU_BIN_DIR ?= $(DRA_GPU_CACHE)/bin/$(K8S_VERSION)
STATE_DIR := .run/cluster
export K8S_VERSION DRA_GPU_CACHE DRA_GPU_BIN_DIR

.PHONY: help venv kubebins lint format test unit binaries e2e matrix bench bench-fleet chart image reliability run cluster-up cluster-down protos clean

help:
	@echo "make run           local control plane + 3 real nodes, the tutorial end to end, then helm install"
	@echo "make test          lint and the whole pytest suite, every lane (what CI runs)"
	@echo "make unit          the tests that need nothing but the venv (no Go, no build cache)"
	@echo "make binaries      the tests that need built tools (helm, promtool, the Go oracles, crane, images)"
	@echo "make e2e           the tests on the real control plane and real nodes (marker cluster)"
	@echo "make lint          ruff, mypy --strict, the import contracts (.pre-commit-config.yaml too)"
	@echo "make matrix        the e2e suite against Kubernetes 1.35.4, 1.36.3 and 1.37.2 (long)"
	@echo "make bench         benchmarks (print numbers, assert nothing)"
	@echo "make bench-fleet   10, 50 and 100 agents against one API server, a claim stream, a restart (~20 min)"
	@echo "make reliability   restart, load (20 nodes x 8 GPUs, 200 pods), fuzzing, crash tests"
	@echo "make chart         helm lint + chart tests (render, dry-run, install, RBAC, policy)"
	@echo "make cluster-up    start the local cluster in the background (real nodes node-01..03), print exports"
	@echo "make cluster-down  stop it"
	@echo "make kubebins      build etcd, kube-*, kubectl and helm $(K8S_VERSION) into $(DRA_GPU_BIN_DIR)"
	@echo "make nodebins      build containerd (+ Debian runc, CNI plugins, socat) for real nodes"
	@echo "make images        build the dra-gpu, pause and workload images as OCI archives (no Docker)"
	@echo "make prometheus    unpack Debian's prometheus + promtool into the cache (tests, make run)"

venv: $(VENV)/.installed
$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e '.[test]'
	touch $@

kubebins:
	@hack/build-kubebins.sh >/dev/null

# Real nodes: containerd from its Go module into $(DRA_GPU_CACHE)/node, and the images as OCI
# archives for `ctr -n k8s.io images import` in $(DRA_GPU_CACHE)/images/<key> (root: apt, chroot).
.PHONY: nodebins images prometheus
nodebins:
	@hack/build-containerd.sh >/dev/null

images:
	@hack/build-images.sh >/dev/null

# Prometheus and promtool (Debian's package, unpacked into $(DRA_GPU_CACHE)/prometheus; no
# service installed) for the alert-rule unit tests, tests/e2e/test_prometheus.py and `make run`.
prometheus:
	@hack/build-prometheus.sh >/dev/null

# ruff, then mypy --strict and the import contracts (both configured in pyproject.toml).
# .pre-commit-config.yaml runs the same four as local hooks: `pre-commit install` once.
lint: venv
	$(BIN)/ruff check operator tests hack benchmarks
	$(BIN)/ruff format --check operator tests hack benchmarks
	$(BIN)/mypy
	$(BIN)/lint-imports

format: venv
	$(BIN)/ruff check --fix operator tests hack benchmarks
	$(BIN)/ruff format operator tests hack benchmarks

# The lanes are markers that say what a test needs (pyproject.toml, tests/support/lanes.py):
# none, `binaries` (built tools) or `cluster` (the real control plane and nodes). `make test`
# runs them all; a test asking for a tool its markers do not name fails, it is never skipped.
test: lint kubebins nodebins images prometheus
	$(DRA_GPU_BIN_DIR)/helm lint --strict charts/dra-gpu
	$(BIN)/pytest

unit: venv
	$(BIN)/pytest -m "not binaries and not cluster"

binaries: venv kubebins images prometheus
	$(BIN)/pytest -m "binaries and not cluster"

e2e: venv kubebins nodebins images prometheus
	$(BIN)/pytest tests/e2e

# The whole e2e suite against every supported Kubernetes version (too long for CI); one log each
# in .run/matrix/, the summary lines at the end.
MATRIX_VERSIONS := v1.35.4 v1.36.3 v1.37.2
matrix: venv nodebins images prometheus
	@mkdir -p .run/matrix
	@for v in $(MATRIX_VERSIONS); do \
	  export K8S_VERSION=$$v DRA_GPU_BIN_DIR=$(DRA_GPU_CACHE)/bin/$$v; \
	  hack/build-kubebins.sh >/dev/null || exit 1; \
	  echo "== $$v"; \
	  $(BIN)/pytest -q -p no:cacheprovider tests/e2e > .run/matrix/$$v.log 2>&1; \
	  tail -1 .run/matrix/$$v.log; \
	done

# pydra (the only other Python DRA driver) is measured beside ours, from a venv of its own.
PYDRA_VENV := .run/pydra-venv
$(PYDRA_VENV)/.installed:
	$(PYTHON) -m venv $(PYDRA_VENV)
	$(PYDRA_VENV)/bin/pip install --quiet kubernetes-pydra==0.1.0
	touch $@

bench: venv kubebins nodebins images $(PYDRA_VENV)/.installed
	$(BIN)/python benchmarks/bench_prepare.py --pydra-python $(PYDRA_VENV)/bin/python $(NODE_ARGS)
	$(BIN)/python benchmarks/bench_controller.py
	$(BIN)/python benchmarks/bench_admission.py
	$(BIN)/python benchmarks/bench_cel.py

# The fleet: N agents (10, 50, 100) on one control plane, a stream of other nodes' claim changes,
# an API server restart; what the API server and the agents pay (not part of `make bench`: long).
bench-fleet: venv kubebins
	$(BIN)/python benchmarks/bench_fleet.py

# The reliability tests at the issue's full size (CI runs them smaller as part of `make test`).
reliability: venv kubebins nodebins images
	DRA_GPU_LOAD=full $(BIN)/pytest -s --timeout=3600 tests/e2e/test_crash.py tests/e2e/test_load.py \
	  tests/e2e/test_apiserver_restart.py tests/e2e/test_agent.py tests/e2e/test_chart.py \
	  tests/unit/fuzz/test_inputs.py

chart: venv kubebins nodebins images prometheus
	$(DRA_GPU_BIN_DIR)/helm lint --strict charts/dra-gpu
	$(DRA_GPU_BIN_DIR)/helm lint --strict charts/dra-gpu -f charts/dra-gpu/ci/full-values.yaml
	$(BIN)/pytest tests/chart tests/unit/monitoring tests/e2e/test_chart.py

image:  # needs a Docker engine (none on the CI machines); the chart's default image
	docker build -t ghcr.io/dra-gpu/dra-gpu:0.1.0 .

# Real nodes: containerd and the images come from their build scripts (cached; quick when built).
NODE_ARGS = --containerd-dir "$$(hack/build-containerd.sh | tail -1)" \
  --images-dir "$$(hack/build-images.sh | tail -1)"
# The local cluster: real nodes, and Prometheus beside them.
CLUSTER_ARGS = $(NODE_ARGS) --prometheus-bin "$$(hack/build-prometheus.sh | tail -1)/bin"

cluster-up: venv kubebins
	@$(BIN)/python -m dra_gpu.testing up --state-dir $(STATE_DIR) $(CLUSTER_ARGS)

cluster-down: venv
	@$(BIN)/python -m dra_gpu.testing down --state-dir $(STATE_DIR)

run: cluster-up
	@eval "$$($(BIN)/python -m dra_gpu.testing up --state-dir $(STATE_DIR) $(CLUSTER_ARGS))" && \
	  $(BIN)/python hack/tutorial.py $(STATE_DIR)

protos: venv
	$(BIN)/pip install --quiet -e '.[dev]'
	hack/gen-protos.sh

clean: cluster-down
	rm -rf $(VENV) .run .pytest_cache .ruff_cache
