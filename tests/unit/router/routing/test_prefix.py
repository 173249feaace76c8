"""Block hashes of a prompt, the per-pod prefix index, and KV-cache events applied to it."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pytest
from trtfleet_engines.reference.tokenizer import BOS_ID, SEP_ID, prompt_ids
from trtfleet_router.routing.kvevents import KvEventError, PodEventState, apply_events, parse_events
from trtfleet_router.routing.prefix import (
    REFERENCE_BOS_ID,
    REFERENCE_SEP_ID,
    payload_block_hashes,
    reference_prompt_payload,
    text_block_hashes,
    token_block_hashes,
)
from trtfleet_router.routing.prefixindex import PrefixIndex
from trtfleet_router.routing.types import PodMetrics


def test_reference_specials_match_the_engine_tokenizer() -> None:
    assert (REFERENCE_BOS_ID, REFERENCE_SEP_ID) == (BOS_ID, SEP_ID)


@pytest.mark.parametrize("prompt", ["", "hi", "x" * 100, "héllo wörld " * 20])
def test_reference_payload_hashes_equal_the_engine_token_ids(prompt: str) -> None:
    assert payload_block_hashes(reference_prompt_payload(prompt), 7, 8) == token_block_hashes(prompt_ids(prompt), 7, 8)


@dataclass(frozen=True)
class ChainCase:
    id: str
    a: Any
    b: Any
    shared_blocks: int


CHAIN_CASES = [
    ChainCase("same-prefix-same-adapter", ("a" * 256 + "x", 1), ("a" * 256 + "y", 1), 2),
    ChainCase("same-text-other-adapter", ("a" * 256, 1), ("a" * 256, 2), 0),
    ChainCase("differ-in-first-block", ("b" + "a" * 255, 1), ("a" * 256, 1), 0),
    ChainCase("differ-in-second-block-only", ("a" * 128 + "b" * 128, 1), ("a" * 256, 1), 1),
]


@pytest.mark.parametrize("case", CHAIN_CASES, ids=[c.id for c in CHAIN_CASES])
def test_text_blocks_are_chained_and_keyed_by_adapter(case: ChainCase) -> None:
    a = text_block_hashes(case.a[0], case.a[1], 32).hashes  # 128 characters a block
    b = text_block_hashes(case.b[0], case.b[1], 32).hashes
    shared = next((i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), min(len(a), len(b)))
    assert shared == case.shared_blocks


def test_only_full_blocks_count_and_non_ascii_text_is_cut_by_characters() -> None:
    assert len(text_block_hashes("a" * 255, 0, 32).hashes) == 1
    assert len(text_block_hashes("é" * 256, 0, 32).hashes) == 2
    assert len(token_block_hashes(list(range(95)), 0, 32).hashes) == 2


@dataclass(frozen=True)
class IndexCase:
    id: str
    capacity: int
    routed: tuple[tuple[str, int], ...]  # (pod, prompt length in blocks) of prompts 0..n-1 of one conversation
    expected: dict[str, int]


INDEX_CASES = [
    IndexCase("empty", 100, (), {}),
    IndexCase("longest-prefix-per-pod", 100, (("p0", 2), ("p1", 5)), {"p0": 2, "p1": 5}),
    # capacity 4: the 6-block prompt keeps its first 4 blocks (leaves go first), still a prefix
    IndexCase("lru-keeps-the-prefix", 4, (("p0", 6),), {"p0": 4}),
]


@pytest.mark.parametrize("case", INDEX_CASES, ids=[c.id for c in INDEX_CASES])
def test_prefix_index_match(case: IndexCase) -> None:
    index = PrefixIndex(case.capacity)
    for pod in ("p0", "p1"):
        index.reset_pod(pod)
    conversation = token_block_hashes(list(range(8 * 4)), 3, 4).hashes  # 8 blocks
    for pod, blocks in case.routed:
        index.record(pod, conversation[:blocks])
    assert index.match(conversation) == case.expected
    index.check_invariants()


def test_dropping_a_pod_frees_its_blocks_and_slot() -> None:
    index = PrefixIndex(10)
    index.reset_pod("p0")
    hashes = token_block_hashes(list(range(8)), 0, 4).hashes
    index.record("p0", hashes)
    index.drop_pod("p0")
    index.reset_pod("p1")
    assert index.match(hashes) == {}
    index.check_invariants()


def test_the_engine_reported_size_replaces_the_planned_one_and_drops_the_oldest_blocks() -> None:
    """A plan of 100 blocks, an engine that reports 3: the pod keeps the 3 most recent blocks, the first ones of
    the newest prompt (so it still matches that prompt's prefix), and the other pod's blocks stay."""
    index = PrefixIndex(100)
    for pod in ("p0", "p1"):
        index.reset_pod(pod)
    first = token_block_hashes(list(range(100, 116)), 3, 4).hashes  # 4 blocks
    second = token_block_hashes(list(range(8 * 4)), 3, 4).hashes  # 8 blocks, recorded last
    index.record("p0", first)
    index.record("p0", second)
    index.record("p1", second)
    index.observe_metrics("p0", PodMetrics(0, 0, kv_capacity_blocks=3))
    assert index.blocks_held("p0") == 3
    assert index.match(second) == {"p0": 3, "p1": 8}
    assert index.match(first) == {}
    index.check_invariants()
    index.observe_metrics("p0", PodMetrics(0, 0, kv_capacity_blocks=None))  # not exported: the size stays
    index.record("p0", first)
    assert index.blocks_held("p0") == 3
    index.check_invariants()


def test_an_index_turned_off_stays_off_when_the_engine_reports_its_size() -> None:
    index = PrefixIndex(0)  # prefix.podKvBlocks 0 and no capacity plan: not modelled
    index.reset_pod("p0")
    index.observe_metrics("p0", PodMetrics(0, 0, kv_capacity_blocks=500))
    index.record("p0", token_block_hashes(list(range(8)), 0, 4).hashes)
    assert index.blocks_held("p0") == 0
    index.observe_metrics("unknown", PodMetrics(0, 0, kv_capacity_blocks=500))  # ignored, no error


def _stored(parent: int | None, blocks: list[tuple[int, list[int]]], lora: int | None = 5) -> dict[str, Any]:
    return {"event_id": 1, "window_size": 64, "data": {"type": "stored", "parent_hash": parent, "blocks": [
        {"type": "stored_block", "block_hash": h, "cache_level": 0, "priority": 35, "lora_id": lora,
         "tokens": [{"type": "unique_token", "token_id": t, "token_extra_id": 0} for t in tokens]}
        for h, tokens in blocks]}}


def test_events_give_exactly_the_router_hashes_and_removals_drop_them() -> None:
    index = PrefixIndex(100)
    index.reset_pod("p0")
    state = PodEventState()
    tokens = list(range(12))
    events = parse_events([_stored(None, [(901, tokens[0:4])]), _stored(901, [(902, tokens[4:8]), (903, tokens[8:12])]),
                           {"data": {"type": "updated", "block_hash": 903}}])
    assert apply_events(index, "p0", state, events) == (3, 0)
    request = token_block_hashes(tokens, 5, 4).hashes
    assert index.match(request) == {"p0": 3}
    apply_events(index, "p0", state, parse_events([{"data": {"type": "removed", "block_hashes": [903, 999]}}]))
    assert index.match(request) == {"p0": 2}
    assert apply_events(index, "p0", state, parse_events([_stored(777, [(904, tokens[:4])])])) == (0, 1)
    apply_events(index, "p0", state, parse_events([{"data": {"type": "created", "num_blocks_per_cache_level": [9]}}]))
    assert index.match(request) == {}
    index.check_invariants()


def test_a_chain_root_without_lora_id_is_not_guessed() -> None:
    """Upstream's serializer leaves ``lora_id`` out: the block's key (its task id) is unknown, so skip it."""
    index = PrefixIndex(100)
    index.reset_pod("p0")
    state = PodEventState()
    tokens = list(range(8))
    events = parse_events([_stored(None, [(901, tokens[0:4]), (902, tokens[4:8])], lora=None)])
    assert apply_events(index, "p0", state, events) == (0, 2)
    assert index.match(token_block_hashes(tokens, 0, 4).hashes) == {}
    assert apply_events(index, "p0", state, parse_events([_stored(None, [(903, tokens[0:4])], lora=0)])) == (1, 0)
    assert index.match(token_block_hashes(tokens, 0, 4).hashes) == {"p0": 1}


@pytest.mark.parametrize("payload", [
    {"not": "a list"},
    [{"data": {"type": "stored", "parent_hash": None, "blocks": "x"}}],
    [{"data": {"type": "removed", "block_hashes": ["a"]}}],
    [{"data": {"type": "exploded"}}],
    [{"nodata": 1}],
], ids=["not-a-list", "blocks-not-a-list", "hash-not-int", "unknown-type", "no-data"])
def test_malformed_events_are_refused_with_a_clear_error(payload: Any) -> None:
    with pytest.raises(KvEventError, match="KV-cache event"):
        parse_events(payload)


def test_pending_prefill_is_credited_with_what_the_oldest_request_has_computed() -> None:
    index = PrefixIndex(64)
    index.reset_pod("p")
    per_token = 0.001
    index.prefill_started(1, "p", 100, now_s=10.0)  # 0.1 s of prefill, the pod to itself from 10.0
    index.prefill_started(2, "p", 50, now_s=10.02)  # 0.05 s behind it
    assert index.pending_prefill_s("p", 10.0, per_token) == pytest.approx(0.15)
    assert index.pending_prefill_s("p", 10.06, per_token) == pytest.approx(0.09)
    # the oldest is credited at most its own prefill: running late, the pod still owes the one behind it
    assert index.pending_prefill_s("p", 11.0, per_token) == pytest.approx(0.05)
    assert index.prefill_done(1, now_s=11.0)
    assert index.pending_prefill_s("p", 11.0, per_token) == pytest.approx(0.05)  # the next one starts now
    assert index.pending_prefill_s("p", 11.03, per_token) == pytest.approx(0.02)
    assert index.prefill_done(2, now_s=11.05)
    assert index.pending_prefill_s("p", 11.05, per_token) == 0.0
    assert index.pending_prefill_tokens("p") == 0


def test_a_request_behind_the_oldest_that_ends_first_leaves_the_oldest_credited() -> None:
    index = PrefixIndex(64)
    index.reset_pod("p")
    index.prefill_started(1, "p", 100, now_s=10.0)
    index.prefill_started(2, "p", 50, now_s=10.0)
    assert index.prefill_done(2, now_s=10.04)  # e.g. both in one step, or the second one cancelled
    assert index.pending_prefill_s("p", 10.06, 0.001) == pytest.approx(0.04)


def test_pending_prefill_of_unknown_start_gets_no_credit() -> None:
    index = PrefixIndex(64)
    index.reset_pod("p")
    index.prefill_started(("other-replica", 7), "p", 100)  # copied from a snapshot: started who knows when
    assert index.pending_prefill_s("p", 1e9, 0.001) == pytest.approx(0.1)
    assert index.pending_prefill_s("absent", 1e9, 0.001) == 0.0


def test_a_request_booked_twice_counts_once_and_ends_once() -> None:
    index = PrefixIndex(64)
    index.reset_pod("p")
    index.prefill_started(("other-replica", 7), "p", 100)  # from a snapshot
    index.prefill_started(("other-replica", 7), "p", 100, now_s=5.0)  # then its event
    index.check_invariants()
    assert index.pending_tokens(("other-replica", 7)) == 100
    assert index.prefill_done(("other-replica", 7), now_s=6.0)
    assert not index.prefill_done(("other-replica", 7), now_s=6.0)
    assert index.pending_prefill_tokens("p") == 0
    index.check_invariants()
