"""Will this engine fit? Weights, runtime reserve, LoRA cache tiers and KV cache, per GPU.

Pure: :func:`plan_capacity` maps (spec, GPU, dimensions) to a frozen :class:`CapacityPlan`. Problems are
returned, not raised: ``verdict == "error"`` and ``problems`` hold one message per number that does not
fit, naming the field to change. Only an unknown GPU product or unknown dimensions raise (``SpecError``).

The model, per GPU (TP rank x PP stage), in bytes:

* weights = (linear params x bytes per quantized param + scales + embedding, lm_head and norms in the
  engine dtype) / (TP x PP). Bytes per linear param: fp16/bf16 2, int8 weight-only 1, fp8 1, int4 and
  int4_awq 0.5. Scales: weight-only int8/int4 keep one fp16 scale per output channel; int4_awq one fp16
  scale per :data:`AWQ_GROUP_SIZE` weights plus an fp16 pre-quant scale per input channel; fp8 scales are
  per tensor (counted as zero). Embeddings and lm_head are never quantized (TRT-LLM's defaults).
* runtime reserve = :data:`RUNTIME_RESERVE_BYTES` (CUDA context, cuBLAS/TRT workspaces, NCCL) + activations
  (``max_num_tokens x (ACTIVATION_HIDDEN_FACTOR x hidden + ACTIVATION_INTERMEDIATE_FACTOR x intermediate/TP)``
  elements of the engine dtype) + fp32 logits for ``max_batch_size`` sequences (vocab / TP).
* free = memory - weights - runtime reserve; the LoRA device tier takes ``gpuMemoryFraction x free`` rounded
  up to whole pages (TRT-LLM allocates pages); the KV cache takes
  ``kvCacheFreeGpuMemFraction x (free - LoRA device tier)``, in whole blocks of
  :data:`TOKENS_PER_BLOCK` tokens. KV bytes per token = 2 x layers per PP stage x KV heads per TP rank x
  head dim x KV dtype bytes.
* LoRA tiers use TRT-LLM's page geometry from :mod:`trtfleet.loracache` (layers of one PP stage,
  TP-local module dims) and report how many max-rank and optimal-rank adapters each tier holds. Each tier
  must have ``ceil(max adapter elements / page width)`` slots or TRT-LLM stops at start (a problem here).

With ``speculative`` the draft's weights come off ``free``, every cached token also holds the draft model's K/V,
and ``status.capacity`` says so (:func:`trtfleet_engines.speculation.plan_speculation`).

The ``cpu`` product (``runtime: reference``) is planned the same way against its simulated device budget
(:data:`trtfleet_engines.gpus.CPU_DEVICE_BUDGET_BYTES`); its host tier is real host memory.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Literal

from trtfleet.api.basemodel import BaseModelSpec, KvCacheDtype, QuantizationMode
from trtfleet.loracache import (
    LoraGeometry,
    adapter_pages,
    min_tier_bytes,
    min_tier_slots,
    spec_geometry,
    tier_pages,
    tier_slots,
)
from trtfleet_engines.gpus import GIB, GpuSpec, lookup_gpu
from trtfleet_engines.modeldims import ResolvedDimensions, resolve_dimensions
from trtfleet_engines.speculation import SpeculationPlan, plan_speculation

RUNTIME_RESERVE_BYTES = 1 * GIB
"""Fixed per-GPU reserve for the CUDA context, cuBLAS/TensorRT workspaces and NCCL buffers (an estimate)."""
ACTIVATION_HIDDEN_FACTOR = 4
"""Hidden-sized activation buffers live at once per token (residual, norm output, attention in/out)."""
ACTIVATION_INTERMEDIATE_FACTOR = 3
"""Intermediate-sized buffers live at once per token in a gated MLP (gate, up, product)."""
LOGITS_BYTES = 4
"""Generation logits are fp32 (trtllm-build's default logits dtype)."""
TOKENS_PER_BLOCK = 32
"""KV-cache tokens per block (TRT-LLM 1.x default)."""
AWQ_GROUP_SIZE = 128
"""Weights per fp16 scale in int4_awq (TRT-LLM's default AWQ block size)."""
DTYPE_BYTES = 2
"""float16 and bfloat16 alike."""

_LINEAR_BYTES_PER_PARAM = {
    QuantizationMode.NONE: 2.0,
    QuantizationMode.INT8_WEIGHT_ONLY: 1.0,
    QuantizationMode.INT4_WEIGHT_ONLY: 0.5,
    QuantizationMode.INT4_AWQ: 0.5,
    QuantizationMode.FP8: 1.0,
}
_KV_BYTES = {KvCacheDtype.AUTO: DTYPE_BYTES, KvCacheDtype.INT8: 1, KvCacheDtype.FP8: 1}

Verdict = Literal["ok", "error"]


@dataclass(frozen=True)
class LoraTierPlan:
    """One LoRA cache tier: its bytes, slots, pages, and how many adapters of max and optimal rank it holds.

    ``allocated_bytes`` is what TRT-LLM really allocates: whole pages (``ceil(slots / slots per page)``),
    up to one page more than ``bytes``.
    """

    bytes: int
    slots: int
    pages: int
    allocated_bytes: int
    max_rank_adapters: int
    optimal_rank_adapters: int


@dataclass(frozen=True)
class LoraCapacity:
    page_width: int
    slots_per_page: int
    max_adapter_elements: int
    max_adapter_rank: int
    optimal_adapter_rank: int
    max_adapter_pages: int
    optimal_adapter_pages: int
    host: LoraTierPlan
    device: LoraTierPlan


@dataclass(frozen=True)
class CapacityPlan:
    gpu: str
    gpu_memory_bytes: int
    dimensions_source: str
    params: int
    weights_bytes: int
    runtime_reserve_bytes: int
    free_bytes: int
    kv_bytes_per_token: int
    kv_cache_bytes: int
    kv_cache_blocks: int
    kv_cache_tokens: int
    lora: LoraCapacity | None
    problems: tuple[str, ...]
    speculation: SpeculationPlan | None = None
    warnings: tuple[str, ...] = ()

    @property
    def verdict(self) -> Verdict:
        return "error" if self.problems else "ok"

    def to_status(self) -> dict[str, int | float | None]:
        """The BaseModel ``status.capacity`` object (camelCase keys; LoRA keys None when LoRA is off)."""
        lora = self.lora
        return speculation_status(self.speculation) | {
            "weightsBytes": self.weights_bytes,
            "kvCacheTokens": self.kv_cache_tokens,
            "kvBytesPerToken": self.kv_bytes_per_token,
            "memoryBandwidthBytesPerSecond": lookup_gpu(self.gpu).memory_bandwidth_bytes_per_s,
            "loraHostAdapters": lora.host.max_rank_adapters if lora else None,
            "loraDeviceAdapters": lora.device.max_rank_adapters if lora else None,
            "loraPageWidth": lora.page_width if lora else None,
            "loraSlotsPerPage": lora.slots_per_page if lora else None,
            "loraHostPages": lora.host.pages if lora else None,
            "loraDevicePages": lora.device.pages if lora else None,
        }

    def to_json_dict(self) -> dict[str, Any]:
        lora = self.lora
        extra: dict[str, Any] = {} if self.speculation is None else {
            "warnings": list(self.warnings), "speculation": self.speculation.to_json_dict()}
        return extra | {
            "verdict": self.verdict,
            "problems": list(self.problems),
            "gpu": self.gpu,
            "gpuMemoryBytes": self.gpu_memory_bytes,
            "dimensionsSource": self.dimensions_source,
            "params": self.params,
            "weightsBytes": self.weights_bytes,
            "runtimeReserveBytes": self.runtime_reserve_bytes,
            "freeBytes": self.free_bytes,
            "kvBytesPerToken": self.kv_bytes_per_token,
            "kvCacheBytes": self.kv_cache_bytes,
            "kvCacheBlocks": self.kv_cache_blocks,
            "kvCacheTokens": self.kv_cache_tokens,
            "lora": None if lora is None else {
                "pageWidth": lora.page_width,
                "slotsPerPage": lora.slots_per_page,
                "maxAdapterElements": lora.max_adapter_elements,
                "maxAdapterRank": lora.max_adapter_rank,
                "optimalAdapterRank": lora.optimal_adapter_rank,
                "maxAdapterPages": lora.max_adapter_pages,
                "optimalAdapterPages": lora.optimal_adapter_pages,
                "host": _tier_json(lora.host),
                "device": _tier_json(lora.device),
            },
            "status": self.to_status(),
        }


def speculation_status(plan: SpeculationPlan | None) -> dict[str, int | None]:
    """The ``status.capacity`` keys of speculative decoding (none without it, so other statuses stay as they
    were)."""
    if plan is None:
        return {}
    return {"draftWeightsBytes": plan.draft_weights_bytes, "draftKvCacheTokens": plan.draft_kv_cache_tokens,
            "decodeRequestsPerStep": plan.decode_requests_per_step}


def _tier_json(tier: LoraTierPlan) -> dict[str, int]:
    return {"bytes": tier.bytes, "slots": tier.slots, "pages": tier.pages, "allocatedBytes": tier.allocated_bytes,
            "maxRankAdapters": tier.max_rank_adapters, "optimalRankAdapters": tier.optimal_rank_adapters}


@dataclass(frozen=True)
class WeightsEstimate:
    params: int
    bytes_total: int


def estimate_weights(spec: BaseModelSpec, resolved: ResolvedDimensions) -> WeightsEstimate:
    """Parameter count and total weight bytes over all GPUs (see the module docstring)."""
    d = resolved.dims
    head = d.head_size
    q_out, kv_out = d.num_attention_heads * head, d.num_kv_heads * head
    # (in, out) of every linear layer of one decoder layer; a mixture of experts repeats the MLP.
    hidden = d.hidden_size
    linears = [(hidden, q_out), (hidden, kv_out), (hidden, kv_out), (q_out, hidden)]
    mlp = [(d.hidden_size, d.intermediate_size)] * 2 + [(d.intermediate_size, d.hidden_size)]
    linears += mlp * resolved.num_experts
    router = d.hidden_size * resolved.num_experts if resolved.num_experts > 1 else 0
    linear_params = sum(i * o for i, o in linears) * d.num_layers
    embeddings = d.vocab_size * d.hidden_size * (1 if resolved.tied_embeddings else 2)
    norms = (2 * d.num_layers + 1) * d.hidden_size
    dense_params = embeddings + norms + router * d.num_layers
    mode = spec.quantization.mode
    scales = 0
    if mode in (QuantizationMode.INT8_WEIGHT_ONLY, QuantizationMode.INT4_WEIGHT_ONLY):
        scales = sum(o for _, o in linears) * d.num_layers * DTYPE_BYTES
    elif mode == QuantizationMode.INT4_AWQ:
        scales = (linear_params // AWQ_GROUP_SIZE + sum(i for i, _ in linears) * d.num_layers) * DTYPE_BYTES
    total = math.ceil(linear_params * _LINEAR_BYTES_PER_PARAM[mode]) + scales + dense_params * DTYPE_BYTES
    return WeightsEstimate(params=linear_params + dense_params, bytes_total=total)


def runtime_reserve_bytes(spec: BaseModelSpec, resolved: ResolvedDimensions) -> int:
    d, tp = resolved.dims, spec.parallelism.tensor
    per_token = (
        ACTIVATION_HIDDEN_FACTOR * d.hidden_size + ACTIVATION_INTERMEDIATE_FACTOR * d.intermediate_size // tp
    )
    activations = spec.engine.max_num_tokens * per_token * DTYPE_BYTES
    logits = spec.engine.max_batch_size * math.ceil(d.vocab_size / tp) * LOGITS_BYTES
    return RUNTIME_RESERVE_BYTES + activations + logits


def kv_bytes_per_token(spec: BaseModelSpec, resolved: ResolvedDimensions) -> int:
    d = resolved.dims
    layers = math.ceil(d.num_layers / spec.parallelism.pipeline)
    kv_heads = math.ceil(d.num_kv_heads / spec.parallelism.tensor)
    return 2 * layers * kv_heads * d.head_size * _KV_BYTES[spec.quantization.kv_cache_dtype]


def _tier(geometry: LoraGeometry, memory_bytes: int, max_pages: int, optimal_pages: int) -> LoraTierPlan:
    pages = tier_pages(geometry, memory_bytes)
    return LoraTierPlan(memory_bytes, tier_slots(geometry, memory_bytes), pages, pages * geometry.page_bytes,
                        pages // max_pages, pages // optimal_pages)


def _gib(value: int) -> str:
    return f"{value / GIB:.2f} GiB"


def plan_capacity(
    spec: BaseModelSpec, gpu: GpuSpec | None = None, dims: ResolvedDimensions | None = None
) -> CapacityPlan:
    """How ``spec``'s engine uses one GPU of ``gpu`` (default: ``spec.engine.gpu.product``)."""
    gpu = gpu or lookup_gpu(spec.engine.gpu.product)
    resolved = dims or resolve_dimensions(spec)
    problems: list[str] = []
    quant = spec.quantization
    for what, needs in (("quantization.mode fp8", quant.mode == QuantizationMode.FP8),
                        ("quantization.kvCacheDtype fp8", quant.kv_cache_dtype == KvCacheDtype.FP8)):
        if needs and not gpu.fp8:
            problems.append(f"{what} needs a GPU with fp8 (sm_89 or newer) but {gpu.product} is {gpu.sm}: "
                            "use int8_weight_only or int4_awq, or pick an L4, L40S, H100-80GB, H200 or B200")
    gpus = spec.parallelism.tensor * spec.parallelism.pipeline
    weights = estimate_weights(spec, resolved)
    speculation = plan_speculation(spec, resolved)
    draft_bytes = speculation.draft_weights_bytes if speculation else 0
    weights_per_gpu = math.ceil(weights.bytes_total / gpus)
    reserve = runtime_reserve_bytes(spec, resolved)
    free = gpu.memory_bytes - weights_per_gpu - draft_bytes - reserve
    if free <= 0:
        problems.append(
            f"weights need {_gib(weights_per_gpu)} per GPU and the runtime reserve {_gib(reserve)}, "
            f"more than the {_gib(gpu.memory_bytes)} of a {gpu.product}: raise parallelism.tensor, quantize "
            "(quantization.mode int8_weight_only, int4_awq or fp8), lower engine.maxNumTokens, "
            "or pick a larger GPU"
        )
    free = max(free, 0)
    lora: LoraCapacity | None = None
    lora_device_bytes = 0
    if spec.lora.enabled:
        lora = _plan_lora(spec, resolved, int(spec.lora.cache.gpu_memory_fraction * free), problems)
        # The PeftCacheManager allocates whole pages before the KV cache is sized (LoraCachePageManager).
        lora_device_bytes = lora.device.allocated_bytes
    per_token = kv_bytes_per_token(spec, resolved) + (speculation.draft_kv_bytes_per_token if speculation else 0)
    kv_bytes = int(spec.serving.kv_cache_free_gpu_mem_fraction * (free - lora_device_bytes))
    blocks = kv_bytes // (per_token * TOKENS_PER_BLOCK)
    tokens = blocks * TOKENS_PER_BLOCK
    if free > 0 and tokens < spec.engine.max_seq_len:
        problems.append(
            f"the KV cache holds {tokens} tokens but one request may need engine.maxSeqLen "
            f"{spec.engine.max_seq_len}: lower engine.maxSeqLen, raise serving.kvCacheFreeGpuMemFraction, "
            "use quantization.kvCacheDtype fp8 or int8, or raise parallelism.tensor"
        )
    return CapacityPlan(
        gpu=gpu.product, gpu_memory_bytes=gpu.memory_bytes, dimensions_source=resolved.source,
        params=weights.params, weights_bytes=weights_per_gpu, runtime_reserve_bytes=reserve, free_bytes=free,
        kv_bytes_per_token=per_token, kv_cache_bytes=kv_bytes, kv_cache_blocks=blocks, kv_cache_tokens=tokens,
        lora=lora, problems=tuple(problems), speculation=speculation,
        warnings=speculation.warnings if speculation else (),
    )


def _plan_lora(
    spec: BaseModelSpec, resolved: ResolvedDimensions, device_bytes: int, problems: list[str]
) -> LoraCapacity:
    geometry = spec_geometry(spec, resolved.dims)
    optimal_rank = min(spec.lora.cache.optimal_adapter_size, spec.lora.max_rank)
    max_pages = adapter_pages(geometry, geometry.max_adapter_rank)
    optimal_pages = adapter_pages(geometry, optimal_rank)
    host = _tier(geometry, spec.lora.cache.host_bytes, max_pages, optimal_pages)
    device = _tier(geometry, device_bytes, max_pages, optimal_pages)
    row_bytes = geometry.page_width * geometry.dtype_bytes
    # TRT-LLM refuses to start unless each tier has ceil(max adapter elements / page width) slots; past
    # that, the adapter's rows must also pack into the tier's whole pages. A tier of B bytes has
    # ceil(floor(B / row bytes) / slots per page) pages: one slot into the last page is enough for it to count.
    need = max(min_tier_bytes(geometry), ((max_pages - 1) * geometry.slots_per_page + 1) * row_bytes)
    rank = geometry.max_adapter_rank
    if host.slots < min_tier_slots(geometry) or host.max_rank_adapters < 1:
        problems.append(
            f"lora.cache.hostMemoryBytes {spec.lora.cache.host_bytes} gives {host.slots} LoRA cache slots "
            f"({host.pages} pages) but one rank-{rank} adapter needs {min_tier_slots(geometry)} slots in "
            f"{max_pages} pages, else TRT-LLM stops at start ('Not enough space allocated to host LoRA cache "
            f"to hold 1 max sized LoRA'): raise lora.cache.hostMemoryBytes to at least {need}, or lower "
            "lora.cache.maxAdapterSize or lora.maxRank"
        )
    if device_bytes > 0 and (device.slots < min_tier_slots(geometry) or device.max_rank_adapters < 1):
        problems.append(
            f"the LoRA device tier ({_gib(device_bytes)}, lora.cache.gpuMemoryFraction "
            f"{spec.lora.cache.gpu_memory_fraction}) gives {device.slots} slots ({device.pages} pages) but one "
            f"rank-{rank} adapter needs {min_tier_slots(geometry)} slots in {max_pages} pages ({need} bytes), "
            "else TRT-LLM stops at start ('Not enough space allocated to device LoRA cache to hold 1 max sized "
            "LoRA'): raise lora.cache.gpuMemoryFraction or lower lora.cache.maxAdapterSize"
        )
    return LoraCapacity(
        page_width=geometry.page_width, slots_per_page=geometry.slots_per_page,
        max_adapter_elements=geometry.max_adapter_elements, max_adapter_rank=rank,
        optimal_adapter_rank=optimal_rank, max_adapter_pages=max_pages, optimal_adapter_pages=optimal_pages,
        host=host, device=device,
    )
