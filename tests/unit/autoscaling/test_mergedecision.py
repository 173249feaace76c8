"""The merge-or-hot-swap decision (pure): smoothing, the hysteresis band, the sustain window, and what is
Unknown. Rates and thresholds are chosen so every comparison is far from its edge in float64."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from trtfleet.api import Suggestion
from trtfleet.mergedecision import Costs, Memory, Reason, decide, economics, smooth

COSTS = Costs(pod_requests_per_s=10.0, lora_step_overhead=0.1, merge_above=0.5, unmerge_below=0.25, sustain_s=600)


@dataclass(frozen=True)
class Case:
    memory: Memory
    rate: float | None
    now_s: float
    suggestion: Suggestion
    reason: Reason
    decided: Suggestion | None
    crossing_since_s: float | None = None
    costs: Costs = COSTS


def steady(rate: float, decided: Suggestion | None, *, since: float = 0.0, crossing: float | None = None) -> Memory:
    """A memory whose smoothed rate already is ``rate`` (sampled at t=1000, observed since ``since``)."""
    return Memory(rate, 1000.0, since, crossing, decided)


CASES = [
    pytest.param(Case(Memory(), 8.0, 0.0, Suggestion.UNKNOWN, Reason.INSUFFICIENT_DATA, None, 0.0),
                 id="first-reading-is-not-enough"),
    pytest.param(Case(steady(8.0, None, crossing=0.0), 8.0, 1000.0, Suggestion.MERGED, Reason.MERGE_PAYS,
                      Suggestion.MERGED),
                 id="busy-for-the-whole-window-merges"),
    pytest.param(Case(steady(1.0, None), 1.0, 1000.0, Suggestion.DYNAMIC, Reason.SHARED_POOL_CHEAPER,
                      Suggestion.DYNAMIC), id="quiet-after-the-window-stays-dynamic"),
    pytest.param(Case(steady(8.0, Suggestion.DYNAMIC), 8.0, 1000.0, Suggestion.DYNAMIC, Reason.CROSSING,
                      Suggestion.DYNAMIC, 1000.0), id="crossing-starts-the-clock"),
    pytest.param(Case(steady(8.0, Suggestion.DYNAMIC, crossing=500.0), 8.0, 1000.0, Suggestion.DYNAMIC,
                      Reason.CROSSING, Suggestion.DYNAMIC, 500.0), id="crossing-not-long-enough"),
    pytest.param(Case(steady(8.0, Suggestion.DYNAMIC, crossing=300.0), 8.0, 1000.0, Suggestion.MERGED,
                      Reason.MERGE_PAYS, Suggestion.MERGED), id="crossing-held-for-the-window"),
    pytest.param(Case(steady(3.5, Suggestion.MERGED, crossing=100.0), 3.5, 1000.0, Suggestion.MERGED,
                      Reason.MERGE_PAYS, Suggestion.MERGED), id="inside-the-band-merged-stays-and-clock-resets"),
    pytest.param(Case(steady(3.5, Suggestion.DYNAMIC, crossing=100.0), 3.5, 1000.0, Suggestion.DYNAMIC,
                      Reason.SHARED_POOL_CHEAPER, Suggestion.DYNAMIC), id="inside-the-band-dynamic-stays"),
    pytest.param(Case(steady(1.0, Suggestion.MERGED, crossing=900.0), 1.0, 1000.0, Suggestion.MERGED,
                      Reason.CROSSING, Suggestion.MERGED, 900.0), id="below-the-band-not-long-enough"),
    pytest.param(Case(steady(1.0, Suggestion.MERGED, crossing=0.0), 1.0, 1000.0, Suggestion.DYNAMIC,
                      Reason.SHARED_POOL_CHEAPER, Suggestion.DYNAMIC), id="below-the-band-for-the-window"),
    pytest.param(Case(steady(8.0, Suggestion.MERGED), None, 1000.0, Suggestion.UNKNOWN, Reason.NO_DEMAND_SIGNAL,
                      Suggestion.MERGED), id="no-router-keeps-the-memory"),
    pytest.param(Case(steady(8.0, None), 8.0, 1000.0, Suggestion.UNKNOWN, Reason.NO_POD_CAPACITY, None,
                      costs=Costs(pod_requests_per_s=None)), id="no-pod-capacity"),
    pytest.param(Case(Memory(), 8.0, 0.0, Suggestion.MERGED, Reason.MERGE_PAYS, Suggestion.MERGED,
                      costs=Costs(pod_requests_per_s=10.0, sustain_s=0)), id="no-window-decides-at-once"),
]


@pytest.mark.parametrize("case", CASES)
def test_decide(case: Case) -> None:
    advice = decide(case.costs, case.memory, case.rate, case.now_s)
    assert (advice.suggestion, advice.reason) == (case.suggestion, case.reason), advice.message
    assert advice.memory.decided == case.decided
    assert advice.memory.crossing_since_s == case.crossing_since_s
    if case.rate is None:
        assert advice.memory == case.memory
    elif case.costs.pod_requests_per_s is not None:
        assert advice.pod_fraction == pytest.approx(case.rate / case.costs.pod_requests_per_s)


def test_a_burst_is_not_a_sustained_share() -> None:
    """One busy reading (5 pods' worth) 15 s after a quiet stretch moves the average by a fraction of its
    height: it does not even start the clock, and the next quiet reading takes it back down."""
    memory = steady(1.0, Suggestion.DYNAMIC)
    burst = decide(COSTS, memory, 50.0, 1015.0)
    assert burst.suggestion is Suggestion.DYNAMIC and burst.memory.crossing_since_s is None
    assert burst.pod_fraction is not None and 0.1 < burst.pod_fraction < COSTS.merge_above
    quiet = decide(COSTS, burst.memory, 1.0, 1075.0)
    assert quiet.pod_fraction is not None and quiet.pod_fraction < burst.pod_fraction


@pytest.mark.parametrize(
    ("previous", "at", "sample", "now", "half_life", "want"),
    [
        pytest.param(None, None, 4.0, 10.0, 60.0, 4.0, id="first"),
        pytest.param(2.0, 0.0, 4.0, 60.0, 60.0, 3.0, id="one-half-life"),
        pytest.param(2.0, 0.0, 4.0, 120.0, 60.0, 3.5, id="two-half-lives"),
        pytest.param(2.0, 0.0, 4.0, 0.0, 60.0, 2.0, id="no-time"),
        pytest.param(2.0, 0.0, 4.0, 30.0, 0.0, 4.0, id="no-smoothing"),
    ],
)
def test_smooth(previous: float | None, at: float | None, sample: float, now: float, half_life: float,
                want: float) -> None:
    assert smooth(previous, at, sample, now, half_life) == pytest.approx(want)


@pytest.mark.parametrize(
    ("fraction", "overhead", "words"),
    [
        pytest.param(0.41, 0.1, ["0.45 pod", "merged 1 pod", "+0.55 pod of headroom"], id="under-a-pod"),
        pytest.param(0.95, 0.1, ["1.04 pod", "merged 1 pod", "saves 0.04 pod"], id="fills-a-pod"),
        pytest.param(1.5, 0.0, ["1.50 pod", "merged 2 pod", "+0.50 pod"], id="two-pods"),
    ],
)
def test_economics(fraction: float, overhead: float, words: list[str]) -> None:
    text = economics(fraction, overhead)
    for word in words:
        assert word in text, text
