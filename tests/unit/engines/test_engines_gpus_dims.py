"""The GPU table and model dimensions: lookups, aliases, precedence and clear errors."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest
from trtfleet_engines.errors import DimensionsUnknownError, UnknownGpuError, UnsupportedError
from trtfleet_engines.gpus import CPU_DEVICE_BUDGET_BYTES, GPUS, lookup_gpu, require_fp8
from trtfleet_engines.modeldims import (
    BUILTIN_DIMENSIONS,
    SOURCE_BUILTIN,
    SOURCE_CONFIG_JSON,
    SOURCE_SPEC,
    TINY_LLAMA_DIMENSIONS,
    dimensions_from_config,
    load_config_json,
    resolve_dimensions,
)

from trtfleet.api.basemodel import BaseModelSpec

MakeSpec = Callable[..., BaseModelSpec]


@pytest.mark.parametrize(
    ("product", "sm", "fp8", "gib_at_least"),
    [
        ("A10G", "sm_86", False, 22),
        ("L4", "sm_89", True, 22),
        ("L40S", "sm_89", True, 44),
        ("A100-40GB", "sm_80", False, 39),
        ("A100-80GB", "sm_80", False, 79),
        ("H100-80GB", "sm_90", True, 79),
        ("H200", "sm_90", True, 139),
        ("B200", "sm_100", True, 178),
        ("cpu", "cpu", False, 4),
    ],
)
def test_gpu_table(product: str, sm: str, fp8: bool, gib_at_least: int) -> None:
    gpu = lookup_gpu(product)
    assert (gpu.product, gpu.sm, gpu.fp8) == (product, sm, fp8)
    assert gib_at_least * 2**30 <= gpu.memory_bytes <= (gib_at_least + 16) * 2**30


@pytest.mark.parametrize(
    ("name", "product"),
    [
        ("h100-80gb", "H100-80GB"),
        ("NVIDIA-H100-80GB-HBM3", "H100-80GB"),
        ("NVIDIA A100-SXM4-80GB", "A100-80GB"),
        ("l40s", "L40S"),
        ("CPU", "cpu"),
    ],
)
def test_gpu_aliases(name: str, product: str) -> None:
    assert lookup_gpu(name).product == product


def test_unknown_gpu_lists_every_known_product() -> None:
    with pytest.raises(UnknownGpuError) as info:
        lookup_gpu("V100")
    for product in GPUS:
        assert product in str(info.value)


def test_fp8_requirement() -> None:
    require_fp8(lookup_gpu("L4"), "quantization.mode fp8")
    with pytest.raises(UnsupportedError, match="A100-80GB is sm_80"):
        require_fp8(lookup_gpu("A100-80GB"), "quantization.mode fp8")


def test_cpu_budget_is_the_cpu_products_memory() -> None:
    assert lookup_gpu("cpu").memory_bytes == CPU_DEVICE_BUDGET_BYTES and lookup_gpu("cpu").is_cpu


LLAMA3_CONFIG = {
    "architectures": ["LlamaForCausalLM"],
    "hidden_size": 4096,
    "intermediate_size": 14336,
    "num_hidden_layers": 32,
    "num_attention_heads": 32,
    "num_key_value_heads": 8,
    "vocab_size": 128256,
    "tie_word_embeddings": False,
}


def test_config_json_wins_over_spec_and_table(make_spec: MakeSpec, tmp_path: Path) -> None:
    spec = make_spec(
        {
            "dimensions": {
                "hiddenSize": 8,
                "intermediateSize": 8,
                "numLayers": 1,
                "numAttentionHeads": 1,
                "numKvHeads": 1,
                "vocabSize": 8,
            }
        }
    )
    resolved = resolve_dimensions(spec, config_json=LLAMA3_CONFIG)
    assert resolved.source == SOURCE_CONFIG_JSON and resolved.dims.hidden_size == 4096
    assert resolve_dimensions(spec).source == SOURCE_SPEC and resolve_dimensions(spec).dims.hidden_size == 8
    assert resolve_dimensions(make_spec()).source == SOURCE_BUILTIN
    (tmp_path / "config.json").write_text(json.dumps(LLAMA3_CONFIG))
    assert load_config_json(tmp_path) == resolved == load_config_json(tmp_path / "config.json")


def test_builtin_matches_config_json_of_llama3() -> None:
    assert (
        dimensions_from_config(LLAMA3_CONFIG).dims
        == BUILTIN_DIMENSIONS["hf://meta-llama/meta-llama-3-8b-instruct"].dims
    )


def test_builtin_lookup_ignores_case_and_revision(make_spec: MakeSpec) -> None:
    spec = make_spec({"source": {"uri": "hf://Qwen/Qwen2.5-7B-Instruct", "revision": "xyz"}})
    assert resolve_dimensions(spec).dims.hidden_size == 3584


def test_tiny_llama_dimensions(make_spec: MakeSpec) -> None:
    resolved = resolve_dimensions(make_spec({"source": {"uri": "file:///opt/trtfleet/models/tiny-llama"}}))
    assert resolved.dims == TINY_LLAMA_DIMENSIONS
    d = TINY_LLAMA_DIMENSIONS
    assert (
        d.hidden_size,
        d.intermediate_size,
        d.num_layers,
        d.num_attention_heads,
        d.num_kv_heads,
        d.head_size,
        d.vocab_size,
    ) == (64, 176, 2, 4, 2, 16, 260)


def test_mixture_of_experts_and_multimodal_configs() -> None:
    moe = dimensions_from_config({**LLAMA3_CONFIG, "num_local_experts": 8, "vocab_size": 32000})
    assert moe.num_experts == 8
    wrapped = dimensions_from_config({"model_type": "llava", "text_config": LLAMA3_CONFIG})
    assert wrapped.dims.num_layers == 32


def test_missing_dimensions_say_what_to_set(make_spec: MakeSpec, tmp_path: Path) -> None:
    with pytest.raises(DimensionsUnknownError, match="set spec.dimensions"):
        resolve_dimensions(make_spec({"source": {"uri": "hf://nobody/mystery-13b"}}))
    with pytest.raises(DimensionsUnknownError, match="intermediate_size, num_layers"):
        dimensions_from_config({"hidden_size": 1, "num_attention_heads": 1, "vocab_size": 1})
    with pytest.raises(DimensionsUnknownError, match="cannot read"):
        load_config_json(tmp_path / "absent.json")
