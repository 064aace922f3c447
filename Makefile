# Everything the project needs is installed from here: a virtualenv with the Python packages and,
# on first use, the control plane binaries built from their pinned Go modules (cached by version).
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed

SUDO   := $(shell [ "$$(id -u)" = 0 ] || echo sudo)

.PHONY: help install binaries tools image-tools image node-tools test-node test test-karpenter test-workload-api bench-smoke compat test-kueue-matrix unit lint generate demo cluster clean

help:  ## list targets
	@grep -E '^[a-z-]+:.*##' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  make %-12s %s\n", $$1, $$2}'

# The wheel holds the service only: the checkout's tooling (localkube, demo, dashboards, alerts,
# bench, deploy/render.py) is put on the virtualenv's path by a .pth file, with a `localkube` command.
$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e '.[dev]'
	$(BIN)/python -c 'import sys, sysconfig; open(sysconfig.get_path("purelib") + "/nws-checkout.pth", "w").write(sys.argv[1] + "\n")' '$(CURDIR)'
	printf '#!/bin/sh\nexec "%s/python" -m localkube.cli "$$@"\n' '$(abspath $(BIN))' > $(BIN)/localkube
	chmod +x $(BIN)/localkube
	touch $(STAMP)

install: $(STAMP)  ## create the virtualenv and install the project with its test tools

binaries: install  ## build (or reuse) etcd, kube-apiserver, kubectl, ... from their Go modules
	$(BIN)/localkube build

tools:  ## Debian's prometheus and prometheus-alertmanager (promtool, prometheus, alertmanager) for the alert tests
	@command -v promtool >/dev/null && command -v prometheus >/dev/null && command -v prometheus-alertmanager >/dev/null || { \
	  echo "installing Debian's prometheus and prometheus-alertmanager packages (promtool, prometheus, alertmanager) ..."; \
	  $(SUDO) apt-get update -qq && \
	  DEBIAN_FRONTEND=noninteractive $(SUDO) apt-get install -y -qq --no-install-recommends \
	    prometheus prometheus-alertmanager >/dev/null; }
	@promtool --version 2>&1 | head -1
	@prometheus-alertmanager --version 2>&1 | head -1

image-tools:  ## Debian's podman, buildah and mmdebstrap, for `make image` where no Docker engine runs
	@command -v docker >/dev/null && docker info >/dev/null 2>&1 || \
	  { command -v podman >/dev/null && command -v mmdebstrap >/dev/null; } || { \
	  echo "installing Debian's podman, buildah and mmdebstrap ..."; \
	  $(SUDO) apt-get update -qq && \
	  DEBIAN_FRONTEND=noninteractive $(SUDO) apt-get install -y -qq --no-install-recommends \
	    podman buildah mmdebstrap uidmap >/dev/null; }

# IMAGE_ARGS: e.g. --tag my/name:dev, --base IMAGE, --save FILE (python -m deploy.image --help)
image: install image-tools  ## build the container image from the Dockerfile and report its layers
	$(BIN)/python -m deploy.image $(IMAGE_ARGS)

test: lint install tools  ## lint, then run every test (unit and against the local control plane)
	$(BIN)/localkube build --core
	$(BIN)/pytest -m 'not node and not bench and not karpenter and not workload_api' --prebuild

# Each benchmark at its smallest on local control planes (tests/cluster/test_bench_smoke.py): CI runs it
# after make test; the benches that need no cluster run in make test.
bench-smoke: install tools  ## every benchmark's smoke run (bench/; docs/benchmarks.md)
	$(BIN)/localkube build --core
	$(BIN)/pytest -m bench --prebuild

# The tests beside the real Karpenter (tests marked karpenter: its KWOK provider from the pinned module,
# localkube/gomod/karpenter; docs/karpenter.md). Karpenter is built on first use, with its progress
# printed (197 s here, with the control plane's builds in Go's cache), then the tests run on a control plane of
# their own, one per test module (about 3.5 minutes).
test-karpenter: install  ## the tests beside the real Karpenter: scale-up, drift, consolidation, our summaries and alert (docs/karpenter.md)
	$(BIN)/localkube build --karpenter >/dev/null
	$(BIN)/pytest -m karpenter

# The in-tree Workload API's scenarios (tests marked workload_api) on the minors that serve it, Kubernetes 1.37 and
# 1.38.0-beta.0 with the GenericWorkload gate on (localkube.cluster.WORKLOAD_API_MINORS; docs/workloads-api.md):
# their kube-apiserver and kubectl are built on first use (4 to 8 minutes each here; 1.38 with the Go toolchain its
# go.mod asks for).
test-workload-api: install tools  ## the in-tree Workload API as a root, on Kubernetes 1.37 and 1.38.0-beta.0 (docs/workloads-api.md)
	@for minor in $$($(BIN)/python -c 'from localkube.cluster import WORKLOAD_API_MINORS; print(*WORKLOAD_API_MINORS)'); do \
	  echo "== Kubernetes $$minor: kube-apiserver and kubectl (built on first use)"; \
	  $(BIN)/localkube build --kubernetes $$minor >/dev/null || exit 1; \
	done
	$(BIN)/pytest -m workload_api

# The core scenarios (tests marked compat) against kube-apiserver and kubectl of every other supported
# Kubernetes minor (localkube.build.COMPAT_MINORS, docs/compatibility.md); make test covers the pinned one.
# Each minor's binaries are built on first use (4 to 8 minutes each here). COMPAT=1.33 runs one.
COMPAT ?=

compat: install tools  ## the core scenarios against every other supported Kubernetes minor (docs/compatibility.md)
	@minors="$(or $(COMPAT),$$($(BIN)/python -c 'from localkube.build import COMPAT_MINORS; print(*COMPAT_MINORS)'))"; \
	failed=""; for minor in $$minors; do \
	  echo "== Kubernetes $$minor: kube-apiserver and kubectl (built on first use), then pytest -m compat"; \
	  $(BIN)/localkube build --kubernetes $$minor >/dev/null && \
	  $(BIN)/pytest -m compat --kubernetes $$minor -q --durations=5 || failed="$$failed $$minor"; \
	done; \
	if [ -n "$$failed" ]; then echo "make compat: failed on Kubernetes$$failed"; exit 1; fi; \
	echo "make compat: passed on Kubernetes $$minors"

# The Kueue scenarios (tests marked kueue) on every other Kueue cell (demo/kueue.py's CELLS: v0.14.0, v0.19.0 with
# v1beta1 still served; docs/kueue.md#supported-kueue-versions); make test covers the newest (v0.19.0 with v1beta1
# unserved, as Kueue v0.20+ serves). Kueue v0.14.0's controller is built on first use (about 5 minutes here).
# KUEUE_CELL=v0.14.0 runs one.
KUEUE_CELL ?=

test-kueue-matrix: install tools  ## the Kueue scenarios on Kueue v0.14.0 and v0.19.0 (docs/kueue.md)
	@cells="$(or $(KUEUE_CELL),$$($(BIN)/python -c 'from demo.kueue import CELLS, NEWEST; print(*(c for c in CELLS if c != NEWEST))'))"; \
	failed=""; for cell in $$cells; do \
	  echo "== Kueue $$cell: pytest -m kueue --kueue $$cell"; \
	  $(BIN)/localkube build --core >/dev/null && \
	  $(BIN)/pytest -m kueue --kueue $$cell -q --durations=5 || failed="$$failed $$cell"; \
	done; \
	if [ -n "$$failed" ]; then echo "make test-kueue-matrix: failed on Kueue$$failed"; exit 1; fi; \
	echo "make test-kueue-matrix: passed on Kueue $$cells"

node-tools:  ## Debian's runc, CNI plugins, conntrack and podman, for a real node (test-node, localkube up --node)
	@command -v runc >/dev/null && [ -x /usr/lib/cni/bridge ] && command -v conntrack >/dev/null && \
	  command -v iptables-legacy >/dev/null && command -v gcc >/dev/null && \
	  command -v podman >/dev/null && command -v mmdebstrap >/dev/null || { \
	  echo "installing Debian's runc, containernetworking-plugins, conntrack, iptables, podman, mmdebstrap ..."; \
	  $(SUDO) apt-get update -qq && \
	  DEBIAN_FRONTEND=noninteractive $(SUDO) apt-get install -y -qq --no-install-recommends \
	    runc containernetworking-plugins conntrack iptables gcc libc6-dev podman buildah mmdebstrap uidmap \
	    >/dev/null; }

test-node: binaries tools node-tools  ## the image on a real node: helm install, probes, leader election, SIGTERM, the fleet hub
	$(BIN)/pytest -m node

unit: install  ## only the tests that need no cluster (tests/unit)
	$(BIN)/pytest tests/unit

generate: install  ## regenerate dashboards/generated, alerts/generated and deploy/{base,with-monitoring}/generated
	$(BIN)/python -m dashboards
	$(BIN)/python -m alerts
	$(BIN)/python deploy/render.py

# mypy checks the type hints ([tool.mypy] in pyproject.toml): they are the code's contract docs, and
# an unchecked hint drifts; each `# type: ignore[code]` names what it silences and must still be needed.
lint: install  ## ruff, then mypy (both silent when all is well)
	$(BIN)/ruff check --quiet .
	$(BIN)/mypy --no-error-summary

# DEMO_ARGS: e.g. --quota-story, --pods, --nodes-per-pool 2, --duration 60 (DEMO_ARGS=--help lists them)
DEMO_ARGS ?=

demo: binaries tools  ## the local demo: node pools, workloads, the service and Prometheus (Ctrl-C stops it)
	$(BIN)/python -m demo $(DEMO_ARGS)

cluster: binaries  ## start a bare local control plane for debugging (prints the kubeconfig path)
	$(BIN)/localkube up

clean:  ## remove the virtualenv (the binary cache under ~/.cache/node-workload-summary stays)
	rm -rf $(VENV) .pytest_cache .ruff_cache .mypy_cache
