"""Placement over both tiers (routing/placement.py): copies per adapter, stickiness, bounded moves, hot spread."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import pytest
from trtfleet_router.routing.hashing import rendezvous_rank
from trtfleet_router.routing.placement import (
    EMPTY_PLAN,
    AdapterWant,
    PlacementConfig,
    PlacementPlan,
    PodTiers,
    copy_counts,
    host_pages_needed,
    missing_copies,
    plan_placement,
)

pytestmark = pytest.mark.unit


def pods(count: int, host_pages: int = 40, device_pages: int = 4) -> list[PodTiers]:
    return [PodTiers(f"pod-{i:02d}", host_pages, device_pages) for i in range(count)]


def wants(rates: Sequence[float], pages: int = 1) -> list[AdapterWant]:
    return [AdapterWant(f"a{i:04d}", i + 1, pages, rate) for i, rate in enumerate(rates)]


def zipf(count: int, total: float) -> list[float]:
    weights = [1 / (i + 1) for i in range(count)]
    scale = total / sum(weights)
    return [w * scale for w in weights]


def ranker(pod_list: Sequence[PodTiers]) -> Callable[[str], tuple[str, ...]]:
    ids = [pod.pod_id for pod in pod_list]
    return lambda name: rendezvous_rank(name, ids)


def config(**overrides: object) -> PlacementConfig:
    return PlacementConfig.model_validate({"enabled": True, **overrides})


# -- copies per adapter -----------------------------------------------------------------------------------
@dataclass(frozen=True)
class CopiesCase:
    id: str
    rates: tuple[float, ...]
    expected: dict[int, int]
    pods: int = 8
    host_pages: int = 40
    overrides: dict[str, object] = field(default_factory=dict)
    previous: dict[int, int] = field(default_factory=dict)


COPIES = [
    # min 2 copies each, one per 2 req/s above that, at most the pod count
    CopiesCase("min-copies-for-the-unasked", (0.0, 0.0), {1: 2, 2: 2}),
    CopiesCase("one-copy-per-rate-unit", (7.0, 1.0), {1: 4, 2: 2}),
    CopiesCase("at-most-every-pod", (100.0,), {1: 8}),
    CopiesCase("max-host-copies", (100.0,), {1: 3}, overrides={"maxHostCopies": 3}),
    CopiesCase("no-min-copies", (0.0, 3.0), {2: 2}, overrides={"minHostCopies": 0}),
    # 2 pods x floor(3 x 0.8) = 4 pages for 3 adapters wanting 2 each: first copies by demand, then per copy
    CopiesCase("short-of-pages-least-wanted-left-out", (5.0, 3.0, 1.0), {1: 2, 2: 1, 3: 1}, pods=2, host_pages=3),
    # 1 pod, 2 pages for 3 adapters: the first copies by demand, then by name
    CopiesCase("short-of-pages-first-copies-by-demand", (5.0, 0.0, 0.0), {1: 1, 2: 1}, pods=1, host_pages=3),
    # a count falls by at most a quarter of its copies per plan (at least one)
    CopiesCase("shrinks-smoothly", (0.0,), {1: 6}, previous={1: 8}),
    CopiesCase("shrinks-by-one-when-small", (0.0,), {1: 2}, previous={1: 3}),
    CopiesCase("grows-at-once", (16.0,), {1: 8}, previous={1: 2}),
]


@pytest.mark.parametrize("case", COPIES, ids=[c.id for c in COPIES])
def test_copy_counts(case: CopiesCase) -> None:
    counts = copy_counts(wants(case.rates), pods(case.pods, case.host_pages), config(**case.overrides), case.previous)
    assert counts == case.expected


# -- stickiness, bounded moves, hot spread ------------------------------------------------------------------
def plan(
    pod_list: Sequence[PodTiers], want_list: Sequence[AdapterWant], conf: PlacementConfig,
    previous: PlacementPlan = EMPTY_PLAN, holds: Callable[[str, int], bool] | None = None,
) -> PlacementPlan:
    return plan_placement(want_list, pod_list, conf, ranker(pod_list), previous=previous, holds=holds)


def test_the_same_inputs_give_the_same_plan_and_a_second_plan_moves_nothing() -> None:
    fleet, demand, conf = pods(16), wants(zipf(200, 100.0)), config()
    first = plan(fleet, demand, conf)
    assert plan(fleet, demand, conf) == first  # every router replica computes the same plan
    second = plan(fleet, demand, conf, previous=first)
    assert second.host == first.host
    assert second.moves == 0


@pytest.mark.parametrize("change", [0.8, 0.95, 1.05, 1.2])
def test_small_demand_changes_keep_every_copy_where_it_is(change: float) -> None:
    fleet, conf = pods(16), config()
    rates = zipf(200, 100.0)
    first = plan(fleet, wants(rates), conf)
    jittered = [rate * (change if i % 2 else 1 / change) for i, rate in enumerate(rates)]
    second = plan(fleet, wants(jittered), conf, previous=first)
    for task_id, pods_now in second.host.items():
        before = set(first.pods_of(task_id))
        # an adapter keeps every copy it had, or all of its copies are among the ones it had
        assert before <= set(pods_now) or set(pods_now) <= before, task_id


def test_without_a_previous_plan_copies_follow_the_rendezvous_ranking() -> None:
    fleet = pods(8)
    conf = config(loadSlack=100.0)  # no load bound: pure HRW
    result = plan(fleet, wants([0.0] * 30), conf)
    rank = ranker(fleet)
    for task_id, pods_now in result.host.items():
        assert pods_now == rank(f"a{task_id - 1:04d}")[:2]


@dataclass(frozen=True)
class MovesCase:
    id: str
    max_moves: int
    held: int  # adapters already resident on their first two ranked pods (not moves)
    expected_moves: int
    expected_deferred: int


MOVES = [
    MovesCase("unbounded", 1000, 0, 60, 0),
    MovesCase("bounded", 10, 0, 10, 50),
    MovesCase("none-allowed", 0, 0, 0, 60),
    MovesCase("resident-copies-are-free", 10, 10, 10, 30),
]


@pytest.mark.parametrize("case", MOVES, ids=[c.id for c in MOVES])
def test_moves_are_bounded_and_go_to_the_most_wanted_first(case: MovesCase) -> None:
    fleet = pods(8)
    conf = config(maxMoves=case.max_moves, loadSlack=100.0)
    demand = wants([float(30 - i) / 100 for i in range(30)])  # 30 adapters, 2 copies each, hottest first
    rank = ranker(fleet)
    held = {(pod, w.task_id) for w in demand[-case.held:] if case.held for pod in rank(w.name)[:2]}
    result = plan(fleet, demand, conf, holds=lambda pod, task: (pod, task) in held)
    assert result.moves == case.expected_moves
    assert result.deferred == case.expected_deferred
    placed = [w.task_id for w in demand if result.pods_of(w.task_id)]
    moved = [t for t in placed if not any((pod, t) in held for pod in result.pods_of(t))]
    # the budget went to the hottest adapters: those that got copies are a prefix of the demand order
    assert moved == [w.task_id for w in demand if w.task_id in moved][: len(moved)]
    assert moved == [w.task_id for w in demand][: len(moved)]


def test_a_deferred_copy_is_placed_by_a_later_plan() -> None:
    fleet, demand = pods(8), wants([1.0] * 30)
    conf = config(maxMoves=20)
    first = plan(fleet, demand, conf)
    second = plan(fleet, demand, conf, previous=first)
    third = plan(fleet, demand, conf, previous=second)
    assert first.moves == second.moves == third.moves == 20
    assert third.copies() == 60 and third.deferred == 0


@pytest.mark.parametrize(("fleet_size", "hot_rate"), [(8, 40.0), (16, 100.0), (64, 110.0)])
def test_hot_adapters_spread_and_no_pod_takes_more_than_its_share(fleet_size: int, hot_rate: float) -> None:
    fleet, conf = pods(fleet_size, host_pages=100), config()
    rates = [hot_rate, hot_rate / 2, hot_rate / 3, *zipf(300, 60.0)]
    result = plan(fleet, wants(rates), conf)
    hottest = result.pods_of(1)
    assert len(hottest) == min(fleet_size, math.ceil(hot_rate / conf.copy_rate_per_s))
    mean = sum(rates) / fleet_size
    largest_share = max(rate / len(result.pods_of(i + 1)) for i, rate in enumerate(rates))
    assert max(result.pod_rate_per_s.values()) <= (1 + conf.load_slack) * mean + largest_share + 1e-9
    cap = math.floor(100 * conf.host_fill)
    assert max(result.pod_pages.values()) <= cap


def test_a_pod_leaving_moves_only_the_copies_it_held() -> None:
    fleet, demand, conf = pods(12), wants(zipf(150, 50.0)), config()
    before = plan(fleet, demand, conf)
    gone = fleet[5].pod_id
    fewer = [pod for pod in fleet if pod.pod_id != gone]
    after = plan(fewer, demand, conf, previous=before)
    for task_id, pods_before in before.host.items():
        kept = [pod for pod in pods_before if pod != gone]
        assert set(kept) <= set(after.pods_of(task_id)), task_id


def test_the_device_plan_holds_the_most_wanted_copies_of_each_pod_within_its_pages() -> None:
    fleet, conf = pods(4, host_pages=40, device_pages=3), config()
    demand = wants([20.0, 10.0, 8.0, 4.0, 2.0, 1.0, 0.5, 0.1])
    result = plan(fleet, demand, conf)
    for pod in fleet:
        planned = result.device[pod.pod_id]
        assert len(planned) <= pod.device_pages
        held = [w for w in demand if pod.pod_id in result.pods_of(w.task_id)]
        per_copy = sorted(held, key=lambda w: -w.rate_per_s / len(result.pods_of(w.task_id)))
        assert planned == {w.task_id for w in per_copy[: len(planned)]}


def test_missing_copies_come_most_wanted_first_and_skip_what_pods_hold() -> None:
    result = PlacementPlan(host={1: ("p0", "p1"), 2: ("p1",), 3: ("p0", "p2")}, device={})
    rates = {1: 4.0, 2: 3.0, 3: 10.0}
    held = {("p1", 2)}
    assert missing_copies(result, lambda pod, task: (pod, task) in held, rates) == [
        ("p0", 3), ("p2", 3), ("p0", 1), ("p1", 1),
    ]


@pytest.mark.parametrize(
    ("rates", "fleet_size", "expected"),
    [
        ((0.0,) * 64, 8, 20),  # 64 x 2 copies / 8 pods / 0.8
        ((10.0,) * 8, 4, 10),  # 5 copies wanted, at most one per pod: 8 x 4 / 4 / 0.8
        ((1000.0,), 4, 2),  # at most one copy per pod
    ],
)
def test_the_host_tier_is_sized_from_the_plan(rates: tuple[float, ...], fleet_size: int, expected: int) -> None:
    assert host_pages_needed(wants(rates), fleet_size, config()) == expected
