"""QLoRA's base variant on the tiny model: the linear weights replaced by bitsandbytes' 4-bit round trip, and
``trtfleet worker --base-quantization`` serving it (merged adapters folded into it, not into the original)."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np
import pytest
from trtfleet_engines.lora.bnb4bit import quantize_dequantize, round_to
from trtfleet_engines.lora.errors import BaseModelFormatError
from trtfleet_engines.lora.merge import read_safetensors_raw, to_float32, write_safetensors
from trtfleet_engines.lora.qlora_base import VARIANT_RECORD, BaseQuantization, write_base_variant
from trtfleet_engines.reference.cli import build_repository, configure
from trtfleet_engines.reference.numpy_llama import SAMPLE_ADAPTERS_DIR, TINY_LLAMA_DIR, LlamaWeights, TinyLlama

from tests.unit.lora.test_merge_reference import float32_dynamic
from tests.unit.lora.test_numpy_llama import assert_float32_equal, prefill_logits

BASE = Path(TINY_LLAMA_DIR)


@pytest.mark.parametrize(
    ("text", "want"),
    [
        pytest.param("nf4", BaseQuantization("nf4", 64, False, "bfloat16"), id="defaults"),
        pytest.param("FP4:128", BaseQuantization("fp4", 128, False, "bfloat16"), id="block-size"),
        pytest.param("nf4:64:double:float16", BaseQuantization("nf4", 64, True, "float16"), id="everything"),
    ],
)
def test_specs_parse(text: str, want: BaseQuantization) -> None:
    assert BaseQuantization.parse(text) == want


@pytest.mark.parametrize("text", ["int8", "nf4:100", "nf4:64:triple", ""])
def test_bad_specs_are_refused(text: str) -> None:
    with pytest.raises(ValueError, match="base quantization"):
        BaseQuantization.parse(text)


def test_the_variant_replaces_only_the_linear_weights(tmp_path: Path) -> None:
    spec = BaseQuantization("nf4", 64, False, "bfloat16")
    replaced = write_base_variant(BASE, spec, tmp_path / "v")
    before, _ = read_safetensors_raw(BASE / "model.safetensors")
    after, _ = read_safetensors_raw(tmp_path / "v" / "model.safetensors")
    assert len(replaced) == 7 * 2 and set(replaced) <= set(before)  # seven linear modules in both layers
    for name, tensor in before.items():
        if name in replaced:
            want = round_to(quantize_dequantize(to_float32(name, tensor), "float32", 64, "nf4", double_quant=False),
                            "bfloat16")
            assert np.array_equal(to_float32(name, after[name]), want)
        else:
            assert after[name] == tensor  # embeddings, norms, lm_head byte for byte
    assert json.loads((tmp_path / "v" / VARIANT_RECORD).read_text())["baseQuantization"]["quant_type"] == "nf4"
    with pytest.raises(FileExistsError):
        write_base_variant(BASE, spec, tmp_path / "v")


def test_a_model_without_linear_weights_is_refused(tmp_path: Path) -> None:
    tensors, metadata = read_safetensors_raw(BASE / "model.safetensors")
    (tmp_path / "embeddings").mkdir()
    write_safetensors(tmp_path / "embeddings" / "model.safetensors",
                      {"model.embed_tokens.weight": tensors["model.embed_tokens.weight"]}, metadata)
    with pytest.raises(BaseModelFormatError, match="no decoder linear weights"):
        write_base_variant(tmp_path / "embeddings", BaseQuantization(), tmp_path / "out")
    assert not (tmp_path / "out").exists()


def test_the_worker_merges_a_qlora_adapter_into_the_variant(tmp_path: Path) -> None:
    parser = argparse.ArgumentParser()
    configure(parser)
    args = parser.parse_args(["--runtime", "pytorch", "--server", "triton", "--base-quantization", "nf4:64",
                              "--merged-adapter", str(SAMPLE_ADAPTERS_DIR / "upper")])
    build_repository(args, tmp_path / "models")
    variant = TinyLlama(LlamaWeights.load(tmp_path / "base-variant"))
    merged = TinyLlama(LlamaWeights.load(tmp_path / "merged-model"))
    dynamic = float32_dynamic(SAMPLE_ADAPTERS_DIR / "upper", variant)
    for prompt in ("hello world", "abc"):
        assert_float32_equal(prefill_logits(merged, prompt), prefill_logits(variant, prompt, dynamic))
    original = TinyLlama(LlamaWeights.load(BASE))
    assert np.abs(prefill_logits(variant, "abc") - prefill_logits(original, "abc")).max() > 1e-3  # not the original


def test_a_sharded_checkpoint_keeps_its_shards(tmp_path: Path) -> None:
    from trtfleet_engines.lora import safetensors_io
    from trtfleet_engines.lora.merge import SAFETENSORS_INDEX

    tensors, metadata = read_safetensors_raw(BASE / "model.safetensors")
    names = sorted(tensors)
    halves = {"model-00001-of-00002.safetensors": names[: len(names) // 2],
              "model-00002-of-00002.safetensors": names[len(names) // 2 :]}
    sharded = tmp_path / "sharded"
    sharded.mkdir()
    (sharded / "config.json").write_bytes((BASE / "config.json").read_bytes())
    for shard, part in halves.items():
        safetensors_io.write(sharded / shard, {n: tensors[n] for n in part}, metadata)
    weight_map = {n: shard for shard, part in halves.items() for n in part}
    (sharded / SAFETENSORS_INDEX).write_text(json.dumps({"metadata": {"total_size": 1}, "weight_map": weight_map}))
    spec = BaseQuantization("fp4", 64, True, "float16")
    assert write_base_variant(sharded, spec, tmp_path / "v2") == write_base_variant(BASE, spec, tmp_path / "v1")
    whole, _ = read_safetensors_raw(tmp_path / "v1" / "model.safetensors")
    for shard, part in halves.items():
        written, _ = read_safetensors_raw(tmp_path / "v2" / shard)
        assert sorted(written) == sorted(part) and all(written[n] == whole[n] for n in part)
    index = json.loads((tmp_path / "v2" / SAFETENSORS_INDEX).read_text())
    assert index["weight_map"] == weight_map and index["metadata"]["total_size"] > 1
    assert not (tmp_path / "v2" / "model.safetensors").exists()
