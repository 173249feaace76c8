#!/usr/bin/env bash
# Create the throwaway virtual environment that regenerates the tiny reference
# model and its sample LoRA adapters (hack/gen_reference_assets.py).
#
#   ${TRTFLEET_CACHE:-$HOME/.cache/trtfleet}/fixture-venv/
#
# It lives OUTSIDE the checkout: torch, transformers and peft are needed only to
# regenerate the committed fixtures, never by the project or its tests (those
# read the committed safetensors/json outputs with numpy).
#
# PyPI's default torch wheel for Linux pulls the CUDA runtime wheels (several
# GB); that is fine for a one-off. Set TORCH_SPEC to pin another build.
#
# Usage:
#   hack/fixture-venv.sh                 # create (idempotent), print the python path
#   "$(hack/fixture-venv.sh)" hack/gen_reference_assets.py
set -euo pipefail

CACHE="${TRTFLEET_CACHE:-$HOME/.cache/trtfleet}"
VENV="$CACHE/fixture-venv"
PYTHON="${PYTHON:-python3.11}"
TORCH_SPEC="${TORCH_SPEC:-torch>=2.4,<3}"
STAMP="$VENV/.complete"

log() { printf '[fixture-venv] %s\n' "$*" >&2; }

if [[ ! -f "$STAMP" ]]; then
    log "creating $VENV"
    rm -rf "$VENV"
    mkdir -p "$CACHE"
    "$PYTHON" -m venv "$VENV"
    "$VENV/bin/python" -m pip install --quiet --upgrade pip >&2
    "$VENV/bin/python" -m pip install --quiet \
        "$TORCH_SPEC" \
        "transformers>=4.45,<6" \
        "peft>=0.13,<1" \
        "safetensors>=0.4" \
        "numpy<2" >&2
    "$VENV/bin/python" -c 'import torch, transformers, peft, safetensors, numpy; print(
        "torch", torch.__version__, "transformers", transformers.__version__, "peft", peft.__version__,
        "numpy", numpy.__version__)' >&2
    touch "$STAMP"
fi
echo "$VENV/bin/python"
