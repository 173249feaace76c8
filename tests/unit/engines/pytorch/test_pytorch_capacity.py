"""The PyTorch-backend capacity planner, against hand-computed LoRA tier sizes of the tiny reference model.

Tiny Llama (hidden 64, intermediate 176, 2 layers, 4 heads, 2 KV heads, head dim 16), TP-local ``in + out``:
q 128, k 96, v 96, dense 128, gate/up/down 240. So ``pageWidth`` 96 and ``max1dModSize`` 240: a module-layer
is ``ceil(240 / 96) = 3`` slots of 96 float16 elements = 576 bytes, and a rank-8 adapter over 7 modules x 2
layers is ``8 x 2 x 7 = 112`` module-layers = 64,512 bytes.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pytest
from trtfleet_engines.modeldims import TINY_LLAMA_DIMENSIONS, ResolvedDimensions
from trtfleet_engines.pytorch.capacity import plan_lora_slots, plan_pytorch_capacity

from trtfleet.api.basemodel import BaseModelSpec, LoraModule
from trtfleet.loracache import missing_qkv_modules

ALL_SEVEN = ["attn_q", "attn_k", "attn_v", "attn_dense", "mlp_h_to_4h", "mlp_4h_to_h", "mlp_gate"]
TINY = ResolvedDimensions(dims=TINY_LLAMA_DIMENSIONS, source="test")


def tiny_spec(make_spec: Callable[..., BaseModelSpec], **lora: Any) -> BaseModelSpec:
    tp = lora.pop("tp", 1)
    cache = {"hostMemoryBytes": lora.pop("host", "2Mi"), "optimalAdapterSize": 8, "maxAdapterSize": 8}
    return make_spec({
        "source": {"uri": "file:///opt/trtfleet/models/tiny-llama"},
        "runtime": "pytorch",
        "parallelism": {"tensor": tp},
        "engine": {"maxBatchSize": 8, "maxInputLen": 256, "maxSeqLen": 512, "maxNumTokens": 2048,
                   "gpu": {"product": "cpu", "count": tp}},
        "lora": {"maxRank": 8, "targetModules": lora.pop("modules", ALL_SEVEN), "cache": cache},
    })


@dataclass(frozen=True)
class Case:
    host: int | str
    device_budget_bytes: int
    modules: tuple[str, ...] = tuple(ALL_SEVEN)
    tp: int = 1
    want_max_loras: int = 0
    want_max_cpu_loras: int = 0
    want_adapter_bytes: int = 64_512
    want_problem: str | None = None


CASES = [
    pytest.param(Case("2Mi", 10 * 64_512, want_max_loras=10, want_max_cpu_loras=32), id="device-limits"),
    pytest.param(Case("2Mi", 10**9, want_max_loras=32, want_max_cpu_loras=32), id="host-caps-device"),
    pytest.param(Case(3 * 64_512 + 64_511, 10**9, want_max_loras=3, want_max_cpu_loras=3), id="host-floor"),
    pytest.param(Case("2Mi", 64_511, want_max_cpu_loras=32, want_problem="max_loras would be 0"), id="no-device"),
    pytest.param(Case(64_511, 10**9, want_problem="max_cpu_loras would be 0"), id="no-host"),
    # attn_q alone: TRT-LLM adds the missing k and v; in+out 128, 96, 96 -> 2 slots of 96 per module-layer,
    # 8 x 2 x 3 = 48 module-layers = 18,432 bytes; 2 MiB holds 113.
    pytest.param(Case("2Mi", 10**9, modules=("attn_q",), want_max_loras=113, want_max_cpu_loras=113,
                      want_adapter_bytes=18_432), id="missing-qkv"),
    # TP 2 halves the column outputs / row inputs: in+out 96, 80, 80, 96, 152 x 3 -> 2 slots of 80,
    # 112 module-layers x 2 x 80 x 2 bytes = 35,840 bytes; 2 MiB holds 58.
    pytest.param(Case("2Mi", 10**9, tp=2, want_max_loras=58, want_max_cpu_loras=58, want_adapter_bytes=35_840),
                 id="tp2"),
]


@pytest.mark.parametrize("case", CASES)
def test_lora_slots(case: Case, make_spec: Callable[..., BaseModelSpec]) -> None:
    spec = tiny_spec(make_spec, host=case.host, modules=list(case.modules), tp=case.tp)
    problems: list[str] = []
    plan = plan_lora_slots(spec, TINY, case.device_budget_bytes, problems)
    assert (plan.max_loras, plan.max_cpu_loras) == (case.want_max_loras, case.want_max_cpu_loras)
    per_adapter = plan.device.bytes // plan.max_loras if plan.max_loras else None
    if per_adapter is not None:
        assert per_adapter == case.want_adapter_bytes
        assert plan.host.bytes == case.want_adapter_bytes * plan.max_cpu_loras
    if case.want_problem is None:
        assert problems == []
        assert plan.device.max_rank_adapters_fit >= plan.max_loras
    else:
        assert any(case.want_problem in p for p in problems), problems


def test_host_tier_of_32_tiny_adapters_is_45_pages(make_spec: Callable[..., BaseModelSpec]) -> None:
    # 32 adapters x 336 slots = 10,752 slots; a page holds 8 (optimal rank) x 15 slots per layer x 2 layers
    # = 240 slots, so 45 pages, and a rank-8 adapter (196 slots) takes 1 page.
    plan = plan_lora_slots(tiny_spec(make_spec), TINY, 10**9, [])
    assert (plan.host.slots, plan.slots_per_page, plan.max_adapter_pages, plan.host.pages) == (10_752, 240, 1, 45)


@pytest.mark.parametrize(
    ("targets", "missing"),
    [
        pytest.param((LoraModule.ATTN_Q, LoraModule.ATTN_V), (LoraModule.ATTN_K,), id="k-missing"),
        pytest.param((LoraModule.ATTN_QKV,), (), id="fused-qkv"),
        pytest.param((LoraModule.MLP_GATE,), (), id="no-attention"),
    ],
)
def test_missing_qkv_modules(targets: tuple[LoraModule, ...], missing: tuple[LoraModule, ...]) -> None:
    assert missing_qkv_modules(targets) == missing


def test_plan_reports_int8_kv_and_sizes_kv_after_lora(make_spec: Callable[..., BaseModelSpec]) -> None:
    plan = plan_pytorch_capacity(make_spec({"quantization": {"kvCacheDtype": "int8"}}))
    assert any("int8" in p for p in plan.problems)
    ok = plan_pytorch_capacity(make_spec())
    assert ok.verdict == "ok" and ok.lora is not None
    assert ok.kv_cache_bytes == int(0.9 * (ok.free_bytes - ok.lora.device.bytes))
    assert ok.kv_cache_tokens % 32 == 0 and ok.kv_cache_tokens >= 4096


def test_plan_without_lora(make_spec: Callable[..., BaseModelSpec]) -> None:
    plan = plan_pytorch_capacity(make_spec({"lora": {"enabled": False}}))
    assert plan.lora is None and plan.to_json_dict()["lora"] is None
