"""Batch lines placed for the fewest adapter loads: where the adapter is warm, one adapter per pod
(``routing/batchplace.py``), under every policy the fleet may run."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

import pytest
from trtfleet_router.routing import AdapterRef, Decision, Ticket

from tests.unit.router.routing.conftest import Harness

SLOTS = 3


def _batch(h: Harness, adapter: AdapterRef | None, slots: int = SLOTS) -> tuple[Decision, Ticket]:
    """Route and start one batch line (as the dispatcher does with ``--batch-pod-slots``)."""
    request = replace(h.request(adapter), background=True, batch_slots=slots)
    decision = h.fleet.route(request)
    ticket = h.fleet.start(decision, request)
    h.open.append(ticket)
    return decision, ticket


@pytest.fixture(params=["ttft-cost", "adapter-affinity", "round-robin", "least-load"])
def policy(request: pytest.FixtureRequest) -> str:
    return str(request.param)


def test_one_adapter_fills_its_warm_pod_then_takes_the_idle_ones(
    make_harness: Callable[..., Harness], policy: str
) -> None:
    h = make_harness(policy, pods=3)
    adapter = h.adapter(1)
    h.make_warm("p1", adapter)
    decisions = [_batch(h, adapter)[0] for _ in range(SLOTS + 1)]
    assert [(d.pod, d.reason) for d in decisions[:SLOTS]] == [("p1", "batch-warm")] * SLOTS
    spread = decisions[SLOTS]
    assert (spread.reason, spread.send_weights) == ("batch-spread", True) and spread.pod != "p1"
    h.fleet.check_invariants()


def test_each_adapter_keeps_to_its_pods_and_waits_for_them(make_harness: Callable[..., Harness], policy: str) -> None:
    """Two adapters' lines on three pods: each gets pods of its own; once every pod runs one of them, a line
    waits for its adapter's pod (the lane holds it) instead of loading the adapter on the other's pod."""
    h = make_harness(policy, pods=3)
    a, b = h.adapter(1), h.adapter(2)
    first_a, _ = _batch(h, a)
    first_b, _ = _batch(h, b)
    assert first_a.pod != first_b.pod and first_a.reason == first_b.reason == "batch-spread"
    for _ in range(SLOTS - 1):
        assert _batch(h, b)[0].pod == first_b.pod
    third = next(p for p in h.pod_ids if p not in (first_a.pod, first_b.pod))
    assert _batch(h, b)[0] == Decision(third, True, False, h.fleet.policy_name, "batch-spread")
    for _ in range(SLOTS - 1):
        _batch(h, b)
    waiting = _batch(h, b)[0]  # both of b's pods full, a's pod runs a: wait for b's least loaded pod
    assert (waiting.reason, waiting.send_weights) == ("batch-wait", False)
    assert waiting.pod in (first_b.pod, third)
    loads = {pod.pod_id: pod.inflight for pod in h.fleet.snapshot().pods}
    assert loads[first_a.pod] == 1  # a's pod never got b's lines
    h.fleet.check_invariants()


def test_a_new_adapter_goes_where_the_fewest_other_batch_lines_run(make_harness: Callable[..., Harness]) -> None:
    h = make_harness("ttft-cost", pods=2)
    a, b, c = h.adapter(1), h.adapter(2), h.adapter(3)
    for _ in range(SLOTS):
        h.force("p0", a, background=True)
    h.force("p1", b, background=True)
    decision, _ = _batch(h, c)
    assert (decision.pod, decision.reason, decision.send_weights) == ("p1", "batch-cold", True)
    h.fleet.check_invariants()


def test_interactive_requests_and_base_model_lines_are_routed_by_the_policy(
    make_harness: Callable[..., Harness],
) -> None:
    h = make_harness("ttft-cost", pods=2)
    adapter = h.adapter(1)
    _batch(h, adapter)
    assert h.route(adapter).reason not in ("batch-warm", "batch-spread", "batch-wait", "batch-cold")
    base, _ = _batch(h, None)
    assert base.reason == "base-priced"
    snapshot = h.fleet.snapshot()
    assert sum(p.inflight for p in snapshot.pods) == 2
    h.fleet.check_invariants()


def test_no_pod_can_store_it_falls_back_to_the_policy(make_harness: Callable[..., Harness]) -> None:
    """Every page pinned by interactive requests: placement has no candidate and the policy answers (busy)."""
    from trtfleet_router.routing import CachesBusy

    h = make_harness("ttft-cost", pods=1, host_pages=1, device_pages=1)
    h.pin("p0", h.adapter(1))
    with pytest.raises(CachesBusy):
        _batch(h, h.adapter(2))
