"""Stable hashing: fixed values (the same in every process and release) and HRW properties."""

from __future__ import annotations

from trtfleet_router.routing.hashing import (
    RendezvousRankings,
    rendezvous_rank,
    rendezvous_score,
    stable_hash64,
)


def test_hashes_are_pinned() -> None:
    # BLAKE2b-64, big-endian; changing these breaks agreement between router versions in one fleet.
    assert stable_hash64("") == 0xE4A6A0577479B2B4
    assert stable_hash64("adapter-1") == 0x77F4F13B887947CE
    assert rendezvous_score("adapter-1", "p0") == 0x73964ad910983d9b
    assert rendezvous_rank("adapter-1", ["p0", "p1", "p2", "p3"]) == ('p2', 'p3', 'p0', 'p1')


def test_removing_a_pod_moves_only_its_keys() -> None:
    pods = [f"pod-{i}" for i in range(10)]
    keys = [f"adapter-{i}" for i in range(500)]
    before = {key: rendezvous_rank(key, pods)[0] for key in keys}
    after = {key: rendezvous_rank(key, pods[1:])[0] for key in keys}
    moved = {key for key in keys if before[key] != after[key]}
    assert moved == {key for key in keys if before[key] == "pod-0"}
    for key in keys:  # the rest of each ranking keeps its order
        assert rendezvous_rank(key, pods[1:]) == tuple(p for p in rendezvous_rank(key, pods) if p != "pod-0")


def test_rankings_spread_keys_evenly() -> None:
    pods = [f"pod-{i}" for i in range(8)]
    firsts = [rendezvous_rank(f"adapter-{i}", pods)[0] for i in range(4000)]
    counts = [firsts.count(pod) for pod in pods]
    assert max(counts) < 1.2 * 500 and min(counts) > 0.8 * 500


def test_ranking_cache_is_bounded_and_invalidated() -> None:
    rankings = RendezvousRankings(max_entries=16)
    rankings.set_pods(["b", "a"])
    assert rankings.pods == ("a", "b")
    first = rankings.rank("k")
    assert rankings.rank("k") is first
    for i in range(40):
        rankings.rank(f"x{i}")
    assert len(rankings._cache) == 16
    rankings.set_pods(["a", "b", "c"])
    assert set(rankings.rank("k")) == {"a", "b", "c"}
