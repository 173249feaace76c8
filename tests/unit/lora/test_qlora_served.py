"""A real QLoRA adapter (trained by peft on the tiny model's NF4 base, hack/gen_qlora_adapter.py) served by the
reference engine: on the base variant trtfleet computes, it reproduces the QLoRA model's logits and greedy
outputs; on the original base it departs from them (the measured size goes to docs/concepts.md)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from trtfleet_engines.lora.qlora_base import BaseQuantization, write_base_variant
from trtfleet_engines.reference.numpy_llama import TINY_LLAMA_DIR, LlamaWeights, TinyLlama, greedy_generate
from trtfleet_engines.reference.tokenizer import prompt_ids

from tests.unit.lora.test_merge_reference import float32_dynamic
from tests.unit.lora.test_numpy_llama import FP32_LOGITS_ATOL, prefill_logits

ADAPTER = Path(__file__).resolve().parents[2] / "fixtures" / "qlora" / "upper-nf4"
EXPECTED: dict[str, Any] = json.loads((ADAPTER / "expected.json").read_text())


@pytest.fixture(scope="module")
def variant(tmp_path_factory: pytest.TempPathFactory) -> TinyLlama:
    quantization = EXPECTED["baseQuantization"]
    spec = BaseQuantization(quantization["quantType"], quantization["blockSize"], quantization["doubleQuant"],
                            quantization["computeDtype"])
    out = tmp_path_factory.mktemp("qlora") / "base"
    write_base_variant(Path(TINY_LLAMA_DIR), spec, out)
    return TinyLlama(LlamaWeights.load(out))


def test_on_its_quantized_base_the_adapter_answers_as_the_qlora_model(variant: TinyLlama) -> None:
    adapter = float32_dynamic(ADAPTER, variant)
    for prompt, logits, ids in zip(EXPECTED["prompts"], EXPECTED["logits"], EXPECTED["output_ids"], strict=True):
        np.testing.assert_allclose(prefill_logits(variant, prompt, adapter), np.asarray(logits, np.float32),
                                   atol=FP32_LOGITS_ATOL, rtol=0)
        assert greedy_generate(variant, prompt_ids(prompt), len(ids) + 1, adapter) == ids, prompt


def test_on_the_original_base_it_departs(variant: TinyLlama) -> None:
    original = TinyLlama(LlamaWeights.load(TINY_LLAMA_DIR))
    adapter = float32_dynamic(ADAPTER, original)
    departure = max(
        float(np.abs(prefill_logits(original, p, adapter) - np.asarray(want)).max() / np.abs(want).max())
        for p, want in zip(EXPECTED["prompts"], EXPECTED["logits"], strict=True)
    )
    assert departure > 100 * FP32_LOGITS_ATOL  # far beyond the agreement on the quantized base
