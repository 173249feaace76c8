"""The fleet's placement (routing/placer.py through Fleet): plans from demand, paced prefetches that leave the
shadow holding the planned copies, first requests that find them, prefetches that are not demand."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from trtfleet_router.routing import Fleet, Outcome, PodMetrics, RouteRequest

if TYPE_CHECKING:
    from tests.unit.router.routing.conftest import Harness

PLACEMENT = {"placement": {"enabled": True, "minHostCopies": 1, "prefetch": {"maxInflightPerPod": 1}}}


def push_all(h: Harness) -> list[tuple[str, int]]:
    """Push every due prefetch the way the router's loop does (start, confirm, finish, ended) until none is due."""
    pushed: list[tuple[str, int]] = []
    while due := h.fleet.prefetch_due():
        for pod, adapter in due:
            request = RouteRequest("m", adapter, 3, 1)
            ticket = h.fleet.start(Fleet.prefetch_decision(pod), request)
            h.fleet.confirm(ticket)
            h.fleet.finish(ticket, Outcome.OK)
            h.fleet.prefetch_ended(pod)
            pushed.append((pod, adapter.task_id))
    return pushed


def test_planned_copies_are_prefetched_and_the_first_request_finds_one(make_harness: Callable[..., Harness]) -> None:
    h = make_harness("tiered-cost", pods=4, host_pages=8, config=PLACEMENT)
    adapters = [h.adapter(i) for i in range(6)]
    plan = h.fleet.replan(adapters)
    assert plan.copies() == 6 and all(len(plan.pods_of(a.task_id)) == 1 for a in adapters)
    pushed = push_all(h)
    assert sorted(pushed) == sorted((plan.pods_of(a.task_id)[0], a.task_id) for a in adapters)
    for adapter in adapters:  # before any request: resident where planned
        assert h.fleet.is_warm(plan.pods_of(adapter.task_id)[0], adapter.task_id)
    first = h.run(adapters[3])
    assert first.warm and first.pod == plan.pods_of(adapters[3].task_id)[0]
    assert h.fleet.placer.pacer.inflight_total() == 0


def test_prefetches_are_not_demand_and_requests_are(make_harness: Callable[..., Harness]) -> None:
    h = make_harness("tiered-cost", pods=4, config=PLACEMENT)
    adapters = [h.adapter(i) for i in range(3)]
    h.fleet.replan(adapters)
    push_all(h)
    forecast = h.fleet.placer.forecast
    assert all(forecast.rate(a.task_id, h.now_s) == 0.0 for a in adapters)
    assert h.fleet.activity() == {}  # nor demand the autoscaler reads
    for _ in range(20):
        h.run(adapters[0])
    assert forecast.recent_rate(adapters[0].task_id, h.now_s) > 0
    # demand enough for more copies: the next plan spreads it (one copy per 2 req/s, 20 requests ~ 0.23 req/s: 1)
    h.now_s += 0.5
    for _ in range(400):
        h.run(adapters[0])
    assert len(h.fleet.replan(adapters).pods_of(adapters[0].task_id)) > 1


def test_busy_pods_get_no_prefetch(make_harness: Callable[..., Harness]) -> None:
    h = make_harness("tiered-cost", pods=2, config=PLACEMENT)
    adapters = [h.adapter(i) for i in range(10)]
    plan = h.fleet.replan(adapters)
    busy = h.pod_ids[0]
    h.fleet.observe_metrics(busy, PodMetrics(active_requests=4, waiting_requests=2))
    due = h.fleet.prefetch_due()
    assert due and all(pod != busy for pod, _ in due)
    assert any(busy in plan.pods_of(a.task_id) for a in adapters)  # it has planned copies, waiting for idleness
    for pod, _adapter in due:
        h.fleet.prefetch_ended(pod)


def test_placement_is_off_by_default(make_harness: Callable[..., Harness]) -> None:
    h = make_harness("ttft-cost", pods=2)
    assert not h.fleet.placer.enabled
    assert h.fleet.placement.copies() == 0
