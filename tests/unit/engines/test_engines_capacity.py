"""Capacity planning: the published LoRA-cache check case, weights/KV arithmetic and every problem."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from trtfleet_engines.capacity import (
    RUNTIME_RESERVE_BYTES,
    TOKENS_PER_BLOCK,
    estimate_weights,
    kv_bytes_per_token,
    plan_capacity,
)
from trtfleet_engines.errors import DimensionsUnknownError, UnknownGpuError
from trtfleet_engines.gpus import GIB, lookup_gpu
from trtfleet_engines.modeldims import resolve_dimensions

from trtfleet.api.basemodel import BaseModelSpec, CapacityStatus

MakeSpec = Callable[..., BaseModelSpec]

QWEN15_7B = {
    "hiddenSize": 4096,
    "intermediateSize": 11008,
    "numLayers": 32,
    "numAttentionHeads": 32,
    "numKvHeads": 32,
    "vocabSize": 151936,
}


def test_published_lora_cache_check_case(make_spec: MakeSpec) -> None:
    """Qwen1.5-7B fp16, q,k,v,dense,h_to_4h,gate,4h_to_h, max rank 8, host 39,976,960 bytes (TRT-LLM log)."""
    spec = make_spec(
        {
            "source": {"uri": "hf://Qwen/Qwen1.5-7B-Chat"},
            "architecture": "qwen2",
            "dimensions": QWEN15_7B,
            "lora": {
                "maxRank": 8,
                "targetModules": [
                    "attn_q",
                    "attn_k",
                    "attn_v",
                    "attn_dense",
                    "mlp_h_to_4h",
                    "mlp_gate",
                    "mlp_4h_to_h",
                ],
                "cache": {"hostMemoryBytes": 39_976_960, "optimalAdapterSize": 8, "maxAdapterSize": 64},
            },
        }
    )
    plan = plan_capacity(spec)
    assert plan.dimensions_source == "spec.dimensions"
    lora = plan.lora
    assert lora is not None
    assert lora.page_width == 8192
    assert lora.slots_per_page == 2560
    assert lora.max_adapter_elements == 19_988_480
    assert lora.max_adapter_rank == 8
    assert lora.host.pages == 1
    assert lora.host.max_rank_adapters == 1
    status = plan.to_status()
    assert (status["loraPageWidth"], status["loraSlotsPerPage"], status["loraHostAdapters"]) == (
        8192,
        2560,
        1,
    )


def test_llama3_8b_weights_and_kv_per_token(make_spec: MakeSpec) -> None:
    spec = make_spec()
    resolved = resolve_dimensions(spec)
    weights = estimate_weights(spec, resolved)
    assert weights.params == 8_030_261_248  # Llama 3 8B's published parameter count
    assert weights.bytes_total == 2 * weights.params
    # 2 (K and V) x 32 layers x 8 KV heads x 128 head dim x 2 bytes
    assert kv_bytes_per_token(spec, resolved) == 131_072


@pytest.mark.parametrize(
    ("mode", "low", "high"),
    [
        ("int8_weight_only", 0.55, 0.6),
        ("int4_weight_only", 0.3, 0.35),
        ("int4_awq", 0.3, 0.37),
        ("fp8", 0.55, 0.6),
    ],
)
def test_quantized_weights_are_smaller(make_spec: MakeSpec, mode: str, low: float, high: float) -> None:
    """Quantization shrinks linear layers only; embeddings and lm_head stay fp16 (1 GiB for Llama 3 8B)."""
    full = plan_capacity(make_spec()).weights_bytes
    quantized = plan_capacity(make_spec({"quantization": {"mode": mode}})).weights_bytes
    assert low < quantized / full < high


def test_awq_scales_cost_more_than_per_channel_int4(make_spec: MakeSpec) -> None:
    awq = plan_capacity(make_spec({"quantization": {"mode": "int4_awq"}})).weights_bytes
    int4 = plan_capacity(make_spec({"quantization": {"mode": "int4_weight_only"}})).weights_bytes
    assert awq > int4


def test_tensor_parallel_splits_weights_and_kv_heads(make_spec: MakeSpec) -> None:
    one = plan_capacity(make_spec())
    two = plan_capacity(make_spec({"parallelism": {"tensor": 2}, "engine": {"gpu": {"count": 2}}}))
    assert abs(two.weights_bytes - one.weights_bytes / 2) <= 1
    assert two.kv_bytes_per_token == one.kv_bytes_per_token // 2


def test_kv_cache_arithmetic_is_consistent(make_spec: MakeSpec) -> None:
    plan = plan_capacity(make_spec())
    gpu = lookup_gpu("H100-80GB")
    assert plan.free_bytes == gpu.memory_bytes - plan.weights_bytes - plan.runtime_reserve_bytes
    assert plan.runtime_reserve_bytes > RUNTIME_RESERVE_BYTES
    assert plan.lora is not None
    device = plan.lora.device
    # TRT-LLM allocates the device tier in whole pages before it sizes the KV cache
    assert device.allocated_bytes == device.pages * plan.lora.slots_per_page * plan.lora.page_width * 2
    assert 0 <= device.allocated_bytes - device.bytes < plan.lora.slots_per_page * plan.lora.page_width * 2
    assert plan.kv_cache_bytes == int(0.9 * (plan.free_bytes - device.allocated_bytes))
    assert plan.kv_cache_tokens == plan.kv_cache_blocks * TOKENS_PER_BLOCK
    assert plan.kv_cache_blocks == plan.kv_cache_bytes // (plan.kv_bytes_per_token * TOKENS_PER_BLOCK)
    assert plan.verdict == "ok" and plan.problems == ()


def test_more_adapters_of_optimal_rank_than_of_max_rank(make_spec: MakeSpec) -> None:
    plan = plan_capacity(make_spec({"lora": {"cache": {"optimalAdapterSize": 8, "hostMemoryBytes": "4Gi"}}}))
    assert plan.lora is not None
    host = plan.lora.host
    assert host.optimal_rank_adapters > host.max_rank_adapters >= 1
    assert host.bytes == 4 * GIB


def test_lora_disabled_has_no_lora_status(make_spec: MakeSpec) -> None:
    plan = plan_capacity(make_spec({"lora": {"enabled": False}}))
    assert plan.lora is None
    status = plan.to_status()
    assert status["loraHostAdapters"] is None and status["kvCacheTokens"] == plan.kv_cache_tokens


def test_status_fits_the_crd_type(make_spec: MakeSpec) -> None:
    status = plan_capacity(make_spec()).to_status()
    assert set(status) == {
        "weightsBytes",
        "kvCacheTokens",
        "loraHostAdapters",
        "loraDeviceAdapters",
        "loraPageWidth",
        "loraSlotsPerPage",
        "loraHostPages",
        "loraDevicePages",
        "kvBytesPerToken",
        "memoryBandwidthBytesPerSecond",
    }
    assert CapacityStatus.model_validate(status).to_wire() == status


@pytest.mark.parametrize(
    ("patch", "gpu", "fragments"),
    [
        (
            {"source": {"uri": "hf://meta-llama/Llama-3.3-70B-Instruct"}},
            "A100-80GB",
            ["weights need 131.", "raise parallelism.tensor"],
        ),
        (
            {"lora": {"cache": {"hostMemoryBytes": "1Mi"}}},
            None,
            ["lora.cache.hostMemoryBytes 1048576 gives 102 LoRA cache slots", "needs 32768 slots in 8 pages",
             "Not enough space allocated to host LoRA cache"],
        ),
        (
            {
                "engine": {"maxInputLen": 1000, "maxSeqLen": 100_000},
                "serving": {"kvCacheFreeGpuMemFraction": 0.01},
            },
            "L4",
            ["one request may need engine.maxSeqLen 100000", "raise serving.kvCacheFreeGpuMemFraction"],
        ),
        ({"quantization": {"mode": "fp8"}}, "A100-40GB", ["quantization.mode fp8 needs a GPU with fp8"]),
        ({"quantization": {"kvCacheDtype": "fp8"}}, "A10G", ["quantization.kvCacheDtype fp8 needs"]),
        (
            {"lora": {"cache": {"gpuMemoryFraction": 0.0001}}},
            "L4",
            ["the LoRA device tier", "in 8 pages", "Not enough space allocated to device LoRA cache"],
        ),
    ],
)
def test_problems_name_the_number_and_the_fix(
    make_spec: MakeSpec, patch: dict[str, Any], gpu: str | None, fragments: list[str]
) -> None:
    plan = plan_capacity(make_spec(patch), lookup_gpu(gpu) if gpu else None)
    assert plan.verdict == "error"
    text = "\n".join(plan.problems)
    for fragment in fragments:
        assert fragment in text


def test_the_exact_host_bytes_one_adapter_needs_is_enough(make_spec: MakeSpec) -> None:
    small = plan_capacity(make_spec({"lora": {"cache": {"hostMemoryBytes": "1Mi"}}}))
    needed = int(small.problems[0].split("at least ")[1].split(",")[0])
    fits = plan_capacity(make_spec({"lora": {"cache": {"hostMemoryBytes": needed}}}))
    assert fits.lora is not None and fits.lora.host.max_rank_adapters == 1
    short = plan_capacity(make_spec({"lora": {"cache": {"hostMemoryBytes": needed - 1}}}))
    assert short.verdict == "error"


def test_reference_tiny_plans_against_the_cpu_budget(make_spec: MakeSpec) -> None:
    spec = make_spec(
        {
            "source": {"uri": "file:///opt/trtfleet/models/tiny-llama"},
            "runtime": "reference",
            "engine": {
                "gpu": {"product": "cpu"},
                "maxBatchSize": 8,
                "maxInputLen": 256,
                "maxSeqLen": 512,
                "maxNumTokens": 2048,
            },
            "lora": {"maxRank": 8, "cache": {"hostMemoryBytes": "2Mi", "maxAdapterSize": 8}},
        }
    )
    plan = plan_capacity(spec)
    assert plan.gpu == "cpu" and plan.verdict == "ok"
    assert plan.lora is not None
    # tiny-llama: hidden 64, q/k/v out 64/32/32, intermediate 176 -> page width min(64+32) = 96
    assert plan.lora.page_width == 96
    assert plan.lora.host.max_rank_adapters >= 2


def test_unknown_dimensions_and_gpu_raise(make_spec: MakeSpec) -> None:
    with pytest.raises(DimensionsUnknownError, match="set spec.dimensions"):
        plan_capacity(make_spec({"source": {"uri": "hf://someone/unknown-model"}}))
    with pytest.raises(UnknownGpuError):
        plan_capacity(make_spec({"engine": {"gpu": {"product": "Z80"}}}))
