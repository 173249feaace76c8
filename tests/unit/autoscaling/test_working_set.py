"""The adapter working set: demand-weighted pages (pure), and the router's window that feeds it."""

from __future__ import annotations

import math
from dataclasses import dataclass

import pytest
from trtfleet_router.activity import ActiveAdapters, AdapterActivity

from trtfleet.autoscaling import working_set_pages


@dataclass(frozen=True)
class Case:
    id: str
    demand: list[tuple[int, int]]
    in_flight: float
    want: int


def _long_tail(adapters: int, requests: int) -> list[tuple[int, int]]:
    """``adapters`` adapters seen once each plus one hot adapter with ``requests`` requests, one page each."""
    return [(1, 1)] * adapters + [(requests, 1)]


CASES = [
    Case("nothing-in-flight", [(10, 1), (5, 2)], 0, 0),
    Case("no-demand", [], 10, 0),
    Case("zero-counts-ignored", [(0, 8)], 10, 0),
    Case("one-adapter-whole", [(100, 8)], 3, 8),
    Case("hot-adapters-count-whole", [(1000, 4), (1000, 4)], 200, 8),
    # 1,000 adapters seen once, one with 1,000 requests; 20 in flight: ~10 from the tail, 1 hot page
    Case("long-tail-counts-in-flight-share", _long_tail(1000, 1000), 20, math.ceil(1 + 1000 * -math.expm1(-0.01))),
    # the old rule counted every adapter seen: 1,001 pages; never more than the in-flight requests' pages
    Case("bounded-by-in-flight", _long_tail(1000, 1000), 4, math.ceil(-math.expm1(-2) + 1000 * -math.expm1(-0.002))),
]


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.id)
def test_working_set_pages(case: Case) -> None:
    assert working_set_pages(case.demand, case.in_flight) == case.want


def test_pages_never_exceed_in_flight_requests_pages_nor_the_adapters_seen() -> None:
    demand = [(count, 2) for count in range(1, 300)]
    for in_flight in (1, 10, 100, 10_000):
        pages = working_set_pages(demand, in_flight)
        assert pages <= min(2 * in_flight, 2 * len(demand))


class Clock:
    def __init__(self) -> None:
        self.now_s = 0.0

    def __call__(self) -> float:
        return self.now_s


def test_router_window_weights_by_demand_and_forgets_old_arrivals() -> None:
    clock = Clock()
    activity = AdapterActivity(60.0, now=clock)
    for _ in range(50):
        activity.record("base", "hot", 4)
    for index in range(200):
        activity.record("base", f"tail{index}", 1)
        activity.finished("base")
    assert activity.in_flight("base") == 50
    active = activity.active("base")
    assert active.count == 201
    # 50 in flight of 250 in the window: the hot adapter whole (4), each tail adapter 1 - e^-0.2
    assert active.pages == math.ceil(4 * -math.expm1(-40) + 200 * -math.expm1(-0.2))
    assert active.pages < 201 + 3  # the old rule: every adapter seen counted whole
    clock.now_s = 61.0
    assert activity.active("base") == ActiveAdapters(0, 0)
    for _ in range(50):
        activity.finished("base")
    assert activity.in_flight("base") == 0
    assert activity.base_models() == ["base"]
