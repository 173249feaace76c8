"""LoRA cache page math against hand-computed TRT-LLM cases (issue 20, items 7-9).

Upstream: ``PeftCacheManager::getPageManagerConfig`` (cpp/tensorrt_llm/batch_manager/peftCacheManager.cpp@9df6d722)
and ``LoraModule::createLoraModules`` (cpp/tensorrt_llm/runtime/loraModule.cpp@2a9abd95). Every number below is
worked out by hand in the comments, not taken from trtfleet.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pytest
from trtfleet_engines.capacity import plan_capacity
from trtfleet_engines.modeldims import resolve_dimensions

from trtfleet.api.basemodel import BaseModelSpec
from trtfleet.loracache import declared_geometry, min_tier_bytes, min_tier_slots, spec_geometry

MakeSpec = Callable[..., BaseModelSpec]
SEVEN_MODULES = ["attn_q", "attn_k", "attn_v", "attn_dense", "mlp_h_to_4h", "mlp_gate", "mlp_4h_to_h"]
QWEN15_7B = {"hiddenSize": 4096, "intermediateSize": 11008, "numLayers": 32, "numAttentionHeads": 32,
             "numKvHeads": 32, "vocabSize": 151936}
GEMMA_7B = {"hiddenSize": 3072, "intermediateSize": 24576, "numLayers": 28, "numAttentionHeads": 16,
            "numKvHeads": 16, "headDim": 256, "vocabSize": 256000}


def lora_spec(make_spec: MakeSpec, dims: dict[str, Any], host_bytes: int, architecture: str) -> BaseModelSpec:
    return make_spec({
        "source": {"uri": "hf://example/model"},
        "architecture": architecture,
        "dimensions": dims,
        "lora": {"maxRank": 8, "targetModules": SEVEN_MODULES,
                 "cache": {"hostMemoryBytes": host_bytes, "optimalAdapterSize": 8, "maxAdapterSize": 64}},
    })


@dataclass(frozen=True)
class Geometry:
    name: str
    dims: dict[str, Any]
    architecture: str
    page_width: int
    slots_per_page: int
    max_adapter_elements: int
    min_slots: int
    min_host_bytes: int


CASES = [
    # Qwen1.5-7B, rank 8 (maxAdapterSize 64 clamped to max_lora_rank 8). in+out per module: q/k/v/dense
    # 4096+4096 = 8192, h_to_4h/gate/4h_to_h 4096+11008 = 15104. pageWidth = 8192.
    # slots/page = max(8 x (4 x 1 + 3 x 2) x 32, ceil(8 x 15104 / 8192)) = max(2560, 15) = 2560.
    # maxLoraSize = 8 x (4 x 8192 + 3 x 15104) x 32 = 8 x 78080 x 32 = 19,988,480.
    # minTotalSlots = ceil(19,988,480 / 8192) = 2440 -> 2440 x 8192 x 2 bytes = 39,976,960.
    Geometry("qwen1.5-7b", QWEN15_7B, "qwen2", 8192, 2560, 19_988_480, 2440, 39_976_960),
    # gemma-7b, rank 8: q/k/v 3072 + 16 x 256 = 7168; attn_dense hidden x hidden = 3072 + 3072 = 6144
    # (loraModule.cpp; heads x head_dim would give 4096 + 3072 = 7168); MLP 3072 + 24576 = 27648.
    # pageWidth = 6144. slots/page = max(8 x (3 x 2 + 1 + 3 x 5) x 28, ceil(8 x 27648 / 6144)) = 4928.
    # maxLoraSize = 8 x (3 x 7168 + 6144 + 3 x 27648) x 28 = 8 x 110592 x 28 = 24,772,608.
    # minTotalSlots = ceil(24,772,608 / 6144) = 4032 -> 4032 x 6144 x 2 = 49,545,216 bytes.
    Geometry("gemma-7b", GEMMA_7B, "gemma", 6144, 4928, 24_772_608, 4032, 49_545_216),
]


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_page_geometry_matches_hand_computed_upstream(make_spec: MakeSpec, case: Geometry) -> None:
    spec = lora_spec(make_spec, case.dims, 1 << 30, case.architecture)
    geometry = spec_geometry(spec, resolve_dimensions(spec).dims)
    assert geometry.page_width == case.page_width
    assert geometry.slots_per_page == case.slots_per_page
    assert geometry.max_adapter_elements == case.max_adapter_elements
    assert min_tier_slots(geometry) == case.min_slots
    assert min_tier_bytes(geometry) == case.min_host_bytes


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
@pytest.mark.parametrize(
    ("host_bytes", "fits"),
    [
        pytest.param(16_384, False, id="16KiB"),
        pytest.param(20_000_000, False, id="20MB"),
        pytest.param(-1, False, id="one-byte-short"),
        pytest.param(0, True, id="exact"),
    ],
)
def test_host_tier_minimum_is_upstreams(make_spec: MakeSpec, case: Geometry, host_bytes: int, fits: bool) -> None:
    """Below ceil(maxAdapterSize x sum(dims) x layers / pageWidth) slots TRT-LLM stops at start."""
    if host_bytes <= 0:
        host_bytes += case.min_host_bytes
    plan = plan_capacity(lora_spec(make_spec, case.dims, host_bytes, case.architecture))
    host_problems = [p for p in plan.problems if "hostMemoryBytes" in p]
    if fits:
        assert host_problems == []
    else:
        assert host_problems and "Not enough space allocated to host LoRA cache" in host_problems[0]
        assert f"at least {case.min_host_bytes}" in host_problems[0]


def test_device_tier_is_rounded_up_to_whole_pages_before_kv_sizing(make_spec: MakeSpec) -> None:
    spec = lora_spec(make_spec, QWEN15_7B, 1 << 30, "qwen2")
    plan = plan_capacity(spec)
    assert plan.lora is not None
    device, geometry = plan.lora.device, spec_geometry(spec, resolve_dimensions(spec).dims)
    slots = device.bytes // (geometry.page_width * 2)
    pages = -(-slots // geometry.slots_per_page)
    assert (device.slots, device.pages) == (slots, pages)
    assert device.allocated_bytes == pages * geometry.slots_per_page * geometry.page_width * 2 > device.bytes
    assert plan.kv_cache_bytes == int(0.9 * (plan.free_bytes - device.allocated_bytes))



def _geometry_spec(make_spec: MakeSpec, targets: list[str], **patch: Any) -> BaseModelSpec:
    lora = {"maxRank": 8, "targetModules": targets, "cache": {"optimalAdapterSize": 8, "maxAdapterSize": 64}}
    return make_spec({"source": {"uri": "hf://example/model"}, "architecture": "qwen2", "dimensions": QWEN15_7B,
                      "lora": lora, **patch})


@pytest.mark.parametrize(
    ("targets", "patch", "layers", "modules"),
    [
        # pp=2: each GPU holds the rows of its 16 layers of 32
        (SEVEN_MODULES, {"parallelism": {"tensor": 1, "pipeline": 2}, "engine": {"gpu": {"count": 2}}}, 16, 7),
        # runtime pytorch, q/k targeted without v: the backend adds attn_v's rows (filled with zeros)
        (["attn_q", "attn_k", "mlp_gate"], {"runtime": "pytorch"}, 32, 4),
    ],
)
def test_the_router_and_the_planners_see_one_geometry(
    make_spec: MakeSpec, targets: list[str], patch: dict[str, Any], layers: int, modules: int
) -> None:
    """One mapping from a spec to a cache geometry: what the router prices adapters with (from the spec's declared
    dimensions) is what the capacity planners size the tiers with."""
    spec = _geometry_spec(make_spec, targets, **patch)
    router_view = declared_geometry(spec)
    planned = spec_geometry(spec, resolve_dimensions(spec).dims)
    assert router_view == planned
    assert planned.num_layers == layers and len(planned.shapes) == modules
