#!/usr/bin/env bash
# Build trtfleet's three images from images/*.Dockerfile with a local container engine (docker or podman):
#   trtfleet          operator, router, convert/prepare Jobs, the CLI bundle for stock TRT-LLM images
#   reference-worker  the CPU reference engine (runtime: reference)
#   modelopt          a TensorRT-LLM image plus ModelOpt's llm_ptq example (quantizing pytorch prepares);
#                     FROM NVIDIA's image (~20 GB): MODELOPT_BASE picks the release, IMAGES=... skips it
# Environment: IMAGE_REGISTRY (ghcr.io/trtfleet), IMAGE_TAG (trtfleet's version), IMAGES (all three),
# CONTAINER_ENGINE (docker, else podman), MODELOPT_BASE (the API's default engine image).
# Exit codes: 0 built; 1 a build failed; 3 no container engine with a running daemon here: nothing was built.
set -euo pipefail
cd "$(dirname "$0")/.."
REGISTRY="${IMAGE_REGISTRY:-ghcr.io/trtfleet}"
TAG="${IMAGE_TAG:-$(sed -n 's/^__version__ = "\(.*\)"$/\1/p' trtfleet/version.py)}"
IMAGES="${IMAGES:-trtfleet reference-worker modelopt}"
engine="${CONTAINER_ENGINE:-}"
if [[ -z "$engine" ]]; then
  for candidate in docker podman; do
    if command -v "$candidate" >/dev/null && "$candidate" info >/dev/null 2>&1; then engine="$candidate"; break; fi
  done
fi
if [[ -z "$engine" ]] || ! "$engine" info >/dev/null 2>&1; then
  echo "make images: no container engine here (docker or podman with a running daemon): nothing was built." >&2
  echo "make images: run it where one exists, or let the release workflow (.github/workflows/release.yaml) build them." >&2
  exit 3
fi
for name in $IMAGES; do
  [[ -f "images/$name.Dockerfile" ]] || { echo "make images: no images/$name.Dockerfile" >&2; exit 1; }
  ref="$REGISTRY/$name:$TAG"
  args=()
  if [[ "$name" == modelopt && -n "${MODELOPT_BASE:-}" ]]; then args+=(--build-arg "TRTLLM_IMAGE=$MODELOPT_BASE"); fi
  context=.
  [[ "$name" == modelopt ]] && context=images
  echo "make images: $engine build -f images/$name.Dockerfile -t $ref $context"
  "$engine" build -f "images/$name.Dockerfile" -t "$ref" "${args[@]}" "$context"
done
