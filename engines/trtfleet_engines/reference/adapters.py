"""The reference engine's LoRA cache: TRT-LLM's contract on top of :class:`trtfleet.loracache.LoraPageCache`.

The page geometry comes from :func:`~trtfleet.loracache.plan_lora_geometry` over the model's dimensions
and the engine's target modules, exactly as the capacity planner and the router's shadow caches compute
it. Tier sizes: the host tier from ``lora_cache_host_memory_bytes``; the device tier from
``lora_cache_gpu_memory_fraction`` x a pretend GPU memory (``reference_gpu_memory_bytes``), or from
``reference_lora_cache_device_bytes`` when given. An adapter takes ``pages_for_rows`` pages over its
``lora_config`` rows.

Per request (:meth:`AdapterStore.admit`, called when the executor fetches the request):

* LoRA tensors are validated the way ``loraValidateRequestTensors`` does, with its texts;
* weights for an id that is not cached are parsed and stored, evicting least-recently-used idle adapters;
  weights for a cached id are ignored (not even parsed); nothing evictable -> ``Cache is full...``;
* the adapter is pinned until :meth:`AdapterStore.release`; an id alone on a miss fails with
  ``LoRA task <id> not found in cache. Please send LoRA weights with request``.

Every failure is raised as :class:`~trtfleet_engines.reference.errors.ExecutorRequestFailed`, which wraps the
text the way the Triton TRT-LLM backend does.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from numpy.typing import NDArray

from trtfleet.api.basemodel import LoraModule, ModelDimensions
from trtfleet.loracache import (
    LoraCacheConfig,
    LoraCacheError,
    LoraGeometry,
    LoraModuleShape,
    LoraPageCache,
    lora_module_shapes,
    pages_for_rows,
    plan_lora_geometry,
    tier_pages,
)
from trtfleet_engines.reference.errors import (
    LORA_BOTH_TENSORS_TEXT,
    LORA_DTYPE_TEXT,
    LORA_MODULE_TEXT,
    LORA_RANK_TEXT,
    LORA_TASK_ID_REQUIRED_TEXT,
    ExecutorRequestFailed,
)
from trtfleet_engines.reference.scheduler import LoraInputs

logger = logging.getLogger(__name__)

# TRT-LLM's LoraModule::toModuleName, for the error texts about modules an engine does not enable.
_MODULE_NAMES = {
    0: "attn_qkv",
    1: "attn_q",
    2: "attn_k",
    3: "attn_v",
    4: "attn_dense",
    5: "mlp_h_to_4h",
    6: "mlp_4h_to_h",
    7: "mlp_gate",
    8: "cross_attn_qkv",
    9: "cross_attn_q",
    10: "cross_attn_k",
    11: "cross_attn_v",
    12: "cross_attn_dense",
    13: "moe_h_to_4h",
    14: "moe_4h_to_h",
    15: "moe_gate",
    16: "moe_router",
    17: "mlp_router",
    18: "mlp_gate_up",
}


@dataclass(frozen=True)
class LoraCacheSettings:
    """The engine's LoRA build options and its ``lora_cache_*`` parameters, resolved to bytes."""

    target_modules: tuple[LoraModule, ...]
    max_lora_rank: int
    optimal_adapter_size: int
    max_adapter_size: int
    host_bytes: int
    device_bytes: int
    dtype: str = "float16"

    @property
    def dtype_bytes(self) -> int:
        return 2


@dataclass(frozen=True)
class LoraCachePlan:
    """Geometry and tier sizes of one engine's cache."""

    geometry: LoraGeometry
    host_pages: int
    device_pages: int


def plan_cache(dims: ModelDimensions, settings: LoraCacheSettings) -> LoraCachePlan:
    """Page geometry and tier sizes (pages) for a model and its cache settings."""
    shapes = lora_module_shapes(dims, settings.target_modules)
    geometry = plan_lora_geometry(
        shapes,
        LoraCacheConfig(
            optimal_adapter_size=settings.optimal_adapter_size,
            max_adapter_size=settings.max_adapter_size,
            max_lora_rank=settings.max_lora_rank,
            dtype_bytes=settings.dtype_bytes,
            num_layers=dims.num_layers,
        ),
    )
    return LoraCachePlan(
        geometry, tier_pages(geometry, settings.host_bytes), tier_pages(geometry, settings.device_bytes)
    )


def engine_weight_dtype_matches(weights: NDArray[Any], dtype: str) -> bool:
    """Whether ``lora_weights`` carry the engine dtype (bf16 arrives as raw 2-byte values)."""
    if dtype == "float16":
        return weights.dtype == np.float16
    return weights.dtype == np.uint16 or (weights.dtype.kind == "V" and weights.dtype.itemsize == 2)


AdapterParser = Callable[[NDArray[Any], NDArray[Any]], Any]
"""Turns validated ``(lora_weights, lora_config)`` into the model's adapter object (raises ValueError)."""


class AdapterStore:
    """Adapter weights by task id, with residency and pinning decided by a :class:`LoraPageCache`."""

    def __init__(self, dims: ModelDimensions, settings: LoraCacheSettings, parse: AdapterParser) -> None:
        self.dims = dims
        self.settings = settings
        self.plan = plan_cache(dims, settings)
        self.cache = LoraPageCache(self.plan.host_pages, self.plan.device_pages)
        self._parse = parse
        self._shapes: dict[int, LoraModuleShape] = {s.module_id: s for s in self.plan.geometry.shapes}
        self._weights: dict[int, Any] = {}
        self._copied_bytes = 0
        logger.info(
            "LoRA cache: page_width=%d slots_per_page=%d host_pages=%d device_pages=%d",
            self.plan.geometry.page_width,
            self.plan.geometry.slots_per_page,
            self.plan.host_pages,
            self.plan.device_pages,
        )

    # -- validation (TRT-LLM's loraValidateRequestTensors) ------------------------------------
    def validation_error(self, lora: LoraInputs) -> str | None:
        """TRT-LLM's text for what is wrong with the request's LoRA tensors, or None."""
        if lora.task_id is None:
            return LORA_TASK_ID_REQUIRED_TEXT
        if lora.weights is None and lora.config is None:
            return None
        if lora.weights is None or lora.config is None:
            return LORA_BOTH_TENSORS_TEXT
        weights, config = lora.weights, lora.config
        if weights.ndim != 3:
            return "Invalid shape for lora_weights tensor"
        if config.ndim != 3:
            return "Invalid shape for lora_keys tensor"
        if weights.shape[0] != 1 or config.shape[0] != 1:
            return "Expected batch dimension to be 1 for each lora request"
        if config.dtype != np.int32:
            return f"Expected  lora keys to have TYPE_INT32 but was {config.dtype}"
        if config.shape[1] != weights.shape[1]:
            return "Expected dim1 lora_weights and lora_keys to have the same size"
        if config.shape[2] != 3:
            return "Expected dim2 of lora_keys to have a size of 3"
        if not engine_weight_dtype_matches(weights, self.settings.dtype):
            return LORA_DTYPE_TEXT
        width = weights.shape[2]
        for module_id, layer, rank in config[0].tolist():
            if not 0 <= layer < self.dims.num_layers:
                return "Expected layerId to be in the range [0, numModelLayers)"
            if rank <= 0:
                return "Expected adapterSize to be > 0"
            shape = self._shapes.get(module_id)
            name = _MODULE_NAMES.get(module_id, str(module_id))
            if shape is None:
                return LORA_MODULE_TEXT.format(name=name)
            if rank * shape.row_dim > width:
                return f"lora_weights has to few values for {name}"
            if rank > self.settings.max_lora_rank:
                return LORA_RANK_TEXT.format(rank=rank, max_rank=self.settings.max_lora_rank)
        return None

    def pages_of(self, config: NDArray[Any]) -> int:
        """Cache pages an adapter with ``lora_config`` [1, N, 3] rows takes."""
        rows = [(self._shapes[module_id], rank) for module_id, _layer, rank in config[0].tolist()]
        return pages_for_rows(self.plan.geometry, rows)

    # -- the scheduler's AdapterCache protocol ----------------------------------------------
    def admit(self, request_id: int, lora: LoraInputs) -> Any:
        error = self.validation_error(lora)
        if error is not None:
            raise ExecutorRequestFailed(request_id, error)
        assert lora.task_id is not None
        task_id = lora.task_id
        try:
            if lora.weights is not None and lora.config is not None and task_id not in self.cache:
                self._store(task_id, lora.weights, lora.config)
            self.cache.acquire(task_id)
        except LoraCacheError as exc:
            raise ExecutorRequestFailed(request_id, str(exc)) from exc
        except ValueError as exc:
            raise ExecutorRequestFailed(request_id, str(exc)) from exc
        return self._weights[task_id]

    def _store(self, task_id: int, weights: NDArray[Any], config: NDArray[Any]) -> None:
        pages = self.pages_of(config)
        if pages > self.plan.device_pages:
            raise ValueError(
                f"LoRA task {task_id} needs {pages} cache pages but the device cache has only "
                f"{self.plan.device_pages}: raise the device cache size or lower the adapter rank"
            )
        adapter = self._parse(weights, config)
        evicted = self.cache.put(task_id, pages)
        for victim in evicted:
            self._weights.pop(victim, None)
            logger.info("LoRA task %s evicted from the host cache", victim)
        self._weights[task_id] = adapter
        logger.info("LoRA task %s stored (%d pages)", task_id, pages)

    def ensure_device(self, task_id: int) -> bool:
        copy = not self.cache.on_device(task_id)
        placed = self.cache.ensure_device(task_id)
        if copy and placed:
            self._copied_bytes += self.cache.host.pages_of(task_id) * self.plan.geometry.page_bytes
        return placed

    @property
    def copied_bytes_total(self) -> int:
        """Bytes copied host -> device so far: the adapter's whole pages each time it was not on the device."""
        return self._copied_bytes

    def release(self, task_id: int) -> None:
        self.cache.release(task_id)

    def resident(self) -> Sequence[int]:
        """Cached task ids, idle ones least recently used first."""
        return self.cache.resident()
