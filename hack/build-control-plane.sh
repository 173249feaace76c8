#!/usr/bin/env bash
# Build the real Kubernetes control-plane binaries used by the cluster tests
# (tests/support/controlplane.py) from the published Go modules, into a cache
# directory outside the checkout:
#
#   ${TRTFLEET_CACHE:-$HOME/.cache/trtfleet}/k8s-<version>/bin/
#       kube-apiserver  kube-controller-manager  kube-scheduler  etcd  kwok
#   ${...}/k8s-<version>/kwok-stages.yaml   (kwok's "fast" node and pod stages)
#
# k8s.io/kubernetes cannot be `go install`ed directly: its go.mod replaces the
# ~30 staging modules (k8s.io/api, k8s.io/client-go, ...) with local paths. We
# create a throwaway wrapper module that requires k8s.io/kubernetes and
# replaces every staging module with its published v0.X.Y release instead.
# etcd is built the same way from go.etcd.io/etcd at the version k8s.io/kubernetes
# itself requires (Debian's etcd-server is 3.4.23). kwok (simulated nodes, so
# Pods get scheduled and reach Running without a kubelet) installs directly.
#
# Idempotent: does nothing when <cache>/k8s-<version>/.complete exists.
# Needs only Go (>= 1.24; a newer toolchain is fetched through the Go module
# proxy when the go.mod asks for it) and network access to the module proxy.
set -euo pipefail

K8S_VERSION="${K8S_VERSION:-v1.36.3}"
ETCD_VERSION="${ETCD_VERSION:-v3.6.8}"
KWOK_VERSION="${KWOK_VERSION:-v0.8.0}"
STAGING_VERSION="v0.${K8S_VERSION#v1.}"                 # v1.36.3 -> v0.36.3
CACHE="${TRTFLEET_CACHE:-$HOME/.cache/trtfleet}"
DEST="$CACHE/k8s-$K8S_VERSION"
BIN="$DEST/bin"
COMPONENTS=(kube-apiserver kube-controller-manager kube-scheduler)

log() { printf '[build-control-plane] %s\n' "$*" >&2; }

if [[ -f "$DEST/.complete" ]]; then
  ok=1
  for c in "${COMPONENTS[@]}" etcd kwok; do [[ -x "$BIN/$c" ]] || ok=0; done
  [[ -f "$DEST/kwok-stages.yaml" ]] || ok=0
  if [[ $ok == 1 ]]; then
    log "already built: $BIN"
    exit 0
  fi
fi

GO="${GO:-$(command -v go || true)}"
[[ -z "$GO" && -x /usr/local/go/bin/go ]] && GO=/usr/local/go/bin/go
if [[ -z "$GO" ]]; then
  log "install Go >= 1.24 (https://go.dev/dl) to build kube-apiserver for the cluster tests"
  exit 3
fi

mkdir -p "$BIN" "$CACHE/tmp"
# One build at a time (the pytest fixture and a developer may race).
exec 9>"$DEST/.lock"
if ! flock -n 9; then
  log "another build holds $DEST/.lock; waiting for it"
  flock 9
  if [[ -f "$DEST/.complete" ]]; then log "built by the other process"; exit 0; fi
fi

# Everything Go writes lives in the cache, never in the checkout.
export GOPATH="$CACHE/go"
export GOMODCACHE="$CACHE/go/pkg/mod"
export GOCACHE="$CACHE/go-build"
export GOFLAGS="-trimpath -modcacherw"
export CGO_ENABLED=0
export GOWORK=off
NPROC="$(nproc 2>/dev/null || echo 2)"
export GOMAXPROCS="${GOMAXPROCS:-$NPROC}"
JOBS="${BUILD_JOBS:-$NPROC}"

WORK="$(mktemp -d "$CACHE/tmp/wrapper.XXXXXX")"
trap 'rm -rf "$WORK"; rm -f "$BIN"/.*.tmp.* "$DEST"/.*.tmp.*' EXIT

gomod_of() {  # print the path of the downloaded go.mod of module@version
  "$GO" mod download -json "$1" | sed -n 's/^[[:space:]]*"GoMod": "\(.*\)",$/\1/p'
}

# ---------------------------------------------------------------- kubernetes
build_kubernetes() {
  local need=0 c
  for c in "${COMPONENTS[@]}"; do [[ -x "$BIN/$c" ]] || need=1; done
  if [[ $need == 0 ]]; then log "kubernetes binaries present"; return; fi

  local mod="$WORK/k8s"
  mkdir -p "$mod"
  cd "$mod"
  local kmod
  kmod="$(gomod_of "k8s.io/kubernetes@$K8S_VERSION")"
  [[ -f "$kmod" ]] || { log "could not download k8s.io/kubernetes@$K8S_VERSION"; exit 1; }
  local go_directive
  go_directive="$(sed -n 's/^go \([0-9.]*\)$/\1/p' "$kmod" | head -1)"
  mapfile -t staging < <(sed -n 's#^[[:space:]]*\(k8s\.io/[a-z0-9-]*\) => \./staging/.*#\1#p' "$kmod")
  log "k8s.io/kubernetes $K8S_VERSION (go $go_directive) replaces ${#staging[@]} staging modules"

  # Not every staging module is published for every release (samples, new
  # ones); replace only those that exist, the others are not imported. (Run
  # outside any go.mod: a module query inside a half-written one fails.)
  local m replaces=()
  for m in "${staging[@]}"; do
    if (cd "$WORK" && "$GO" mod download "$m@$STAGING_VERSION" 2>/dev/null); then
      replaces+=("$m => $m $STAGING_VERSION")
    else
      log "skip $m@$STAGING_VERSION (not published)"
    fi
  done
  {
    echo "module trtfleet.local/k8s-control-plane-build"
    echo
    echo "go $go_directive"
    grep -E '^godebug ' "$kmod" || true
    echo
    echo "require k8s.io/kubernetes $K8S_VERSION"
    echo
    for c in "${COMPONENTS[@]}"; do echo "tool k8s.io/kubernetes/cmd/$c"; done
    echo
    echo "replace ("
    for m in "${replaces[@]}"; do echo "	$m"; done
    echo ")"
  } > go.mod

  log "resolving dependencies (go mod tidy)"
  "$GO" mod tidy

  local minor="${K8S_VERSION#v1.}"; minor="${minor%%.*}"
  local date; date="$(date -u +%Y-%m-%dT%H:%M:%SZ)"
  local ld="-s -w" p
  for p in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
    ld+=" -X $p.gitVersion=$K8S_VERSION -X $p.gitMajor=1 -X $p.gitMinor=$minor"
    ld+=" -X $p.gitTreeState=clean -X $p.buildDate=$date"
  done
  for c in "${COMPONENTS[@]}"; do
    [[ -x "$BIN/$c" ]] && { log "$c present"; continue; }
    log "building $c (this takes a while on $NPROC cores)"
    local t0=$SECONDS
    "$GO" build -p "$JOBS" -ldflags="$ld" -o "$BIN/.$c.tmp.$$" "k8s.io/kubernetes/cmd/$c"
    mv -f "$BIN/.$c.tmp.$$" "$BIN/$c"
    log "built $c in $((SECONDS - t0))s"
  done
}

# ---------------------------------------------------------------------- etcd
build_etcd() {
  if [[ -x "$BIN/etcd" ]]; then log "etcd present"; return; fi
  # go.etcd.io/etcd/server/v3 is the etcd main package; its go.mod replaces the
  # sibling modules (api, client, pkg) with local paths, so wrap it as well.
  local mod="$WORK/etcd"
  mkdir -p "$mod"
  cd "$mod"
  local smod
  smod="$(gomod_of "go.etcd.io/etcd/server/v3@$ETCD_VERSION")"
  [[ -f "$smod" ]] || { log "could not download go.etcd.io/etcd/server/v3@$ETCD_VERSION"; exit 1; }
  local go_directive
  go_directive="$(sed -n 's/^go \([0-9.]*\)$/\1/p' "$smod" | head -1)"
  mapfile -t siblings < <(sed -n 's#^[[:space:]]*\(go\.etcd\.io/etcd/[a-z0-9/]*\) => \.\./.*#\1#p' "$smod")
  {
    echo "module trtfleet.local/etcd-build"
    echo
    echo "go $go_directive"
    echo
    echo "require go.etcd.io/etcd/server/v3 $ETCD_VERSION"
    echo
    echo "tool go.etcd.io/etcd/server/v3"
    echo
    echo "replace ("
    for m in "${siblings[@]}"; do echo "	$m => $m $ETCD_VERSION"; done
    echo ")"
  } > go.mod
  log "resolving etcd $ETCD_VERSION dependencies"
  "$GO" mod tidy
  log "building etcd"
  local t0=$SECONDS
  "$GO" build -p "$JOBS" -ldflags="-s -w" -o "$BIN/.etcd.tmp.$$" go.etcd.io/etcd/server/v3
  mv -f "$BIN/.etcd.tmp.$$" "$BIN/etcd"
  log "built etcd in $((SECONDS - t0))s"
}

# ---------------------------------------------------------------------- kwok
build_kwok() {
  if [[ -x "$BIN/kwok" && -f "$DEST/kwok-stages.yaml" ]]; then log "kwok present"; return; fi
  # sigs.k8s.io/kwok has no replace directives: a plain `go install` works.
  log "building kwok $KWOK_VERSION"
  local t0=$SECONDS gobin="$WORK/kwok-bin"
  GOBIN="$gobin" "$GO" install -p "$JOBS" -ldflags="-s -w" "sigs.k8s.io/kwok/cmd/kwok@$KWOK_VERSION"
  mv -f "$gobin/kwok" "$BIN/kwok"
  local dir stages="$DEST/.kwok-stages.yaml.tmp.$$"
  dir="$("$GO" mod download -json "sigs.k8s.io/kwok@$KWOK_VERSION" | sed -n 's/^[[:space:]]*"Dir": "\(.*\)",$/\1/p')"
  : > "$stages"
  for f in node/fast/node-initialize.yaml node/heartbeat-with-lease/node-heartbeat-with-lease.yaml \
           pod/fast/pod-ready.yaml pod/fast/pod-complete.yaml pod/fast/pod-delete.yaml; do
    { echo "---"; cat "$dir/kustomize/stage/$f"; } >> "$stages"
  done
  mv -f "$stages" "$DEST/kwok-stages.yaml"
  log "built kwok in $((SECONDS - t0))s"
}

T0=$SECONDS
build_kubernetes
build_etcd
build_kwok
for c in "${COMPONENTS[@]}" etcd kwok; do "$BIN/$c" --version 2>/dev/null | head -1 >&2 || true; done
date -u +%Y-%m-%dT%H:%M:%SZ > "$DEST/.complete"
log "done in $((SECONDS - T0))s: $BIN"
