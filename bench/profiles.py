"""Fleet profiles for the simulator: an H100 Llama-3-8B fleet and the CPU reference-engine fleet.

Cache geometry always comes from :mod:`trtfleet.loracache` (the same numbers the capacity planner,
the reference engine and the router use), never from a constant of our own.
"""

from __future__ import annotations

import dataclasses

from bench.podsim import H100_LLAMA3_8B, PodSpec, StepTimeModel
from bench.simulate import FleetSpec
from trtfleet.api.basemodel import DEFAULT_TARGET_MODULES, ModelDimensions
from trtfleet.loracache import (
    LoraCacheConfig,
    adapter_pages,
    lora_module_shapes,
    plan_lora_geometry,
    tier_pages,
)

GIB = 1024**3

LLAMA3_8B = ModelDimensions(
    hidden_size=4096, intermediate_size=14336, num_layers=32, num_attention_heads=32, num_kv_heads=8,
    vocab_size=128256,
)
# KV bytes per token: 2 (K, V) x 32 layers x 8 kv heads x 128 head dim x 2 bytes (fp16 KV) = 128 KiB.
LLAMA3_8B_KV_BYTES_PER_TOKEN = 2 * 32 * 8 * 128 * 2
H100_FREE_AFTER_WEIGHTS_BYTES = int(62 * GIB)  # 80 GB - 16 GB fp16 weights - runtime buffers (approx.)


def h100_llama3_8b_fleet(
    pods: int,
    *,
    rank: int = 8,
    host_bytes: int = 4 * GIB,  # examples/basemodel-llama3-8b-tensorrtllm.yaml: hostMemoryBytes 4Gi
    gpu_fraction: float = 0.05,
    max_batch_size: int = 64,
    max_queue_size: int = 256,
    model: StepTimeModel = H100_LLAMA3_8B,
) -> FleetSpec:
    """Llama-3-8B fp16 on one H100 per pod, LoRA on the seven attention/MLP modules (the example CR:
    optimalAdapterSize 16, maxAdapterSize 64, maxRank 64)."""
    shapes = lora_module_shapes(LLAMA3_8B, DEFAULT_TARGET_MODULES)
    geometry = plan_lora_geometry(
        shapes,
        LoraCacheConfig(optimal_adapter_size=16, max_adapter_size=64, max_lora_rank=64, dtype_bytes=2,
                        num_layers=LLAMA3_8B.num_layers),
    )
    device_bytes = int(gpu_fraction * H100_FREE_AFTER_WEIGHTS_BYTES)
    kv_tokens = int(0.9 * (H100_FREE_AFTER_WEIGHTS_BYTES - device_bytes) / LLAMA3_8B_KV_BYTES_PER_TOKEN)
    weights_bytes = rank * sum(s.row_dim for s in shapes) * LLAMA3_8B.num_layers * 2
    pod = PodSpec(
        host_pages=tier_pages(geometry, host_bytes),
        device_pages=tier_pages(geometry, device_bytes),
        page_bytes=geometry.page_bytes,
        max_batch_size=max_batch_size,
        max_num_tokens=8192,
        kv_capacity_tokens=kv_tokens,
        max_queue_size=max_queue_size,
    )
    return FleetSpec(
        pods=pods, pod=pod, model=model, adapter_pages=adapter_pages(geometry, rank),
        adapter_weights_bytes=weights_bytes,
    )


def with_pods(spec: FleetSpec, pods: int) -> FleetSpec:
    return dataclasses.replace(spec, pods=pods)


def pod_capacity_requests_per_s(
    spec: FleetSpec, mean_prompt_tokens: float, mean_output_tokens: float
) -> float:
    """Requests/s one pod sustains at a full batch of mean-sized requests (compute only).

    Fleet load = offered rate / (pods x this). Cold loads, link transfers and cache limits come on top,
    which is why policies differ well below 100 %.
    """
    batch = spec.pod.max_batch_size
    context = batch * (mean_prompt_tokens + mean_output_tokens / 2)
    prefill_per_step = batch * mean_prompt_tokens / mean_output_tokens
    step_s = spec.model.step_s(batch, int(context), int(prefill_per_step))
    return batch / step_s / mean_output_tokens


def rate_for_load(
    spec: FleetSpec, load: float, mean_prompt_tokens: float, mean_output_tokens: float
) -> float:
    return load * spec.pods * pod_capacity_requests_per_s(spec, mean_prompt_tokens, mean_output_tokens)
