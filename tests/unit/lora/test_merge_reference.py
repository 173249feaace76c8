"""The reference engine's merged mode (``merge_dir(..., dtype=None)``, float32 weights summed in float64):
a merged model answers exactly as the base model with the same adapter applied dynamically.

Two comparisons, each with the tolerance its computations allow:

* merged vs dynamic in float32 (the adapter's float32 A and scaled B through numpy_lora): the same
  arithmetic up to summation order and one rounding of each merged weight, so within
  :data:`FP32_REORDER_ULPS` of the largest logit (measured: at most 8.5 ulps on the sample adapters);
* merged vs PEFT's own float32 model (committed logits): the numpy forward's stated tolerance against
  transformers, :data:`FP32_LOGITS_ATOL`; rsLoRA and rank/alpha patterns included.

Greedy outputs equal the committed dynamic outputs of every sample adapter.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from trtfleet_engines.lora.errors import BaseModelFormatError
from trtfleet_engines.lora.merge import MERGE_RECORD, merge_dir, read_safetensors_raw, write_safetensors
from trtfleet_engines.lora.peft import parse_peft_adapter, read_peft_dir
from trtfleet_engines.reference.errors import RepositoryError
from trtfleet_engines.reference.merged import MergedAdapter, merged_model_dir
from trtfleet_engines.reference.numpy_llama import (
    SAMPLE_ADAPTER_NAMES,
    TINY_LLAMA_DIR,
    AdapterWeights,
    LlamaWeights,
    LoraLayerWeights,
    TinyLlama,
    greedy_generate,
)
from trtfleet_engines.reference.tokenizer import decode, prompt_ids

from tests.unit.lora.test_numpy_llama import FP32_LOGITS_ATOL, assert_float32_equal, prefill_logits
from trtfleet.api.basemodel import LORA_MODULE_IDS, LoraModule

BASE = Path(TINY_LLAMA_DIR)


def float32_dynamic(adapter_dir: Path, model: TinyLlama) -> AdapterWeights:
    """The PEFT adapter as numpy_lora applies it, in float32 (B scaled by PEFT's scale), no fp16 storage."""
    parsed = parse_peft_adapter(*read_peft_dir(adapter_dir))
    modules = {
        (m.layer, LORA_MODULE_IDS[LoraModule(m.trtllm_module)]): LoraLayerWeights(
            m.a.astype(np.float32), (m.b * np.float32(m.scale)).astype(np.float32)
        )
        for m in parsed.modules
    }
    return AdapterWeights(model.config, modules)


def merged(adapter_dir: Path, tmp_path: Path) -> TinyLlama:
    out = merged_model_dir(BASE, MergedAdapter.from_flags(adapter_dir, None), tmp_path)
    return TinyLlama(LlamaWeights.load(out))


@pytest.mark.parametrize("name", SAMPLE_ADAPTER_NAMES)
def test_merged_equals_dynamic_float32(
    name: str, tiny: TinyLlama, adapters_dir: Path, expected_outputs: dict[str, Any], tmp_path: Path
) -> None:
    model = merged(adapters_dir / name, tmp_path)
    dynamic = float32_dynamic(adapters_dir / name, tiny)
    for prompt in [*expected_outputs["prompts"], *expected_outputs["logit_prompts"]]:
        want = prefill_logits(tiny, prompt, dynamic)
        assert_float32_equal(prefill_logits(model, prompt), want)
        assert np.abs(prefill_logits(tiny, prompt) - want).max() > 1.0  # the adapter is not a no-op


@pytest.mark.parametrize("name", SAMPLE_ADAPTER_NAMES)
def test_merged_greedy_outputs_equal_the_dynamic_outputs(
    name: str, adapters_dir: Path, expected_outputs: dict[str, Any], tmp_path: Path
) -> None:
    model = merged(adapters_dir / name, tmp_path)
    want = expected_outputs["models"][name]
    for prompt, want_ids, want_text in zip(
        expected_outputs["prompts"], want["output_ids"], want["outputs"], strict=True
    ):
        got = greedy_generate(model, prompt_ids(prompt), expected_outputs["max_new_tokens"])
        assert got == want_ids, f"{name} {prompt!r}: {decode(got)!r} != {want_text!r}"


@dataclass(frozen=True)
class PeftCase:
    adapter_dir: str
    logits_of: str  # "sample": expected_outputs.json's logits of that adapter; "fixture": its expected.json


@pytest.mark.parametrize(
    "case",
    [
        *(pytest.param(PeftCase(name, "sample"), id=name) for name in SAMPLE_ADAPTER_NAMES),
        pytest.param(PeftCase("rslora", "fixture"), id="rslora-alpha-over-sqrt-r"),
        pytest.param(PeftCase("rank_pattern", "fixture"), id="rank-and-alpha-patterns"),
    ],
)
def test_merged_reproduces_peft_float32_logits(
    case: PeftCase, adapters_dir: Path, fixtures_dir: Path, expected_outputs: dict[str, Any], tmp_path: Path
) -> None:
    if case.logits_of == "sample":
        source = adapters_dir / case.adapter_dir
        prompts, logits = expected_outputs["logit_prompts"], expected_outputs["models"][case.adapter_dir]["logits"]
    else:
        source = fixtures_dir / case.adapter_dir
        expected = json.loads((source / "expected.json").read_text())
        prompts, logits = expected["prompts"], expected["logits"]
    model = merged(source, tmp_path)
    for prompt, want in zip(prompts, logits, strict=True):
        np.testing.assert_allclose(prefill_logits(model, prompt), np.asarray(want, np.float32),
                                   atol=FP32_LOGITS_ATOL, rtol=0)


def test_base_dtype_merge_keeps_float32_and_records_it(adapters_dir: Path, tmp_path: Path) -> None:
    result = merge_dir(BASE, adapters_dir / "upper", tmp_path / "m", None)
    assert result.dtype is None
    tensors, _ = read_safetensors_raw(tmp_path / "m" / "model.safetensors")
    assert {tensors[name].dtype for name in result.changed} == {"F32"}
    assert json.loads((tmp_path / "m" / MERGE_RECORD).read_text())["dtype"] == "base"


def test_base_dtype_merge_refuses_bfloat16_weights(adapters_dir: Path, tmp_path: Path) -> None:
    base = tmp_path / "bf16"
    base.mkdir()
    (base / "config.json").write_bytes((BASE / "config.json").read_bytes())
    tensors, metadata = read_safetensors_raw(BASE / "model.safetensors")
    name = "model.layers.0.self_attn.q_proj.weight"
    raw = tensors[name]
    bits = (np.frombuffer(raw.data, "<f4").view(np.uint32) >> 16).astype("<u2")
    tensors[name] = type(raw)("BF16", raw.shape, bits.tobytes())
    write_safetensors(base / "model.safetensors", tensors, metadata)
    with pytest.raises(BaseModelFormatError, match="BF16.*--dtype bfloat16"):
        merge_dir(base, adapters_dir / "upper", tmp_path / "out", None)


def test_an_adapter_that_cannot_merge_is_a_repository_error(fixtures_dir: Path, tmp_path: Path) -> None:
    # The fused fixture adapts qkv_proj and gate_up_proj, which the tiny Llama (separate q/k/v, gate/up) lacks.
    with pytest.raises(RepositoryError, match="cannot merge adapter fused .*has no weight .*qkv_proj"):
        merged_model_dir(BASE, MergedAdapter.from_flags(fixtures_dir / "fused", None), tmp_path)
    assert not (tmp_path / "merged-model").exists()
