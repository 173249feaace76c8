"""The reference engine's KV-cache block pool: chained keys, adapter isolation, LRU eviction, counters, events."""

from __future__ import annotations

from dataclasses import dataclass

import pytest
from trtfleet_engines.reference.kv_blocks import (
    Allocation,
    BlockPool,
    KvCacheSettings,
    block_hash,
    chained_block_hashes,
)
from trtfleet_engines.reference.kv_events import KvEventBuffer

TPB = 4


def pool(max_blocks: int = 64, *, reuse: bool = True, events: int = 100) -> BlockPool:
    buffer = KvEventBuffer(events, window_size=256) if events else None
    return BlockPool(KvCacheSettings(max_blocks, TPB, reuse, events), buffer)


def serve(p: BlockPool, prompt: list[int], task: int | None = None, max_new: int = 1) -> Allocation:
    """Admit, 'prefill' (the payload names the positions) and keep holding, as the batcher does."""
    allocation = p.allocate(prompt, task, max_new)
    assert allocation is not None
    p.store(allocation, lambda start, stop: (start, stop))
    return allocation


def test_hashes_chain_over_full_blocks_only() -> None:
    a = chained_block_hashes(list(range(10)), TPB, None)
    b = chained_block_hashes([*range(8), 99, 98, 97, 96], TPB, None)
    assert len(a) == 2  # 10 tokens: two full blocks, the partial third is never hashed
    assert a[:2] == b[:2] and len(b) == 3
    assert a[1] == block_hash([4, 5, 6, 7], a[0], None)
    assert block_hash([4, 5, 6, 7], 0, None) != a[1]  # the parent is part of the key
    assert all(0 <= h < 2**64 for h in a + b)


@pytest.mark.parametrize(
    ("lora_task_id", "expected"),
    [
        pytest.param(None, [5211028798807628312, 11552810948680195536], id="no-adapter"),
        pytest.param(1, [3794393884925871676, 13006123991889035104], id="task-1"),
        pytest.param(2**64 - 1, [10621217465564662178, 17241977215487654632], id="largest-task-id"),
    ],
)
def test_hashes_equal_the_upstream_formula_in_native_unsigned_arithmetic(
    lora_task_id: int | None, expected: list[int]
) -> None:
    """Values printed by a C++ transliteration of ``BlockKeyHasher::hash`` (blockKey.cpp @ 0bd2980d) with
    native uint32/uint64 wraparound, g++ 17: they check the Python masks, not TRT-LLM itself."""
    prompt = [(i * 7919 + 257) % 260 for i in range(70)]
    assert chained_block_hashes(prompt, 32, lora_task_id) == expected


@pytest.mark.parametrize(
    ("first_task", "second_task", "reused"),
    [
        pytest.param(None, None, 3, id="base-base"),
        pytest.param(7, 7, 3, id="same-adapter"),
        pytest.param(None, 7, 0, id="base-then-adapter"),
        pytest.param(7, None, 0, id="adapter-then-base"),
        pytest.param(7, 8, 0, id="other-adapter"),
    ],
)
def test_reuse_is_keyed_by_the_task_id(first_task: int | None, second_task: int | None, reused: int) -> None:
    p = pool()
    p.release(serve(p, list(range(12)), first_task))
    second = p.allocate([*range(12), 50], second_task, 1)
    assert second is not None and len(second.shared) == reused
    assert second.reused_tokens == reused * TPB
    assert chained_block_hashes(list(range(12)), TPB, second_task)[:reused] == [b.block_hash for b in second.shared]


@pytest.mark.parametrize(
    ("prompt_len", "reusable"),
    [
        pytest.param(8, 1, id="exact-blocks: the last token's block is recomputed"),
        pytest.param(9, 2, id="one-more-token"),
        pytest.param(3, 0, id="shorter-than-a-block"),
    ],
)
def test_the_last_prompt_token_is_always_computed(prompt_len: int, reusable: int) -> None:
    p = pool()
    p.release(serve(p, list(range(12))))
    assert len(p.match(list(range(prompt_len)), None)) == reusable


def test_partial_blocks_are_not_stored_and_the_events_say_what_was() -> None:
    p = pool()
    assert p.events is not None
    assert [e["data"] for e in p.events.drain()] == [{"type": "created", "num_blocks_per_cache_level": [64, 0]}]
    allocation = serve(p, list(range(10)), task=3)
    assert p.cached_blocks == 2
    events = p.events.drain()
    assert [e["event_id"] for e in events] == [1] and events[0]["window_size"] == 256
    data = events[0]["data"]
    hashes = chained_block_hashes(list(range(10)), TPB, 3)
    assert data["type"] == "stored" and data["parent_hash"] is None
    assert [b["block_hash"] for b in data["blocks"]] == hashes
    assert [[t["token_id"] for t in b["tokens"]] for b in data["blocks"]] == [[0, 1, 2, 3], [4, 5, 6, 7]]
    assert data["blocks"][0] == {"type": "stored_block", "block_hash": hashes[0], "tokens": data["blocks"][0]["tokens"],
                                 "cache_level": 0, "priority": 35}
    assert data["blocks"][0]["tokens"][0] == {"type": "unique_token", "token_id": 0, "token_extra_id": 0}
    p.release(allocation)
    serve(p, [*range(12), 1, 2, 3, 4], task=3)  # extends the chain: the new event's parent is the last shared block
    (extended,) = p.events.drain()
    assert extended["data"]["parent_hash"] == hashes[1] and len(extended["data"]["blocks"]) == 2


def test_idle_blocks_are_evicted_least_recently_used_with_their_descendants() -> None:
    p = pool(max_blocks=6)
    a = serve(p, [1] * 8 + [9], max_new=1)  # 2 cached blocks + 1 private
    b = serve(p, [2] * 8 + [9], max_new=1)
    p.release(a)
    p.release(b)
    assert p.cached_blocks == 4 and p.free_blocks() == 6
    assert p.events is not None
    p.events.drain()
    p.release(serve(p, [1] * 8 + [5], max_new=1))  # touches a's chain: b's is now the least recently used
    c = p.allocate([3] * 8 + [9], None, 4)  # needs 4 blocks: b's two idle blocks go, root and child
    assert c is not None
    removed = [e["data"] for e in p.events.drain() if e["data"]["type"] == "removed"]
    leaf_first = list(reversed(chained_block_hashes([2] * 8, TPB, None)))
    assert removed == [{"type": "removed", "block_hashes": leaf_first}]  # one event for consecutive removals
    assert len(p.match([1] * 8 + [0], None)) == 2 and p.match([2] * 8 + [0], None) == []


def test_held_blocks_are_never_evicted_and_a_full_pool_says_not_now() -> None:
    p = pool(max_blocks=4)
    held = serve(p, [1] * 8 + [9], max_new=3)  # 3 blocks: 2 cached (held) + 1 private
    assert p.free_blocks() == 1
    assert p.allocate([2] * 8, None, 1) is None  # 3 blocks wanted, 1 free
    assert p.counters.missed_blocks == 3  # a refused allocation counts nothing
    p.release(held)
    assert p.allocate([2] * 8, None, 1) is not None


@dataclass(frozen=True)
class Turn:
    prompt: list[int]
    reused: int
    missed: int


def test_counters_are_cumulative_like_kv_cache_stats() -> None:
    p = pool()
    turns = [Turn(list(range(9)), 0, 3), Turn(list(range(13)), 2, 2), Turn(list(range(13)), 3, 1)]
    reused = missed = 0
    for turn in turns:
        p.release(serve(p, turn.prompt))
        reused, missed = reused + turn.reused, missed + turn.missed
        assert (p.counters.reused_blocks, p.counters.missed_blocks) == (reused, missed)
    assert p.counters.cache_hit_rate == pytest.approx(5 / 11)
    assert p.counters.alloc_total_blocks == 11 and p.counters.alloc_new_blocks == 6


def test_reuse_off_stores_nothing_and_matches_nothing() -> None:
    p = pool(reuse=False)
    p.release(serve(p, list(range(12))))
    assert p.cached_blocks == 0 and p.match(list(range(12)), None) == []
    assert p.events is not None and [e["data"]["type"] for e in p.events.drain()] == ["created"]


def test_the_event_buffer_drops_the_oldest_events() -> None:
    buffer = KvEventBuffer(2, window_size=32)
    buffer.created(8)
    buffer.removed(1)
    buffer.removed(2)  # joins the previous removed event
    buffer.created(9)
    buffer.removed(3)
    assert [(e["event_id"], e["data"]) for e in buffer.drain()] == [
        (2, {"type": "created", "num_blocks_per_cache_level": [9, 0]}),
        (3, {"type": "removed", "block_hashes": [3]}),
    ]
    assert buffer.drain() == []
    with pytest.raises(ValueError, match="at least 1"):
        KvEventBuffer(0, window_size=32)
