"""Mooncake traces as adapter-keyed prefix traces, the simulated pods' KV block reuse, and the replay."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pytest

from bench.mooncake import (
    MooncakeRow,
    MooncakeScale,
    assign_adapters,
    mooncake_trace,
    read_mooncake,
    reusable_blocks,
    ttft_floor_s,
)
from bench.podkv import PodKvBlocks
from bench.podsim import PodSpec, SimPod, SimRequest, StepTimeModel
from bench.prefix_realfleet import setting
from bench.profiles import h100_llama3_8b_fleet
from bench.simulate import FleetSimulation, simulate

ROWS = [
    MooncakeRow(0.0, 2048, 8, (1, 2, 3, 4)),  # conversation A, turn 1
    MooncakeRow(10.0, 2048, 8, (5, 6, 7, 8)),  # conversation B
    MooncakeRow(20.0, 2560, 8, (1, 2, 3, 4, 9)),  # conversation A, turn 2: its first 4 ids again
]
SCALE = MooncakeScale(length_factor=0.25, time_factor=0.01, num_adapters=2, zipf_alpha=0.0, seed=3)


def test_a_conversation_keeps_its_adapter_and_the_assignment_is_seeded() -> None:
    adapters = assign_adapters(ROWS, 50, 1.0, 7)
    assert adapters[0] == adapters[2]
    assert adapters == assign_adapters(ROWS, 50, 1.0, 7)


def test_scaled_blocks_are_shared_by_the_turns_of_a_conversation() -> None:
    trace, cut = mooncake_trace(ROWS, SCALE)
    assert cut == 0
    first, other, second = trace
    assert first.prompt_tokens == 512 and len(first.blocks) == 16  # 4 ids x 128 tokens / 32
    assert second.blocks[:16] == first.blocks
    assert not set(other.blocks) & set(first.blocks)
    assert reusable_blocks(trace) == [0, 0, 16]
    assert [r.t_s for r in trace] == pytest.approx([0.0, 0.0001, 0.0002])


def test_a_bounded_cache_reuses_only_what_it_still_holds_and_sets_the_ttft_floor() -> None:
    """16 blocks of conversation A, 16 of B, then A's second turn: a cache of 20 blocks has lost A's prefix
    to B's (least recently used first, a prompt's last block touched first) except its first 4 blocks."""
    trace, _ = mooncake_trace(ROWS, SCALE)
    assert reusable_blocks(trace, 1000) == reusable_blocks(trace) == [0, 0, 16]
    assert reusable_blocks(trace, 20) == [0, 0, 4]
    assert reusable_blocks(trace, 16) == [0, 0, 0]
    # one 20 ms step plus 1 ms a token: 512, 512 and 640 tokens, of which 0, 0 and 4 x 32 reused
    floor = ttft_floor_s(trace, [0, 0, 4], 32, 0.020, 0.001)
    assert floor == pytest.approx(0.020 + (512 + 512 + 640 - 128) * 0.001 / 3)
    assert ttft_floor_s(trace, [16, 16, 20], 32, 0.0, 0.001) == pytest.approx(0.001)  # a token is always computed


def test_reading_a_bad_row_names_the_line(tmp_path: Path) -> None:
    path = tmp_path / "t.jsonl"
    path.write_text(json.dumps({"timestamp": 0, "input_length": 1, "output_length": 1, "hash_ids": [1]}) + "\n{}\n")
    with pytest.raises(ValueError, match=r"t.jsonl:2: not a Mooncake trace row"):
        read_mooncake(path)


def test_pod_kv_blocks_reuse_leading_blocks_and_evict_leaves_first() -> None:
    kv = PodKvBlocks(capacity_blocks=4)
    assert kv.admit((1, 2, 3)) == 0
    assert kv.admit((1, 2, 9)) == 2
    assert (kv.reused_total, kv.missed_total) == (2, 4)
    assert kv.cached_prefix((1, 2, 3)) == 3  # 4 blocks held: 1, 2, 3, 9
    kv.admit((7, 8))  # evicts the two least recent leaves (3, then 9), never the shared 1, 2
    assert kv.cached_prefix((1, 2)) == 2 and kv.cached_prefix((1, 2, 3)) == 2


def test_a_pod_charges_prefill_for_uncached_tokens_only() -> None:
    model = StepTimeModel(name="prefill", fixed_s=0.0, per_seq_s=0.0, per_context_token_s=0.0,
                          per_prefill_token_s=1e-3)
    pod = SimPod("p", PodSpec(host_pages=2, device_pages=2, page_bytes=1, kv_capacity_tokens=10_000), model)
    blocks = tuple(range(10))
    for expected_s in (0.32, 0.001):  # 320 tokens; then all cached but the one token TRT-LLM computes
        request = SimRequest(0, 1, prompt_tokens=320, max_tokens=1, with_weights=True, pages=1, blocks=blocks)
        pod.arrive(request)
        assert pod.start_step() == pytest.approx(expected_s)
        pod.end_step(1.0)


def test_trtfleet_reuses_more_prefix_than_round_robin_in_the_simulator() -> None:
    rows = [MooncakeRow(100.0 * i, 4096, 4, (1000 * (i % 5), 1000 * (i % 5) + 1, i)) for i in range(60)]
    trace, _ = mooncake_trace(rows, MooncakeScale(length_factor=0.25, time_factor=0.001, num_adapters=3, seed=1))
    spec = h100_llama3_8b_fleet(8)
    reused = {policy: sum(r.reused_blocks for r in simulate(trace, policy, spec).records)
              for policy in ("ttft-cost", "round-robin")}
    assert reused["ttft-cost"] > reused["round-robin"]


def test_each_simulated_pods_prefix_index_is_the_size_of_its_kv_pool() -> None:
    spec = h100_llama3_8b_fleet(4)
    blocks = spec.pod.kv_capacity_tokens // spec.pod.kv_tokens_per_block
    assert blocks != 13_000  # not the routing default: the plan's size reaches the index
    for replica in FleetSimulation([], "ttft-cost", spec).replicas:
        assert {pod.kv_blocks_capacity for pod in replica.fleet.snapshot().pods} == {blocks}


def test_the_real_fleet_harness_takes_numeric_trtfleet_settings_and_refuses_others() -> None:
    assert setting("inflightDelayS=0.01") == ("inflightDelayS", 0.01)
    for bad in ("inflightDelayS", "=1", "inflightDelayS=fast"):
        with pytest.raises(argparse.ArgumentTypeError, match="KEY=NUMBER"):
            setting(bad)
