#!/usr/bin/env bash
# Fetch the two Gateway API CRDs the tests need, each from its published Go module through the Go module proxy (no
# GitHub download, nothing committed here), each pinned twice (the module's go.sum hash, the file's sha256):
#
#   InferencePool  sigs.k8s.io/gateway-api-inference-extension v1.6.2  (the operator's pools: golden and cluster tests)
#   HTTPRoute      sigs.k8s.io/gateway-api v1.6.1, standard channel   (examples/httproute-inferencepool.yaml applies)
#
# into ${TRTFLEET_CACHE:-$HOME/.cache/trtfleet}/gateway-crds/<module>-<version>/<file>, where
# tests/support/inferencepool.py reads them. gateway-api v1.6.1 is the release GIE's conformance module builds on.
# Idempotent: a file already there with its sha256 is not fetched again. Needs Go and the module proxy.
set -euo pipefail
CACHE="${TRTFLEET_CACHE:-$HOME/.cache/trtfleet}"
DEST="$CACHE/gateway-crds"

log() { printf '[install-gateway-crds] %s\n' "$*" >&2; }

GO="${GO:-$(command -v go || true)}"
[[ -z "$GO" && -x /usr/local/go/bin/go ]] && GO=/usr/local/go/bin/go
# The module cache is the control plane's (hack/build-control-plane.sh): one download for both.
export GOPATH="$CACHE/go" GOMODCACHE="$CACHE/go/pkg/mod" GOFLAGS="-modcacherw" GOWORK=off
mkdir -p "$DEST" "$CACHE/tmp"
work="$(mktemp -d "$CACHE/tmp/gateway-crds.XXXXXX")"
trap 'rm -rf "$work"' EXIT

# fetch MODULE VERSION MODULE_SUM PATH_IN_MODULE FILE_SHA256
fetch() {
  local module="$1" version="$2" module_sum="$3" path="$4" sha256="$5"
  local out="$DEST/${module##*/}-$version/$(basename "$path")"
  if [[ -f "$out" ]] && echo "$sha256  $out" | sha256sum -c --quiet - >/dev/null 2>&1; then
    return 0
  fi
  if [[ -z "$GO" ]]; then
    log "install Go (https://go.dev/dl): $(basename "$path") comes from the Go module $module@$version"
    exit 3
  fi
  local json sum dir
  json="$(cd "$work" && "$GO" mod download -json "$module@$version")"
  sum="$(sed -n 's/^[[:space:]]*"Sum": "\(.*\)",\{0,1\}$/\1/p' <<<"$json")"
  dir="$(sed -n 's/^[[:space:]]*"Dir": "\(.*\)",\{0,1\}$/\1/p' <<<"$json")"
  if [[ "$sum" != "$module_sum" ]]; then
    log "$module@$version has go.sum hash ${sum:-<none>}, expected $module_sum"
    exit 1
  fi
  mkdir -p "$(dirname "$out")"
  cp "$dir/$path" "$work/crd.yaml"
  echo "$sha256  $work/crd.yaml" | sha256sum -c --quiet -
  chmod 0644 "$work/crd.yaml"
  mv "$work/crd.yaml" "$out"
  log "$out ($module@$version)"
}

fetch sigs.k8s.io/gateway-api-inference-extension v1.6.2 "h1:GfTwDiMta9z6vtsZZuYE2xlryUGw+PiCdTJzYePY23M=" \
  config/crd/bases/inference.networking.k8s.io_inferencepools.yaml \
  ff84d3d3b1fbd48ddeb0a2646bba9f008f1692871417dfca30a29a625258e19b
fetch sigs.k8s.io/gateway-api v1.6.1 "h1:mock6phZbI6rvZerwrVNk7hVNymQgHo+6sJ81Ia7ftY=" \
  config/crd/standard/gateway.networking.k8s.io_httproutes.yaml \
  a424a0d6c953b162e71d1d97bb7e75012d8f1ac264e7274f2763d1b96ab39852
