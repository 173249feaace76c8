"""One GPU of a ``trtllm-serve`` pod (TensorRT-LLM's PyTorch backend): weights, LoRA tiers, KV cache.

Pure: :func:`plan_pytorch_capacity` maps (spec, GPU, dimensions) to a frozen :class:`PytorchCapacityPlan`.
Problems are returned (``verdict == "error"``), not raised, as in :mod:`trtfleet_engines.capacity`, whose
weight, runtime-reserve and KV-bytes-per-token estimates this planner calls unchanged.

LoRA on this backend is sized in adapters, not bytes. ``lora_config.max_loras`` (device tier) and
``max_cpu_loras`` (host tier) become the C++ ``PeftCacheManager``'s ``num_device_module_layer`` /
``num_host_module_layer`` = ``max_lora_rank x num_hidden_layers x (target modules + missing q/k/v) x
count`` (``tensorrt_llm/_torch/pyexecutor/_util.py``), and a tier of ``N`` module-layers has
``N x ceil(max1dModSize / pageWidth)`` slots of ``pageWidth`` elements (``peftCacheManager.cpp``
``getMaxNumSlots``). ``pageWidth`` and ``max1dModSize`` are the smallest and largest ``in + out`` of the
TP-local modules: :func:`trtfleet.loracache.spec_geometry`'s ``page_width`` and its largest row.

So the planner inverts that formula over the spec's byte budgets:

* ``max_cpu_loras`` = adapters whose slots fit ``lora.cache.hostMemoryBytes``;
* ``max_loras`` = adapters whose slots fit ``lora.cache.gpuMemoryFraction x free`` (free = GPU memory -
  weights - runtime reserve), at most ``max_cpu_loras`` (a task reaches the device through the host cache);
* the tiers those counts allocate are then laid out with the page geometry
  (:func:`trtfleet.loracache.tier_pages`, :func:`~trtfleet.loracache.adapter_pages`) to check that that many
  max-rank adapters really fit as packed pages; a shortfall is a problem;
* the KV cache takes ``kvCacheFreeGpuMemFraction x (free - LoRA device tier)``, in blocks of
  :data:`TOKENS_PER_BLOCK` tokens (``kv_cache_config.tokens_per_block`` default).
* with ``speculative``, the draft's weights come off ``free`` before that and every cached token also holds the
  draft model's K/V (:func:`trtfleet_engines.speculation.plan_speculation`); a full batch's draft tokens must
  fit beside ``maxSeqLen`` in the cache. Warnings (the draft's size unknown, ``maxNumTokens`` too small for a
  full batch of drafts) do not fail the plan.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Literal

from trtfleet.api.basemodel import BaseModelSpec, KvCacheDtype
from trtfleet.loracache import LoraGeometry, adapter_pages, cache_modules, spec_geometry, tier_pages
from trtfleet_engines.capacity import estimate_weights, kv_bytes_per_token, runtime_reserve_bytes
from trtfleet_engines.gpus import GIB, GpuSpec, lookup_gpu
from trtfleet_engines.modeldims import ResolvedDimensions, resolve_dimensions
from trtfleet_engines.speculation import SpeculationPlan, plan_speculation

TOKENS_PER_BLOCK = 32
"""``KvCacheConfig.tokens_per_block`` default (llm_args.py)."""
KV_CACHE_INT8_PROBLEM = (
    "quantization.kvCacheDtype int8 is not available on the PyTorch backend (kv_cache_config.dtype takes auto, "
    "fp8 or nvfp4): use fp8 or auto"
)

Verdict = Literal["ok", "error"]


@dataclass(frozen=True)
class LoraTierSlots:
    """One tier as the PyTorch backend allocates it for ``adapters`` max-rank adapters."""

    adapters: int
    module_layers: int
    slots: int
    bytes: int
    pages: int
    max_rank_adapters_fit: int


@dataclass(frozen=True)
class LoraSlotsPlan:
    max_lora_rank: int
    num_modules: int
    page_width: int
    slots_per_page: int
    slots_per_module_layer: int
    max_adapter_pages: int
    device: LoraTierSlots
    host: LoraTierSlots

    @property
    def max_loras(self) -> int:
        return self.device.adapters

    @property
    def max_cpu_loras(self) -> int:
        return self.host.adapters


@dataclass(frozen=True)
class PytorchCapacityPlan:
    gpu: str
    gpu_memory_bytes: int
    dimensions_source: str
    weights_bytes: int
    runtime_reserve_bytes: int
    free_bytes: int
    kv_bytes_per_token: int
    kv_cache_bytes: int
    kv_cache_blocks: int
    kv_cache_tokens: int
    lora: LoraSlotsPlan | None
    problems: tuple[str, ...]
    speculation: SpeculationPlan | None = None
    warnings: tuple[str, ...] = ()

    @property
    def verdict(self) -> Verdict:
        return "error" if self.problems else "ok"

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
            "weightsBytes": self.weights_bytes,
            "runtimeReserveBytes": self.runtime_reserve_bytes,
            "freeBytes": self.free_bytes,
            "kvBytesPerToken": self.kv_bytes_per_token,
            "kvCacheBytes": self.kv_cache_bytes,
            "kvCacheBlocks": self.kv_cache_blocks,
            "kvCacheTokens": self.kv_cache_tokens,
            "lora": None if lora is None else {
                "maxLoraRank": lora.max_lora_rank,
                "numModules": lora.num_modules,
                "pageWidth": lora.page_width,
                "slotsPerPage": lora.slots_per_page,
                "slotsPerModuleLayer": lora.slots_per_module_layer,
                "maxAdapterPages": lora.max_adapter_pages,
                "maxLoras": lora.max_loras,
                "maxCpuLoras": lora.max_cpu_loras,
                "device": _tier_json(lora.device),
                "host": _tier_json(lora.host),
            },
        }


def _tier_json(tier: LoraTierSlots) -> dict[str, int]:
    return {"adapters": tier.adapters, "moduleLayers": tier.module_layers, "slots": tier.slots,
            "bytes": tier.bytes, "pages": tier.pages, "maxRankAdaptersFit": tier.max_rank_adapters_fit}


def slots_per_module_layer(geometry: LoraGeometry) -> int:
    """``ceil(max1dModSize / pageWidth)``: slots one rank-1 row of the widest module takes upstream."""
    return math.ceil(max(shape.row_dim for shape in geometry.shapes) / geometry.page_width)


def lora_tier(
    geometry: LoraGeometry, adapters: int, max_lora_rank: int, num_hidden_layers: int, num_modules: int
) -> LoraTierSlots:
    """The tier upstream allocates for ``adapters`` (``max_loras`` or ``max_cpu_loras``), in slots and pages.

    ``num_modules`` counts the target modules plus the missing q/k/v ones, as ``_util.py`` does.
    """
    module_layers = adapters * max_lora_rank * num_hidden_layers * num_modules
    slots = module_layers * slots_per_module_layer(geometry)
    memory_bytes = slots * geometry.page_width * geometry.dtype_bytes
    pages = tier_pages(geometry, memory_bytes)
    max_pages = adapter_pages(geometry, geometry.max_adapter_rank)
    return LoraTierSlots(adapters, module_layers, slots, memory_bytes, pages, pages // max_pages)


def plan_lora_slots(
    spec: BaseModelSpec, resolved: ResolvedDimensions, device_budget_bytes: int, problems: list[str]
) -> LoraSlotsPlan:
    """``max_loras`` / ``max_cpu_loras`` from the byte budgets, and the tiers they allocate upstream."""
    geometry = spec_geometry(spec, resolved.dims)
    num_modules = len(cache_modules(spec))
    rank = spec.lora.max_rank
    layers = resolved.dims.num_layers  # upstream counts every layer of the model, whatever the PP stage
    adapter_bytes = lora_tier(geometry, 1, rank, layers, num_modules).bytes
    cpu_loras = spec.lora.cache.host_bytes // adapter_bytes
    loras = min(device_budget_bytes // adapter_bytes, cpu_loras)
    if cpu_loras < 1:
        problems.append(
            f"lora.cache.hostMemoryBytes {spec.lora.cache.host_bytes} is less than one rank-{rank} adapter's "
            f"{adapter_bytes} bytes (max_cpu_loras would be 0): raise lora.cache.hostMemoryBytes to at least "
            f"{adapter_bytes}, or lower lora.maxRank"
        )
    elif loras < 1:
        problems.append(
            f"the LoRA device budget ({device_budget_bytes} bytes, lora.cache.gpuMemoryFraction "
            f"{spec.lora.cache.gpu_memory_fraction}) is less than one rank-{rank} adapter's {adapter_bytes} "
            "bytes (max_loras would be 0): raise lora.cache.gpuMemoryFraction or lower lora.maxRank"
        )
    device = lora_tier(geometry, loras, rank, layers, num_modules)
    host = lora_tier(geometry, cpu_loras, rank, layers, num_modules)
    for name, tier in (("device", device), ("host", host)):
        if tier.max_rank_adapters_fit < tier.adapters:
            problems.append(
                f"the LoRA {name} tier for {tier.adapters} adapters packs only {tier.max_rank_adapters_fit} "
                f"rank-{geometry.max_adapter_rank} adapters into {tier.pages} pages: lower "
                "lora.cache.optimalAdapterSize or lora.cache.maxAdapterSize"
            )
    return LoraSlotsPlan(
        max_lora_rank=rank, num_modules=num_modules, page_width=geometry.page_width,
        slots_per_page=geometry.slots_per_page, slots_per_module_layer=slots_per_module_layer(geometry),
        max_adapter_pages=adapter_pages(geometry, geometry.max_adapter_rank), device=device, host=host,
    )


def _gib(value: int) -> str:
    return f"{value / GIB:.2f} GiB"


def plan_pytorch_capacity(
    spec: BaseModelSpec, gpu: GpuSpec | None = None, dims: ResolvedDimensions | None = None
) -> PytorchCapacityPlan:
    """How one GPU of ``gpu`` (default ``spec.engine.gpu.product``) holds ``spec`` on the PyTorch backend."""
    gpu = gpu or lookup_gpu(spec.engine.gpu.product)
    resolved = dims or resolve_dimensions(spec)
    problems: list[str] = []
    if spec.quantization.kv_cache_dtype is KvCacheDtype.INT8:
        problems.append(KV_CACHE_INT8_PROBLEM)
    if spec.quantization.kv_cache_dtype is KvCacheDtype.FP8 and not gpu.fp8:
        problems.append(f"quantization.kvCacheDtype fp8 needs a GPU with fp8 (sm_89 or newer) but {gpu.product} "
                        f"is {gpu.sm}: use kvCacheDtype auto")
    gpus = spec.parallelism.tensor * spec.parallelism.pipeline
    speculation = plan_speculation(spec, resolved)
    draft_bytes = speculation.draft_weights_bytes if speculation else 0
    weights_per_gpu = math.ceil(estimate_weights(spec, resolved).bytes_total / gpus)
    reserve = runtime_reserve_bytes(spec, resolved)
    free = gpu.memory_bytes - weights_per_gpu - draft_bytes - reserve
    if free <= 0:
        problems.append(
            f"weights need {_gib(weights_per_gpu + draft_bytes)} per GPU"
            + (f" (the draft {_gib(draft_bytes)})" if draft_bytes else "")
            + f" and the runtime reserve {_gib(reserve)}, more than the "
            f"{_gib(gpu.memory_bytes)} of a {gpu.product}: raise parallelism.tensor, use a quantized checkpoint "
            "(quantization.mode fp8 or int4_awq), lower engine.maxNumTokens, or pick a larger GPU"
        )
    free = max(free, 0)
    lora: LoraSlotsPlan | None = None
    lora_device_bytes = 0
    if spec.lora.enabled:
        budget = int(spec.lora.cache.gpu_memory_fraction * free)
        lora = plan_lora_slots(spec, resolved, budget, problems)
        lora_device_bytes = lora.device.bytes
    per_token = kv_bytes_per_token(spec, resolved) + (speculation.draft_kv_bytes_per_token if speculation else 0)
    kv_bytes = int(spec.serving.kv_cache_free_gpu_mem_fraction * (free - lora_device_bytes))
    blocks = kv_bytes // (per_token * TOKENS_PER_BLOCK)
    tokens = blocks * TOKENS_PER_BLOCK
    draft_tokens = speculation.max_draft_len if speculation else 0
    if free > 0 and tokens < spec.engine.max_seq_len + draft_tokens:
        needed = f"engine.maxSeqLen {spec.engine.max_seq_len}" + (
            f" plus {draft_tokens} draft tokens" if draft_tokens else "")
        problems.append(
            f"the KV cache holds {tokens} tokens but one request may need {needed}: lower engine.maxSeqLen, "
            "raise serving.kvCacheFreeGpuMemFraction, use quantization.kvCacheDtype fp8, or raise parallelism.tensor"
        )
    return PytorchCapacityPlan(
        gpu=gpu.product, gpu_memory_bytes=gpu.memory_bytes, dimensions_source=resolved.source,
        weights_bytes=weights_per_gpu, runtime_reserve_bytes=reserve, free_bytes=free,
        kv_bytes_per_token=per_token, kv_cache_bytes=kv_bytes, kv_cache_blocks=blocks, kv_cache_tokens=tokens,
        lora=lora, problems=tuple(problems), speculation=speculation,
        warnings=speculation.warnings if speculation else (),
    )
