#!/usr/bin/env bash
# Fetch the Gateway API Inference Extension's InferencePool CRD (inference.networking.k8s.io/v1) for the tests:
# the cluster tests install it into the real kube-apiserver, the golden tests validate the operator's
# InferencePools against its schema. It comes from the published Go module through the Go module proxy (no
# GitHub download, nothing committed here), pinned twice: the module's go.sum hash and the CRD file's sha256.
#
#   ${TRTFLEET_CACHE:-$HOME/.cache/trtfleet}/gie-<version>/inference.networking.k8s.io_inferencepools.yaml
#
# tests/support/inferencepool.py reads it from there. Idempotent: nothing happens when the file is there and
# matches its sha256. Needs Go (any version with modules) and the module proxy.
set -euo pipefail
MODULE="sigs.k8s.io/gateway-api-inference-extension"
VERSION="v1.6.2"
MODULE_SUM="h1:GfTwDiMta9z6vtsZZuYE2xlryUGw+PiCdTJzYePY23M="
CRD_IN_MODULE="config/crd/bases/inference.networking.k8s.io_inferencepools.yaml"
CRD_SHA256="ff84d3d3b1fbd48ddeb0a2646bba9f008f1692871417dfca30a29a625258e19b"
CACHE="${TRTFLEET_CACHE:-$HOME/.cache/trtfleet}"
DEST="$CACHE/gie-$VERSION"
OUT="$DEST/$(basename "$CRD_IN_MODULE")"

log() { printf '[install-gie-crd] %s\n' "$*" >&2; }

if [[ -f "$OUT" ]] && echo "$CRD_SHA256  $OUT" | sha256sum -c --quiet - >/dev/null 2>&1; then
  exit 0
fi
GO="${GO:-$(command -v go || true)}"
[[ -z "$GO" && -x /usr/local/go/bin/go ]] && GO=/usr/local/go/bin/go
if [[ -z "$GO" ]]; then
  log "install Go (https://go.dev/dl): the InferencePool CRD comes from the Go module $MODULE@$VERSION"
  exit 3
fi
# The module cache is the control plane's (hack/build-control-plane.sh): one download for both.
export GOPATH="$CACHE/go" GOMODCACHE="$CACHE/go/pkg/mod" GOFLAGS="-modcacherw" GOWORK=off
mkdir -p "$DEST" "$CACHE/tmp"
work="$(mktemp -d "$CACHE/tmp/gie.XXXXXX")"
trap 'rm -rf "$work"; rm -f "$OUT.tmp"' EXIT
json="$(cd "$work" && "$GO" mod download -json "$MODULE@$VERSION")"
field() { sed -n "s/^[[:space:]]*\"$1\": \"\(.*\)\",\{0,1\}$/\1/p" <<<"$json"; }
sum="$(field Sum)"
dir="$(field Dir)"
if [[ "$sum" != "$MODULE_SUM" ]]; then
  log "$MODULE@$VERSION has go.sum hash ${sum:-<none>}, expected $MODULE_SUM"
  exit 1
fi
cp "$dir/$CRD_IN_MODULE" "$OUT.tmp"
chmod u+w "$OUT.tmp"
echo "$CRD_SHA256  $OUT.tmp" | sha256sum -c --quiet -
mv "$OUT.tmp" "$OUT"
log "$OUT ($MODULE@$VERSION)"
