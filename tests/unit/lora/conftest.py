"""Fixtures of the LoRA conversion and numpy-Llama tests: the committed tiny model, adapters and outputs.

Everything here was produced once by ``hack/gen_reference_assets.py`` with the real transformers + peft
models; the tests need neither torch nor a hub.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from trtfleet_engines.reference.numpy_llama import (
    SAMPLE_ADAPTERS_DIR,
    TINY_LLAMA_DIR,
    LlamaWeights,
    TinyLlama,
)

FIXTURES_DIR = Path(__file__).resolve().parents[2] / "fixtures" / "lora"


@pytest.fixture(scope="session")
def tiny() -> TinyLlama:
    return TinyLlama(LlamaWeights.load(TINY_LLAMA_DIR))


@pytest.fixture(scope="session")
def fixtures_dir() -> Path:
    return FIXTURES_DIR


@pytest.fixture(scope="session")
def expected_outputs() -> dict[str, Any]:
    data: dict[str, Any] = json.loads((FIXTURES_DIR / "expected_outputs.json").read_text())
    return data


@pytest.fixture(scope="session")
def adapters_dir() -> Path:
    return Path(SAMPLE_ADAPTERS_DIR)
