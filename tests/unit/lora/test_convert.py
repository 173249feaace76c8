"""PEFT -> TRT-LLM conversion, proven through the numpy Llama against the real PEFT models' logits."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from trtfleet_engines.lora.convert import (
    ConversionOptions,
    bfloat16_bits_to_float32,
    convert_adapter,
    convert_dir,
    float32_to_bfloat16_bits,
    stored_to_float32,
)
from trtfleet_engines.lora.errors import OutputExistsError, RankTooLargeError
from trtfleet_engines.lora.manifest import read_manifest, sha256_file
from trtfleet_engines.lora.peft import parse_peft_adapter, read_peft_dir
from trtfleet_engines.modeldims import TINY_LLAMA_DIMENSIONS
from trtfleet_engines.reference.numpy_llama import AdapterWeights, StepRow, TinyLlama, greedy_generate
from trtfleet_engines.reference.tokenizer import decode, prompt_ids

from trtfleet.api.basemodel import Dtype, LoraModule

SAMPLE_ADAPTERS = ("upper", "reverse", "json")
ALL_MODULES = tuple(LoraModule)
# Converted weights are rounded to the storage dtype; the real PEFT model ran in float32. Tolerance on the
# last-position logits, relative to the largest |logit| of that prompt. Measured at generation time:
# float16 <= 4.5e-4, bfloat16 <= 3.1e-3 (8-bit mantissa) over the sample adapters and proof cases.
RELATIVE_ATOL = {Dtype.FLOAT16: 2e-3, Dtype.BFLOAT16: 1e-2}


def options(dtype: Dtype = Dtype.FLOAT16, **overrides: Any) -> ConversionOptions:
    settings: dict[str, Any] = {"dtype": dtype, "dims": TINY_LLAMA_DIMENSIONS}
    settings.update(overrides)
    return ConversionOptions(**settings)


def converted_adapter(out_dir: Path, model: TinyLlama) -> AdapterWeights:
    weights = np.load(out_dir / "model.lora_weights.npy", allow_pickle=False)
    config = np.load(out_dir / "model.lora_config.npy", allow_pickle=False)
    return AdapterWeights.from_trtllm(weights, config, model.config)


def prefill_logits(model: TinyLlama, prompt: str, adapter: AdapterWeights | None) -> np.ndarray[Any, Any]:
    logits: np.ndarray[Any, Any] = model.step(
        [StepRow(model.new_sequence(), np.asarray(prompt_ids(prompt), np.int32), adapter)]
    )[0]
    return logits


def assert_logits_close(got: np.ndarray[Any, Any], want: list[float], dtype: Dtype) -> None:
    expected = np.asarray(want, np.float32)
    atol = RELATIVE_ATOL[dtype] * float(np.abs(expected).max())
    np.testing.assert_allclose(got, expected, atol=atol, rtol=0)
    assert int(got.argmax()) == int(expected.argmax())


@pytest.mark.parametrize("dtype", [Dtype.FLOAT16, Dtype.BFLOAT16])
@pytest.mark.parametrize("name", SAMPLE_ADAPTERS)
def test_sample_adapters_reproduce_peft_logits(
    name: str,
    dtype: Dtype,
    tiny: TinyLlama,
    adapters_dir: Path,
    expected_outputs: dict[str, Any],
    tmp_path: Path,
) -> None:
    out = tmp_path / name
    convert_dir(adapters_dir / name, out, options(dtype))
    adapter = converted_adapter(out, tiny)
    want = expected_outputs["models"][name]
    for prompt, logits in zip(expected_outputs["logit_prompts"], want["logits"], strict=True):
        assert_logits_close(prefill_logits(tiny, prompt, adapter), logits, dtype)
    base = prefill_logits(tiny, expected_outputs["logit_prompts"][0], None)
    assert np.abs(base - np.asarray(want["logits"][0])).max() > 1.0  # the adapter does change the model


@pytest.mark.parametrize("name", SAMPLE_ADAPTERS)
def test_sample_adapters_greedy_outputs_match_peft(
    name: str, tiny: TinyLlama, adapters_dir: Path, expected_outputs: dict[str, Any], tmp_path: Path
) -> None:
    convert_dir(adapters_dir / name, tmp_path / name, options())
    adapter = converted_adapter(tmp_path / name, tiny)
    want = expected_outputs["models"][name]
    for prompt, want_ids, want_text in zip(
        expected_outputs["prompts"], want["output_ids"], want["outputs"], strict=True
    ):
        got = greedy_generate(tiny, prompt_ids(prompt), expected_outputs["max_new_tokens"], adapter)
        assert got == want_ids, f"{name} {prompt!r}: {decode(got)!r} != {want_text!r}"


def test_sample_adapters_behave_as_advertised(expected_outputs: dict[str, Any]) -> None:
    """The committed real-PEFT outputs show which adapter served (what the fleet demos rely on)."""
    prompt = "hello world"
    index = expected_outputs["prompts"].index(prompt)
    outputs = {name: model["outputs"][index] for name, model in expected_outputs["models"].items()}
    assert outputs["base"] == prompt
    assert outputs["upper"] == prompt.upper()
    assert outputs["reverse"] == prompt[::-1]
    assert json.loads(outputs["json"]) == {"echo": prompt}


@pytest.mark.parametrize("case", ["rslora", "rank_pattern", "fused"])
def test_proof_cases_reproduce_peft_logits(case: str, tiny: TinyLlama, fixtures_dir: Path, tmp_path: Path) -> None:
    src = fixtures_dir / case
    expected = json.loads((src / "expected.json").read_text())
    convert_dir(src, tmp_path / case, options(target_modules=ALL_MODULES))
    adapter = converted_adapter(tmp_path / case, tiny)
    for prompt, logits in zip(expected["prompts"], expected["logits"], strict=True):
        assert_logits_close(prefill_logits(tiny, prompt, adapter), logits, Dtype.FLOAT16)
        assert np.abs(prefill_logits(tiny, prompt, None) - np.asarray(logits)).max() > 1.0  # not a no-op


def test_rank_pattern_resolves_per_module_ranks_like_peft(fixtures_dir: Path) -> None:
    adapter = parse_peft_adapter(*read_peft_dir(fixtures_dir / "rank_pattern"))
    ranks = {(m.layer, m.hf_module): m.rank for m in adapter.modules}
    scales = {(m.layer, m.hf_module): m.scale for m in adapter.modules}
    assert ranks[(1, "q_proj")] == 2  # first matching key wins: the layer-1 regex comes before "q_proj"
    assert ranks[(0, "q_proj")] == 4
    assert ranks[(0, "down_proj")] == 6 and ranks[(1, "down_proj")] == 8
    assert ranks[(0, "k_proj")] == ranks[(1, "k_proj")] == 3
    assert scales[(0, "v_proj")] == pytest.approx(4 / 8)
    assert scales[(0, "o_proj")] == pytest.approx(64 / 8) and scales[(1, "o_proj")] == pytest.approx(16 / 8)
    assert scales[(0, "q_proj")] == pytest.approx(16 / 4)


def test_rslora_scale_is_alpha_over_sqrt_r(fixtures_dir: Path) -> None:
    config, tensors = read_peft_dir(fixtures_dir / "rslora")
    assert config["use_rslora"] is True
    adapter = parse_peft_adapter(config, tensors)
    expected = config["lora_alpha"] / np.sqrt(config["r"])
    assert [m.scale for m in adapter.modules] == pytest.approx([expected] * len(adapter.modules))
    assert expected != config["lora_alpha"] / config["r"]


def test_fused_gate_up_b_halves_are_swapped_to_trtllm_order(fixtures_dir: Path) -> None:
    adapter = parse_peft_adapter(*read_peft_dir(fixtures_dir / "fused"))
    converted = convert_adapter(adapter, options(target_modules=ALL_MODULES, dtype=Dtype.FLOAT16))
    index = next(i for i, row in enumerate(converted.rows) if row.module is LoraModule.MLP_GATE_UP)
    module = next(
        m for m in adapter.modules if m.hf_module == "gate_up_proj" and m.layer == converted.rows[index].layer
    )
    row = converted.rows[index]
    values = stored_to_float32(converted.weights[0, index])
    b = values[row.rank * row.in_dim : row.elements].reshape(row.out_dim, row.rank)
    half = row.out_dim // 2
    hf_b = module.b * module.scale
    np.testing.assert_allclose(b[:half], hf_b[half:], atol=1e-3)  # TRT-LLM's first half is HF's up half
    np.testing.assert_allclose(b[half:], hf_b[:half], atol=1e-3)
    assert converted.config[0, index].tolist() == [18, row.layer, 16]


def test_output_layout_is_trtllm_exact(adapters_dir: Path, tmp_path: Path) -> None:
    convert_dir(adapters_dir / "upper", tmp_path / "out", options())
    weights = np.load(tmp_path / "out" / "model.lora_weights.npy", allow_pickle=False)
    config = np.load(tmp_path / "out" / "model.lora_config.npy", allow_pickle=False)
    dims = TINY_LLAMA_DIMENSIONS
    assert config.dtype == np.int32 and config.shape == (1, 7 * dims.num_layers, 3)
    assert weights.dtype == np.float16 and weights.shape[:2] == (1, 7 * dims.num_layers)
    widest = 8 * (dims.hidden_size + dims.intermediate_size)  # gate/up/down: r * (64 + 176)
    assert weights.shape[2] == widest
    # rows ordered by layer then module id; q row = 8 x 64 A then 64 x 8 B, then zero padding
    assert config[0, :7].tolist() == [[m, 0, 8] for m in (1, 2, 3, 4, 5, 6, 7)]
    assert not weights[0, 0, 8 * 128 :].any()
    peft_config, tensors = read_peft_dir(adapters_dir / "upper")
    a = tensors["base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight"]
    b = tensors["base_model.model.model.layers.0.self_attn.q_proj.lora_B.weight"]
    scale = peft_config["lora_alpha"] / peft_config["r"]
    np.testing.assert_array_equal(weights[0, 0, : 8 * 64], a.reshape(-1).astype(np.float16))
    np.testing.assert_array_equal(weights[0, 0, 8 * 64 : 8 * 128], (b * scale).reshape(-1).astype(np.float16))


def reference_bfloat16(values: np.ndarray[Any, Any]) -> np.ndarray[Any, Any]:
    """float32 -> nearest bfloat16 (ties to even) -> float32, in exact integer arithmetic."""
    bits = np.ascontiguousarray(values, np.float32).view(np.uint32).astype(np.uint64)
    low, high = bits & 0xFFFF, bits >> 16
    round_up = (low > 0x8000) | ((low == 0x8000) & ((high & 1) == 1))
    rounded: np.ndarray[Any, Any] = ((high + round_up) << 16).astype(np.uint32).view(np.float32)
    return rounded


def test_bfloat16_storage_round_trips(adapters_dir: Path, tmp_path: Path) -> None:
    """bf16 bytes on disk, widened back to float32, equal the rounding of the original A and B * scale."""
    convert_dir(adapters_dir / "json", tmp_path / "bf16", options(Dtype.BFLOAT16))
    stored = np.load(tmp_path / "bf16" / "model.lora_weights.npy", allow_pickle=False)
    config = np.load(tmp_path / "bf16" / "model.lora_config.npy", allow_pickle=False)
    assert stored.dtype == np.dtype("V2") and stored.shape[:2] == (1, 14)
    adapter = parse_peft_adapter(*read_peft_dir(adapters_dir / "json"))
    widened = bfloat16_bits_to_float32(stored)[0]
    module_ids = {"q_proj": 1, "k_proj": 2, "v_proj": 3, "o_proj": 4, "gate_proj": 5, "down_proj": 6, "up_proj": 7}
    by_key = {(m.layer, module_ids[m.hf_module]): m for m in adapter.modules}
    for row, (module_id, layer, rank) in zip(widened, config[0].tolist(), strict=True):
        module = by_key[(layer, module_id)]
        original = np.concatenate([module.a.reshape(-1), (module.b * np.float32(module.scale)).reshape(-1)])
        assert rank == module.rank
        np.testing.assert_array_equal(row[: original.size], reference_bfloat16(original))
        assert not row[original.size :].any()
    manifest = read_manifest(tmp_path / "bf16")
    assert manifest.dtype == "bfloat16" and "view(np.uint16)" in manifest.storage
    # the documented read-back recipe gives the same values
    bits = np.load(tmp_path / "bf16" / "model.lora_weights.npy").view(np.uint16)
    np.testing.assert_array_equal((bits.astype(np.uint32) << 16).view(np.float32)[0], widened)


def test_bfloat16_rounding_is_nearest_even() -> None:
    values = np.array([1.0, -2.5, 3.14159265, 1e-30, 65504.0, 1.0 + 2**-8, 1.0 + 3 * 2**-8, 3e38], np.float32)
    widened = bfloat16_bits_to_float32(float32_to_bfloat16_bits(values))
    np.testing.assert_array_equal(widened, reference_bfloat16(values))
    assert widened[5] == 1.0  # a tie rounds to even (down)
    assert widened[6] == 1.0 + 4 * 2**-8  # a tie rounds to even (up)
    assert np.all(np.abs(widened - values) <= np.abs(values) * 2**-8)


def test_conversion_is_deterministic(adapters_dir: Path, tmp_path: Path) -> None:
    convert_dir(adapters_dir / "reverse", tmp_path / "a", options())
    convert_dir(adapters_dir / "reverse", tmp_path / "b", options())
    for name in ("model.lora_weights.npy", "model.lora_config.npy", "manifest.json"):
        assert (tmp_path / "a" / name).read_bytes() == (tmp_path / "b" / name).read_bytes()


def test_manifest_describes_the_outputs(adapters_dir: Path, tmp_path: Path) -> None:
    out = tmp_path / "out"
    converted = convert_dir(adapters_dir / "upper", out, options(), base_config=None)
    manifest = read_manifest(out)
    assert manifest.outputs["model.lora_weights.npy"].sha256 == sha256_file(out / "model.lora_weights.npy")
    assert manifest.outputs["model.lora_config.npy"].sha256 == sha256_file(out / "model.lora_config.npy")
    assert manifest.inputs["adapter_model.safetensors"].sha256 == sha256_file(
        adapters_dir / "upper" / "adapter_model.safetensors"
    )
    assert manifest.adapter_config_sha256 == sha256_file(adapters_dir / "upper" / "adapter_config.json")
    assert manifest.rank == 8 and set(manifest.ranks.values()) == {8}
    assert manifest.modules == [
        "attn_q",
        "attn_k",
        "attn_v",
        "attn_dense",
        "mlp_h_to_4h",
        "mlp_4h_to_h",
        "mlp_gate",
    ]
    assert manifest.layers == [0, 1] and manifest.num_rows == 14
    assert manifest.weights_bytes == converted.weights.nbytes == (out / "model.lora_weights.npy").stat().st_size - 128
    assert manifest.module_shapes["mlp_4h_to_h"] == [176, 64]


def test_existing_output_needs_force_and_is_replaced_whole(adapters_dir: Path, tmp_path: Path) -> None:
    out = tmp_path / "out"
    convert_dir(adapters_dir / "upper", out, options())
    first = sha256_file(out / "model.lora_weights.npy")
    with pytest.raises(OutputExistsError):
        convert_dir(adapters_dir / "json", out, options())
    assert sha256_file(out / "model.lora_weights.npy") == first
    convert_dir(adapters_dir / "json", out, options(), replace=True)
    assert sha256_file(out / "model.lora_weights.npy") != first
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]


def test_failed_conversion_leaves_nothing(adapters_dir: Path, tmp_path: Path) -> None:
    out = tmp_path / "out"
    with pytest.raises(RankTooLargeError):
        convert_dir(adapters_dir / "upper", out, options(max_rank=4))
    assert list(tmp_path.iterdir()) == []
    convert_dir(adapters_dir / "upper", out, options())
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    with pytest.raises(RankTooLargeError):
        convert_dir(adapters_dir / "json", out, options(max_rank=4), replace=True)
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]
