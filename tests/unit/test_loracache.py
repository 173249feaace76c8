"""The shared LoRA cache model: TRT-LLM's page geometry and eviction contract."""

from __future__ import annotations

import pytest

from trtfleet.api import LoraModule, ModelDimensions
from trtfleet.loracache import (
    LoraAdapterTooLarge,
    LoraCacheConfig,
    LoraCacheFull,
    LoraPageCache,
    LoraTaskNotFound,
    adapter_pages,
    lora_module_shapes,
    plan_lora_geometry,
    tier_pages,
)

QWEN_7B = ModelDimensions(
    hidden_size=4096, intermediate_size=11008, num_layers=32, num_attention_heads=32, num_kv_heads=32,
    vocab_size=151936,
)
MODULES = [LoraModule(m) for m in ("attn_q", "attn_k", "attn_v", "attn_dense", "mlp_h_to_4h", "mlp_gate",
                                   "mlp_4h_to_h")]


def test_published_qwen_case() -> None:
    """The published TRT-LLM log: Qwen1.5-7B fp16, rank 8, host 39,976,960 bytes."""
    shapes = lora_module_shapes(QWEN_7B, MODULES)
    geometry = plan_lora_geometry(
        shapes, LoraCacheConfig(optimal_adapter_size=8, max_adapter_size=64, max_lora_rank=8, dtype_bytes=2,
                                num_layers=32)
    )
    assert geometry.page_width == 8192
    assert geometry.slots_per_page == 2560
    assert geometry.max_adapter_elements == 19_988_480
    host = tier_pages(geometry, 39_976_960)
    assert host == 1
    assert adapter_pages(geometry, rank=8) == 1  # one max-sized adapter fits


def test_tensor_parallel_splits_the_right_side() -> None:
    q, dense = lora_module_shapes(QWEN_7B, [LoraModule.ATTN_Q, LoraModule.ATTN_DENSE], tp=2)
    assert (q.in_dim, q.out_dim) == (4096, 2048)
    assert (dense.in_dim, dense.out_dim) == (2048, 4096)


def test_lru_among_idle_and_pinning() -> None:
    cache = LoraPageCache(host_pages=3, device_pages=1)
    for task in (1, 2, 3):
        cache.put(task, 1)
    cache.acquire(1)
    cache.release(1)  # 1 becomes the most recently used idle entry
    cache.acquire(2)  # 2 is busy: never evicted
    assert cache.put(4, 1) == [3]
    assert cache.put(5, 1) == [1]
    with pytest.raises(LoraTaskNotFound, match="LoRA task 3 not found in cache"):
        cache.acquire(3)
    assert cache.put(4, 1) == []  # re-sent weights for a cached id are ignored
    cache.acquire(4)
    cache.acquire(5)
    with pytest.raises(LoraCacheFull, match="no done tasks to evict"):
        cache.put(6, 1)
    with pytest.raises(LoraAdapterTooLarge):
        cache.put(7, 4)


def test_device_tier_waits_when_pinned() -> None:
    cache = LoraPageCache(host_pages=4, device_pages=1)
    cache.put(1, 1)
    cache.put(2, 1)
    cache.acquire(1)
    cache.acquire(2)
    assert cache.ensure_device(1)
    assert not cache.ensure_device(2)  # device page pinned by 1
    cache.release(1)
    assert cache.ensure_device(2)
    assert not cache.on_device(1)
