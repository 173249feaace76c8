"""Pods kept free of batch lines while interactive requests come (``routing/reserve.py``), under the policies a
fleet may run: which pods, when the reserve holds, where batch lines and interactive requests go."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import replace

import pytest
from trtfleet_router.routing import AdapterRef, Decision, RouteRequest, Ticket
from trtfleet_router.routing.config import RESERVE_BUSY_SHARE, RESERVE_HOLD_S, ReserveConfig
from trtfleet_router.routing.hashing import RendezvousRankings
from trtfleet_router.routing.reserve import (
    RESERVE_AUTO,
    RESERVE_SAMPLES,
    InteractiveReserve,
    hidden_pods,
    pods_for_load,
    reserved_pods,
)

from tests.unit.router.routing.conftest import Harness

SLOTS = 3


def _rankings(pods: list[str]) -> RendezvousRankings:
    rankings = RendezvousRankings(16)
    rankings.set_pods(pods)
    return rankings


def _batch(h: Harness, adapter: AdapterRef | None, reserve: int = 1) -> tuple[Decision, Ticket]:
    """Route and start one batch line as the dispatcher does with ``--batch-pod-slots`` and a reserve."""
    request = replace(h.request(adapter), background=True, batch_slots=SLOTS, reserve_pods=reserve,
                      reserve_room=SLOTS)
    decision = h.fleet.route(request)
    ticket = h.fleet.start(decision, request)
    h.open.append(ticket)
    return decision, ticket


def _interactive(h: Harness, adapter: AdapterRef | None, reserve: int = 1) -> tuple[Decision, Ticket]:
    request = replace(h.request(adapter), reserve_pods=reserve, reserve_room=SLOTS)
    decision = h.fleet.route(request)
    ticket = h.fleet.start(decision, request)
    h.open.append(ticket)
    return decision, ticket


def _reserved(h: Harness, count: int = 1) -> frozenset[str]:
    return reserved_pods(_rankings(h.pod_ids), h.pod_ids, count)


@pytest.fixture(params=["ttft-cost", "adapter-affinity", "round-robin", "least-load"])
def policy(request: pytest.FixtureRequest) -> str:
    return str(request.param)


def test_the_reserved_pods_are_the_same_in_any_order_and_never_all() -> None:
    pods = [f"pod-{i}" for i in range(6)]
    chosen = reserved_pods(_rankings(pods), pods, 2)
    assert len(chosen) == 2 and chosen == reserved_pods(_rankings(list(reversed(pods))), list(reversed(pods)), 2)
    assert reserved_pods(_rankings(pods), pods, 0) == frozenset()
    assert len(reserved_pods(_rankings(pods), pods, 9)) == 5  # a batch keeps one pod
    assert reserved_pods(_rankings(pods), pods[:1], 1) == frozenset()
    # a pod that is not reserved leaving moves nothing (rendezvous order)
    other = next(p for p in pods if p not in chosen)
    fewer = [p for p in pods if p != other]
    assert reserved_pods(_rankings(fewer), fewer, 2) == chosen


def test_what_batch_lines_and_interactive_requests_do_not_see() -> None:
    ids = ["a", "b", "c"]
    reserved = frozenset({"b"})
    assert hidden_pods(ids, [5, 0, 2], reserved, True, SLOTS) == {"b"}
    assert hidden_pods(ids, [5, 0, 2], reserved, False, SLOTS) == {"a", "c"}
    # the reserved pod full: interactive requests see every pod, as without a reserve
    assert hidden_pods(ids, [5, SLOTS, 2], reserved, False, SLOTS) == frozenset()
    # only reserved pods left to a batch line (the others tried): it may use them
    assert hidden_pods(["b"], [1], reserved, True, SLOTS) == frozenset()
    assert hidden_pods(ids, [1, 1, 1], frozenset(), True, SLOTS) == frozenset()
    # the reserved pod cannot take the adapter (its cache full of busy ones): every pod
    assert hidden_pods(ids, [5, 0, 2], reserved, False, SLOTS, [True, False, True]) == frozenset()
    both = frozenset({"a", "b"})
    assert hidden_pods(ids, [0, 0, 2], both, False, SLOTS, [False, True, True]) == {"a", "c"}


def test_the_reserve_holds_after_an_interactive_request_or_while_another_replica_runs_one() -> None:
    class Load:
        remote_inflight = 0
        remote_background = 0

    class Pod:
        pod_id = "p0"
        load = Load()

    reserve = InteractiveReserve()
    pods = [Pod()]
    request = RouteRequest("m", None, 16, 16, reserve_pods=1, reserve_room=SLOTS)
    assert not reserve.holds(100.0, pods)  # type: ignore[arg-type]
    reserve.started(replace(request, background=True), False, 100.0, ())  # a batch line does not start it
    reserve.started(request, True, 100.0, ())  # nor a prewarming push
    assert not reserve.holds(100.0, pods)  # type: ignore[arg-type]
    reserve.started(request, False, 100.0, ())
    assert reserve.holds(100.0 + RESERVE_HOLD_S, pods)  # type: ignore[arg-type]
    assert not reserve.holds(100.0 + RESERVE_HOLD_S + 0.1, pods)  # type: ignore[arg-type]
    Load.remote_inflight = Load.remote_background = 2  # another replica's batch lines only
    assert not reserve.holds(200.0, pods)  # type: ignore[arg-type]
    Load.remote_inflight = 3  # and one interactive request
    assert reserve.holds(200.0, pods)  # type: ignore[arg-type]


def test_without_interactive_requests_a_batch_uses_every_pod(make_harness: Callable[..., Harness], policy: str) -> None:
    h = make_harness(policy, pods=3)
    pods = {_batch(h, h.adapter(i))[0].pod for i in range(3)}  # three adapters: one pod each
    assert pods == set(h.pod_ids)
    h.fleet.check_invariants()


def test_while_interactive_requests_come_batch_lines_keep_off_the_reserved_pod(
    make_harness: Callable[..., Harness], policy: str
) -> None:
    h = make_harness(policy, pods=3)
    (kept,) = _reserved(h)
    adapter = h.adapter(1)
    h.make_warm(kept, adapter)  # an interactive request: the reserve holds from now, and the adapter is warm there
    decisions = [_batch(h, h.adapter(i))[0] for i in range(1, 4)]
    assert kept not in {d.pod for d in decisions}
    assert decisions[0].reason == "batch-spread"  # warm only on the reserved pod: loaded elsewhere
    h.fleet.check_invariants()


def test_interactive_requests_go_to_the_reserved_pod_until_it_is_full(
    make_harness: Callable[..., Harness], policy: str
) -> None:
    h = make_harness(policy, pods=3)
    (kept,) = _reserved(h)
    adapter = h.adapter(1)
    warm_elsewhere = next(p for p in h.pod_ids if p != kept)
    h.make_warm(warm_elsewhere, adapter)  # an interactive request: the reserve holds from now
    _batch(h, h.adapter(5))  # and a batch runs
    first = [_interactive(h, adapter)[0] for _ in range(SLOTS)]
    assert {d.pod for d in first} == {kept}  # even cold there: the reserved pod starts it at once
    assert first[0].send_weights
    # the reserved pod holds SLOTS requests: the next ones go by the policy over every pod
    later = {_interactive(h, h.adapter(index))[0].pod for index in range(10, 16)}
    assert later - {kept}
    h.fleet.check_invariants()


def test_once_interactive_requests_stop_the_batch_takes_the_reserved_pod_again(
    make_harness: Callable[..., Harness],
) -> None:
    h = make_harness("ttft-cost", pods=2)
    (kept,) = _reserved(h)
    h.run(None)  # an interactive request
    assert _batch(h, h.adapter(1))[0].pod != kept
    assert _batch(h, h.adapter(2))[0].pod != kept  # waits for the other pod rather than use the reserved one
    h.now_s += RESERVE_HOLD_S + 1
    assert _batch(h, h.adapter(3))[0].pod == kept
    h.fleet.check_invariants()


def test_no_reserve_asked_routes_as_before(make_harness: Callable[..., Harness]) -> None:
    h = make_harness("ttft-cost", pods=3)
    h.run(None)
    pods = {_batch(h, h.adapter(i), reserve=0)[0].pod for i in range(3)}
    assert pods == set(h.pod_ids)
    h.fleet.check_invariants()


def test_with_no_batch_line_in_flight_interactive_requests_use_every_pod(make_harness: Callable[..., Harness]) -> None:
    h = make_harness("ttft-cost", pods=3)
    (kept,) = _reserved(h)
    adapter = h.adapter(1)
    warm_elsewhere = next(p for p in h.pod_ids if p != kept)
    h.make_warm(warm_elsewhere, adapter)  # the reserve holds, but no batch runs
    assert _interactive(h, adapter)[0].pod == warm_elsewhere  # the policy's warm pod, not the reserved one
    _, line = _batch(h, h.adapter(5))
    assert _interactive(h, adapter)[0].pod == kept
    h.finish(line)
    assert _interactive(h, adapter)[0].pod == warm_elsewhere
    h.fleet.check_invariants()


def test_a_reserved_pod_whose_cache_is_full_of_busy_adapters_sends_interactive_requests_elsewhere(
    make_harness: Callable[..., Harness],
) -> None:
    h = make_harness("ttft-cost", pods=3, host_pages=2)
    (kept,) = _reserved(h)
    for index in (7, 8):  # both pages of the reserved pod pinned by interactive requests in flight
        h.pin(kept, h.adapter(index))
    _batch(h, h.adapter(5))
    decision, _ = _interactive(h, h.adapter(1))  # cold, and the reserved pod cannot store it now
    assert decision.pod != kept
    h.fleet.check_invariants()


def test_prewarming_pushes_do_not_hold_the_reserve(make_harness: Callable[..., Harness]) -> None:
    h = make_harness("ttft-cost", pods=3)
    request = h.request(h.adapter(1))
    h.open.append(h.fleet.start(h.fleet.prewarm_decision("p0"), request))
    assert h.fleet.reserved_now(1) == frozenset()
    h.run(None)  # an interactive request
    assert len(h.fleet.reserved_now(1)) == 1
    h.fleet.check_invariants()


def test_an_auto_reserve_is_sized_from_the_interactive_requests_in_flight(make_harness: Callable[..., Harness]) -> None:
    """Each interactive request samples what it finds in flight (batch lines left out); the reserve holds the
    fewest pods that a Poisson count of that mean fills at most 1 % of the time, at least one, at most all but
    one."""
    h = make_harness("ttft-cost", pods=4)
    _batch(h, h.adapter(5), reserve=RESERVE_AUTO)  # batch lines are not interactive load
    assert h.fleet.reserved_now(RESERVE_AUTO) == frozenset()  # no interactive request yet: it does not hold
    _, ticket = _interactive(h, None, reserve=RESERVE_AUTO)  # it found none in flight
    assert len(h.fleet.reserved_now(RESERVE_AUTO)) == 1  # at least one
    for _ in range(RESERVE_SAMPLES):  # each one finds exactly one other in flight (the first)
        _, other = _interactive(h, None, reserve=RESERVE_AUTO)
        h.finish(other)
    # mean found: about 0.97 (a running mean over at most 32 samples, the first one 0) -> 5 pods (P(N >= 5) is
    # 0.3 %, P(N >= 4) 1.7 %), capped at all but one of four
    assert len(h.fleet.reserved_now(RESERVE_AUTO)) == 3
    h.finish(ticket)
    for _ in range(8 * RESERVE_SAMPLES):  # then they come one at a time: the mean decays towards 0
        h.finish(_interactive(h, None, reserve=RESERVE_AUTO)[1])
    # 0.97 x (31/32)^256 is 0.0003, under the 0.01 that two pods need (P(N >= 1) = 1 - exp(-mean))
    assert len(h.fleet.reserved_now(RESERVE_AUTO)) == 1
    h.fleet.check_invariants()


def test_the_routing_files_batch_reserve_sets_the_hold_and_the_auto_share(
    make_harness: Callable[..., Harness],
) -> None:
    """``batchReserve: {holdS, busyShare}`` replaces the 30 s and the 1 %: the same load as above (a mean of about
    0.97 found in flight) reserves 2 pods at a 30 % share (P(N >= 2) = 25 %, P(N >= 1) = 62 %), not 5; and the
    reserve lets go 5 s after the last interactive request."""
    h = make_harness("ttft-cost", pods=6, config={"batchReserve": {"holdS": 5, "busyShare": 0.3}})
    _batch(h, h.adapter(5), reserve=RESERVE_AUTO)
    _, ticket = _interactive(h, None, reserve=RESERVE_AUTO)
    for _ in range(RESERVE_SAMPLES):
        _, other = _interactive(h, None, reserve=RESERVE_AUTO)
        h.finish(other)
    h.finish(ticket)
    assert len(h.fleet.reserved_now(RESERVE_AUTO)) == 2
    h.now_s += 5.0
    assert len(h.fleet.reserved_now(RESERVE_AUTO)) == 2
    h.now_s += 0.1
    assert h.fleet.reserved_now(RESERVE_AUTO) == frozenset()
    h.fleet.check_invariants()


def test_the_batch_reserve_settings_are_validated() -> None:
    from trtfleet_router.routing.policies import parse_routing_config
    from trtfleet_router.routing.types import RoutingConfigError

    defaults = ReserveConfig(hold_s=RESERVE_HOLD_S, busy_share=RESERVE_BUSY_SHARE)
    assert parse_routing_config(None).batch_reserve == defaults
    for bad in ({"busyShare": 0}, {"busyShare": 1.0}, {"holdS": -1}, {"hold": 5}):
        with pytest.raises(RoutingConfigError, match="batchReserve"):
            parse_routing_config({"batchReserve": bad})


@pytest.mark.parametrize(
    ("mean", "pods"),
    [
        (0.0, 1),  # no load: one pod
        (0.1, 2),  # P(N >= 1) = 9.5 %, P(N >= 2) = 0.47 %
        (0.68, 4),  # the reference batch bench's load (2 req/s x 0.34 s): 14.9 %, 3.2 %, then 0.52 %
        (3.0, 9),  # P(N >= 8) = 1.2 %, P(N >= 9) = 0.38 %
    ],
)
def test_the_auto_reserve_is_the_fewest_pods_a_poisson_load_fills_at_most_one_percent_of_the_time(
    mean: float, pods: int
) -> None:
    assert pods_for_load(mean) == pods
    tail = 1.0 - sum(math.exp(-mean) * mean**k / math.factorial(k) for k in range(pods))  # P(N >= pods)
    assert tail <= RESERVE_BUSY_SHARE
    if pods > 1:
        assert tail + math.exp(-mean) * mean ** (pods - 1) / math.factorial(pods - 1) > RESERVE_BUSY_SHARE


def test_the_auto_reserve_stops_at_its_limit_under_any_load() -> None:
    assert pods_for_load(2000.0, limit=64) == 64  # exp(-2000) is 0.0 in floats: the limit ends the search
    assert pods_for_load(0.68, share=0.2) == 2
    assert pods_for_load(-1.0) == 1
