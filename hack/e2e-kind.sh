#!/usr/bin/env bash
# trtfleet end to end on a kind cluster (CPU only): the chart, the operator, the reference engine and the
# router as they run in Kubernetes, driven with the openai client.
#
#   hack/e2e-kind.sh [all]   up, then the e2e tests (pytest -m e2e), then down (the default; `make e2e-kind`)
#   hack/e2e-kind.sh up      kind cluster + images + helm install + examples, Ready; prints KUBECONFIG
#   hack/e2e-kind.sh test    pytest -m e2e against the cluster `up` made
#   hack/e2e-kind.sh down    delete the cluster
#
# Needs a Docker engine (`docker info` must work), Go >= 1.24 (kind is built from the Go module proxy into
# $TRTFLEET_CACHE, default ~/.cache/trtfleet), and `make install` (the venv: kubectl, pytest, openai).
# Exit codes: 0 passed; 1 a step failed (diagnostics in $TRTFLEET_E2E_DIR/logs); 3 a prerequisite is
# missing (no Docker engine, no Go): nothing was tested.
#
# Environment: KIND_VERSION (v0.33.0), TRTFLEET_KIND_CLUSTER (trtfleet-e2e), TRTFLEET_E2E_DIR
# (.cache/e2e-kind), TRTFLEET_E2E_TAG (e2e), KEEP_CLUSTER=1 (keep it after `all`).
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT="$PWD"

CACHE="${TRTFLEET_CACHE:-$HOME/.cache/trtfleet}"
KIND_VERSION="${KIND_VERSION:-v0.33.0}"
KIND="$CACHE/kind-$KIND_VERSION/bin/kind"
CLUSTER="${TRTFLEET_KIND_CLUSTER:-trtfleet-e2e}"
STATE="${TRTFLEET_E2E_DIR:-$ROOT/.cache/e2e-kind}"
KUBECONFIG_FILE="$STATE/kubeconfig"
TAG="${TRTFLEET_E2E_TAG:-e2e}"
REGISTRY="ghcr.io/trtfleet"
RELEASE="trtfleet"
SYSTEM_NS="trtfleet-system"
MODELS_NS="models"
PY="$ROOT/.venv/bin/python"
KUBECTL="$ROOT/.venv/bin/kubectl"
HELM="$ROOT/.cache/tools/bin/helm"
EXIT_MISSING=3

log() { printf '[e2e-kind %s] %s\n' "$(date +%H:%M:%S)" "$*" >&2; }
missing() { log "SKIPPED, nothing was tested: $*"; exit "$EXIT_MISSING"; }
k() { "$KUBECTL" --kubeconfig "$KUBECONFIG_FILE" "$@"; }

check_prerequisites() {
  local info
  if ! info="$(docker info 2>&1)"; then
    missing "no Docker engine (docker info: $(grep -m1 -iE 'error|cannot' <<<"$info" || echo failed))"
  fi
  [[ -x "$PY" && -x "$KUBECTL" ]] || { log "run 'make install' first (no .venv with kubectl)"; exit 1; }
  bash hack/install-helm.sh >/dev/null
}

ensure_kind() {
  if [[ -x "$KIND" ]]; then return; fi
  local go
  go="$(command -v go || true)"
  [[ -n "$go" ]] || { [[ -x /usr/local/go/bin/go ]] && go=/usr/local/go/bin/go; }
  [[ -n "$go" ]] || missing "no Go toolchain to build kind $KIND_VERSION (https://go.dev/dl)"
  log "building kind $KIND_VERSION from the Go module proxy into $(dirname "$KIND")"
  mkdir -p "$(dirname "$KIND")"
  GOBIN="$(dirname "$KIND")" GOPATH="$CACHE/go" GOMODCACHE="$CACHE/go/pkg/mod" GOFLAGS="-modcacherw" \
    "$go" install "sigs.k8s.io/kind@$KIND_VERSION"
}

build_images() {
  local images=(trtfleet reference-worker)
  for name in "${images[@]}"; do
    log "docker build $REGISTRY/$name:$TAG (images/$name.Dockerfile)"
    docker build --quiet -f "images/$name.Dockerfile" -t "$REGISTRY/$name:$TAG" . >/dev/null
    "$KIND" load docker-image --name "$CLUSTER" "$REGISTRY/$name:$TAG"
  done
}

write_values() {
  # Fresh tags with pullPolicy Never: a pod that does not get the image kind loaded fails loudly.
  cat >"$STATE/values.yaml" <<EOF
image: {repository: $REGISTRY/trtfleet, tag: "$TAG", pullPolicy: Never}
operator:
  images:
    worker: $REGISTRY/reference-worker:$TAG
  resources: {requests: {cpu: 50m, memory: 128Mi}}
router:
  replicas: 1
  resources: {requests: {cpu: 100m, memory: 128Mi}}
EOF
}

diagnose() {
  mkdir -p "$STATE/logs"
  log "collecting diagnostics into $STATE/logs"
  k get nodes,all,basemodels,adapters,pvc,events -A -o wide >"$STATE/logs/objects.txt" 2>&1 || true
  k describe pods -A >"$STATE/logs/pods.txt" 2>&1 || true
  k logs -n "$SYSTEM_NS" -l app.kubernetes.io/component=operator --tail=-1 >"$STATE/logs/operator.log" 2>&1 || true
  k logs -n "$SYSTEM_NS" -l app.kubernetes.io/component=router --tail=-1 >"$STATE/logs/router.log" 2>&1 || true
  k logs -n "$MODELS_NS" -l trtfleet.io/basemodel=tiny --tail=200 --prefix >"$STATE/logs/workers.log" 2>&1 || true
  k get basemodels,adapters -n "$MODELS_NS" -o yaml >"$STATE/logs/trtfleet-objects.yaml" 2>&1 || true
  tail -n 30 "$STATE/logs/operator.log" >&2 || true
}

wait_for() {  # wait_for <kind/name> <jsonpath condition> <timeout>
  if ! k wait -n "$MODELS_NS" --for="$2" "$1" --timeout="$3" >/dev/null; then
    log "$1 did not reach $2 within $3"
    k get -n "$MODELS_NS" "$1" -o jsonpath='{.status.conditions}' >&2 || true
    echo >&2
    diagnose
    return 1
  fi
}

cmd_up() {
  check_prerequisites
  ensure_kind
  mkdir -p "$STATE"
  if "$KIND" get clusters 2>/dev/null | grep -qx "$CLUSTER"; then
    log "reusing kind cluster $CLUSTER"
    "$KIND" get kubeconfig --name "$CLUSTER" >"$KUBECONFIG_FILE"
  else
    log "creating kind cluster $CLUSTER"
    "$KIND" create cluster --name "$CLUSTER" --kubeconfig "$KUBECONFIG_FILE" --wait 180s
  fi
  build_images
  write_values
  log "helm install $RELEASE charts/trtfleet into $SYSTEM_NS"
  # The operator must be up before the examples below are applied.
  HELM_CACHE_HOME="$STATE/helm/cache" HELM_CONFIG_HOME="$STATE/helm/config" HELM_DATA_HOME="$STATE/helm/data" \
    "$HELM" upgrade --install "$RELEASE" charts/trtfleet --kubeconfig "$KUBECONFIG_FILE" \
    --namespace "$SYSTEM_NS" --create-namespace -f "$STATE/values.yaml" --wait=hookOnly --timeout 5m \
    || { diagnose; exit 1; }
  k rollout status -n "$SYSTEM_NS" "deployment/$RELEASE-operator" --timeout=5m || { diagnose; exit 1; }
  k create namespace "$MODELS_NS" --dry-run=client -o yaml | k apply -f - >/dev/null
  # The volumes the operator mounts (converted adapters; engines, unused by the reference runtime),
  # on kind's default local-path StorageClass.
  for pvc in trtfleet-adapters trtfleet-engines; do
    k apply -n "$MODELS_NS" -f - >/dev/null <<EOF
apiVersion: v1
kind: PersistentVolumeClaim
metadata: {name: $pvc}
spec:
  accessModes: [ReadWriteOnce]
  resources: {requests: {storage: 1Gi}}
EOF
  done
  log "kubectl apply the reference BaseModel and the sample Adapters"
  k apply -n "$MODELS_NS" -f examples/basemodel-reference-tiny.yaml \
    -f examples/adapter-tiny-upper.yaml -f examples/adapter-tiny-reverse.yaml -f examples/adapter-tiny-json.yaml
  wait_for basemodel/tiny jsonpath='{.status.phase}'=Ready 10m
  for adapter in tiny-upper tiny-reverse tiny-json; do
    wait_for "adapter/$adapter" jsonpath='{.status.phase}'=Ready 5m
  done
  k rollout status -n "$SYSTEM_NS" "deployment/$RELEASE-router" --timeout=5m || { diagnose; exit 1; }
  k get basemodels,adapters -n "$MODELS_NS" >&2
  log "ready: export KUBECONFIG=$KUBECONFIG_FILE"
}

cmd_test() {
  [[ -f "$KUBECONFIG_FILE" ]] || { log "no cluster: run '$0 up' first"; exit 1; }
  TRTFLEET_E2E_KUBECONFIG="$KUBECONFIG_FILE" TRTFLEET_E2E_ROUTER="$SYSTEM_NS/$RELEASE-router" \
    "$PY" -m pytest -m e2e tests/e2e -p no:cacheprovider -ra || { diagnose; return 1; }
}

cmd_down() {
  if [[ -x "$KIND" ]] && "$KIND" get clusters 2>/dev/null | grep -qx "$CLUSTER"; then
    log "deleting kind cluster $CLUSTER"
    "$KIND" delete cluster --name "$CLUSTER"
  fi
  rm -f "$KUBECONFIG_FILE"
}

cmd_all() {
  check_prerequisites
  if [[ "${KEEP_CLUSTER:-0}" != 1 ]]; then trap cmd_down EXIT; fi
  cmd_up
  cmd_test
}

case "${1:-all}" in
  all) cmd_all ;;
  up) cmd_up ;;
  test) cmd_test ;;
  down) cmd_down ;;
  *) echo "usage: $0 [all|up|test|down]" >&2; exit 2 ;;
esac
