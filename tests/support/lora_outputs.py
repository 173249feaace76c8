"""The tiny reference model's expected greedy outputs (``tests/fixtures/lora/expected_outputs.json``, written by
hack/gen_reference_assets.py): the prompts, and per model (``base`` and each sample adapter) the outputs."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

FIXTURE: dict[str, Any] = json.loads(
    (Path(__file__).resolve().parents[1] / "fixtures" / "lora" / "expected_outputs.json").read_text()
)
PROMPTS: list[str] = FIXTURE["prompts"]
OUTPUTS: dict[str, list[str]] = {name: model["outputs"] for name, model in FIXTURE["models"].items()}
SAMPLE_ADAPTERS = ("upper", "reverse", "json")
