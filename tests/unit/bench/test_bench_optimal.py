"""The offline bound: Belady with bypass is optimal (checked exhaustively) and the floor holds."""

from __future__ import annotations

import functools
import random

import pytest

from bench import optimal


def exhaustive_min_misses(adapters: list[str], slots: int) -> int:
    """Fewest misses of any demand schedule with bypass on ``slots`` uniform slots (brute force)."""

    @functools.cache
    def best(index: int, cache: frozenset[str]) -> int:
        if index == len(adapters):
            return 0
        adapter = adapters[index]
        if adapter in cache:
            return best(index + 1, cache)
        options = [best(index + 1, cache)]  # bypass
        if len(cache) < slots:
            options.append(best(index + 1, cache | {adapter}))
        for victim in cache:
            options.append(best(index + 1, (cache - {victim}) | {adapter}))
        return 1 + min(options)

    return best(0, frozenset())


@pytest.mark.parametrize(
    ("sequence", "slots", "hits"),
    [
        ("", 2, 0),
        ("aaaa", 1, 3),
        ("abab", 1, 1),  # keep a, bypass b: a-hit at 3
        ("abcabc", 2, 2),
        ("abcabc", 3, 3),
        ("abcdabcd", 0, 0),
        ("abacabad", 2, 4),  # c and d are never reused: bypassed
    ],
)
def test_hand_made_traces(sequence: str, slots: int, hits: int) -> None:
    assert optimal.belady_hits(list(sequence), slots) == hits


def test_belady_without_bypass_is_classic_min() -> None:
    # Classic MIN on 'abab' with one slot must store b and evict a: no hits.
    assert optimal.belady_hits(list("abab"), 1, bypass=False) == 0
    assert optimal.belady_hits(list("abcabc"), 2, bypass=False) == 2


@pytest.mark.parametrize("seed", range(40))
def test_belady_with_bypass_matches_exhaustive_search(seed: int) -> None:
    rng = random.Random(seed)
    length = rng.randint(1, 11)
    alphabet = "abcde"[: rng.randint(1, 5)]
    adapters = [rng.choice(alphabet) for _ in range(length)]
    slots = rng.randint(0, 3)
    misses = exhaustive_min_misses(adapters, slots)
    assert optimal.belady_hits(adapters, slots) == length - misses


@pytest.mark.parametrize("seed", range(10))
def test_bound_dominates_lru_and_respects_the_floor(seed: int) -> None:
    rng = random.Random(seed)
    adapters = [f"x{int(rng.paretovariate(1.0)) % 40}" for _ in range(2000)]
    for slots in (1, 4, 16, 64):
        bound = optimal.belady_hits(adapters, slots)
        assert bound >= optimal.lru_hits(adapters, slots)
        assert bound <= len(adapters) - len(set(adapters))
    assert optimal.belady_hits(adapters, 10_000) == len(adapters) - len(set(adapters))


def test_pooled_slots_uses_per_pod_floors_and_smallest_adapter() -> None:
    assert optimal.pooled_slots([10, 10, 7], 3) == 3 + 3 + 2
    assert optimal.pooled_slots([10], {"a": 4, "b": 2}) == 5
    with pytest.raises(ValueError):
        optimal.pooled_slots([10], 0)


def test_hit_rate_bound_summary() -> None:
    result = optimal.hit_rate_bound(list("abcabcab"), [2, 2], 2)
    assert result.capacity_slots == 2
    assert result.requests == 8 and result.compulsory_misses == 3
    assert result.hit_rate <= result.compulsory_ceiling == pytest.approx(5 / 8)
