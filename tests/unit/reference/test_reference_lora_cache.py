"""The reference LoRA cache keeps TRT-LLM's contract: texts, LRU among idle, pinning, device tier."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from trtfleet_engines.reference.adapters import AdapterStore, plan_cache
from trtfleet_engines.reference.errors import EXECUTOR_FAILED_TEXT
from trtfleet_engines.reference.scheduler import EngineResponse, InflightBatcher

from tests.unit.reference.fakes import (
    CountingParser,
    FakeModel,
    adapter_store,
    limits,
    lora,
    request,
    run_until_idle,
)
from trtfleet.loracache import FULL_TEXT, MISS_TEXT, Tier


def _batcher(host_pages: int = 3, device_pages: int = 3) -> tuple[InflightBatcher[str], AdapterStore, CountingParser]:
    store, parser = adapter_store(host_pages, device_pages)
    return InflightBatcher(FakeModel(), limits(), store), store, parser


def _one(batcher: InflightBatcher[str], task_id: int | None, shift: int = 0, **lora_args: Any) -> EngineResponse[str]:
    """Run one request (prompt [10], 2 new tokens) to completion."""
    batcher.submit(request([10], 2, exclude_input_in_output=True, lora=lora(task_id, shift, **lora_args)), "h")
    (response,) = run_until_idle(batcher)
    return response


def _step_until(batcher: InflightBatcher[str], handle: str) -> EngineResponse[str]:
    for _ in range(100):
        for response in batcher.step():
            if response.handle == handle and response.final:
                return response
    raise AssertionError(f"{handle} did not finish")


def test_geometry_of_the_test_dimensions() -> None:
    store, _ = adapter_store(host_pages=3, device_pages=2)
    assert (store.plan.geometry.page_width, store.plan.geometry.slots_per_page) == (12, 24)
    assert (store.plan.host_pages, store.plan.device_pages) == (3, 2)
    assert store.pages_of(lora(1).config) == 1  # type: ignore[arg-type]


def test_miss_has_the_exact_wrapped_text_then_weights_load_it() -> None:
    batcher, _, _ = _batcher()
    miss = _one(batcher, 7, weights=False)
    assert miss.error == (
        "Executor failed process requestId 1 due to the following error: "
        "LoRA task 7 not found in cache. Please send LoRA weights with request"
    )
    assert miss.error == EXECUTOR_FAILED_TEXT.format(request_id=1, text=MISS_TEXT.format(task_id=7))
    assert miss.final and miss.output_ids == ()
    assert _one(batcher, 7, shift=5).output_ids == (16, 22)
    assert _one(batcher, 7, weights=False).output_ids == (16, 22)


def test_weights_for_a_cached_id_are_ignored_and_not_parsed() -> None:
    batcher, _, parser = _batcher()
    _one(batcher, 1, shift=5)
    again = _one(batcher, 1, shift=50)
    assert again.output_ids == (16, 22)  # still the first weights
    assert parser.calls == [5]


def test_eviction_is_lru_among_idle_adapters() -> None:
    batcher, store, _ = _batcher(host_pages=2)
    _one(batcher, 1)
    _one(batcher, 2)
    _one(batcher, 1, weights=False)  # 1 is now the most recently used
    _one(batcher, 3)  # evicts 2
    assert store.resident() == [1, 3]
    assert MISS_TEXT.format(task_id=2) in str(_one(batcher, 2, weights=False).error)
    assert _one(batcher, 1, weights=False).error is None


def test_an_adapter_in_use_is_never_evicted() -> None:
    batcher, store, _ = _batcher(host_pages=2)
    batcher.submit(request([1], 40, lora=lora(1)), "long")  # task 1: loaded first, busy throughout
    batcher.submit(request([1], 1, lora=lora(2)), "short")  # task 2: loaded later, idle after one step
    _step_until(batcher, "short")
    assert store.cache.in_use(1) and not store.cache.in_use(2)
    batcher.submit(request([1], 1, lora=lora(3)), "new")
    assert _step_until(batcher, "new").error is None
    assert sorted(store.resident()) == [1, 3]  # the idle 2 went, not the older but busy 1


def test_cache_full_when_every_adapter_is_in_use() -> None:
    batcher, _, _ = _batcher(host_pages=2)
    batcher.submit(request([1], 40, lora=lora(1)), "a")
    batcher.submit(request([1], 40, lora=lora(2)), "b")
    batcher.step()
    batcher.submit(request([1], 1, lora=lora(3)), "c")
    (failed,) = [r for r in batcher.step() if r.handle == "c"]
    assert failed.error == EXECUTOR_FAILED_TEXT.format(request_id=3, text=FULL_TEXT)
    assert failed.final


def test_a_request_waits_until_its_adapter_fits_on_the_device() -> None:
    batcher, store, _ = _batcher(host_pages=3, device_pages=1)
    batcher.submit(request([1], 3, lora=lora(1)), "a")
    batcher.submit(request([1], 3, lora=lora(2)), "b")
    order = [r.handle for r in run_until_idle(batcher)]
    assert order == ["a", "b"]
    assert isinstance(batcher.model, FakeModel)
    assert all(len(rows) == 1 for rows in batcher.model.steps)  # never side by side
    assert store.cache.evictions[Tier.DEVICE] == 1 and store.cache.evictions[Tier.HOST] == 0


@pytest.mark.parametrize(
    ("lora_args", "text"),
    [
        ({"task_id": None}, "lora_task_id must be set for LoRA inference"),
        ({"dtype": np.float32}, "Expected lora weights to be the same data type as base model"),
        ({"modules": (1, 4)}, "lora module attn_dense not enabled for this model"),
        ({"rank": 8}, "Invalid low_rank (8). low_rank must be smaller than mMaxLowRank (4)"),
    ],
)
def test_validation_texts(lora_args: dict[str, object], text: str) -> None:
    batcher, _, parser = _batcher()
    args = {"task_id": 9, **lora_args}
    task_id = args.pop("task_id")
    response = _one(batcher, task_id, **args)  # type: ignore[arg-type]
    assert response.error == EXECUTOR_FAILED_TEXT.format(request_id=1, text=text)
    assert parser.calls == []


def test_plan_cache_sizes_tiers_from_bytes() -> None:
    store, _ = adapter_store(host_pages=5, device_pages=1)
    plan = plan_cache(store.dims, store.settings)
    assert (plan.host_pages, plan.device_pages) == (5, 1)
