"""How many LoRA cache pages an adapter takes on a base model's pods (the engine's page geometry, from the spec)."""

from __future__ import annotations

import math
from collections.abc import Iterable

from trtfleet.api.basemodel import BaseModelSpec
from trtfleet.loracache import LoraCacheConfig, LoraGeometry, adapter_pages, lora_module_shapes, plan_lora_geometry


def lora_geometry(spec: BaseModelSpec) -> LoraGeometry | None:
    """The engine's LoRA page geometry, when the spec has model dimensions."""
    if spec.dimensions is None or not spec.lora.enabled:
        return None
    shapes = lora_module_shapes(spec.dimensions, spec.lora.target_modules, tp=spec.parallelism.tensor)
    config = LoraCacheConfig(
        optimal_adapter_size=spec.lora.cache.optimal_adapter_size,
        max_adapter_size=spec.lora.cache.max_adapter_size,
        max_lora_rank=spec.lora.max_rank,
        dtype_bytes=2,
        num_layers=spec.dimensions.num_layers,
    )
    return plan_lora_geometry(shapes, config)


def pages_for_adapter(
    geometry: LoraGeometry | None, rank: int | None, modules: Iterable[str] | None, weights_bytes: int
) -> int:
    """Cache pages an adapter takes: exact from the geometry and its rank, else one page per
    ``page_bytes`` of weights, at least one."""
    if geometry is not None and rank is not None:
        try:
            return max(1, adapter_pages(geometry, rank, modules))
        except ValueError:
            return max(1, math.ceil(weights_bytes / geometry.page_bytes))
    if geometry is not None and weights_bytes:
        return max(1, math.ceil(weights_bytes / geometry.page_bytes))
    return 1
