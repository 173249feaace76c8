"""Fleet bookkeeping: outcomes, pod changes, errors, metrics staleness, prewarming, snapshots."""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import TYPE_CHECKING

import pytest
from trtfleet_router.routing import (
    AdapterTooLarge,
    CachesBusy,
    Decision,
    Fleet,
    NoCapacity,
    Outcome,
    PodInfo,
    PodMetrics,
    RouteRequest,
    RoutingError,
    UnknownPod,
    parse_routing_config,
    policy_names,
)
from trtfleet_router.routing.events import EventKind, ResidencyEvent
from trtfleet_router.routing.fleetreport import PodLoadSummary
from trtfleet_router.routing.framework import Choice, RoutingContext
from trtfleet_router.routing.hashing import rendezvous_rank

if TYPE_CHECKING:
    from tests.unit.router.routing.conftest import Harness


@pytest.mark.parametrize("policy", policy_names())
def test_miss_makes_the_next_request_to_that_pod_send_weights(
    make_harness: Callable[..., Harness], policy: str
) -> None:
    h = make_harness(policy, pods=1)
    adapter = h.adapter(1)
    assert h.run(adapter).send_weights
    assert not h.route(adapter).send_weights
    decision = h.run(adapter, Outcome.MISS)  # id only, but the pod had lost it
    assert not decision.send_weights
    after = h.route(adapter)
    assert (after.pod, after.send_weights, after.warm) == ("p0", True, False)
    assert h.fleet.snapshot().misses_total == 1


def test_trtfleet_returns_to_the_same_pod_after_a_miss(make_harness: Callable[..., Harness]) -> None:
    h = make_harness("ttft-cost", pods=4)
    adapter = h.adapter(1)
    first = h.run(adapter)
    h.run(adapter, Outcome.MISS)
    again = h.route(adapter)
    assert (again.pod, again.send_weights) == (first.pod, True)


def test_miss_while_other_requests_pin_the_adapter(make_harness: Callable[..., Harness]) -> None:
    h = make_harness("ttft-cost", pods=1)
    adapter = h.adapter(1)
    _, first = h.send(adapter)
    _, second = h.send(adapter)
    h.finish(first, Outcome.MISS)
    assert h.route(adapter).send_weights  # suspect: cold for routing although still pinned
    assert 1001 in h.resident("p0")
    h.finish(second)
    assert 1001 not in h.resident("p0")
    h.fleet.check_invariants()


def test_weights_resent_clear_the_suspicion(make_harness: Callable[..., Harness]) -> None:
    h = make_harness("ttft-cost", pods=1)
    adapter = h.adapter(1)
    _, pinned = h.send(adapter)
    h.run(adapter, Outcome.MISS)
    decision, _ = h.send(adapter)
    assert decision.send_weights
    assert not h.route(adapter).send_weights
    h.finish(pinned)


@pytest.mark.parametrize("outcome", [Outcome.CACHE_FULL, Outcome.FAILED])
def test_sent_weights_that_may_not_be_stored_count_as_cold(
    make_harness: Callable[..., Harness], outcome: Outcome
) -> None:
    h = make_harness("ttft-cost", pods=1)
    adapter = h.adapter(1)
    assert h.run(adapter, outcome).send_weights
    assert h.route(adapter).send_weights
    snapshot = h.fleet.snapshot().pods[0]
    assert (snapshot.cache_full_total, snapshot.failures_total) == (
        (1, 0) if outcome is Outcome.CACHE_FULL else (0, 1)
    )


def test_failure_of_a_warm_request_keeps_residency(make_harness: Callable[..., Harness]) -> None:
    h = make_harness("ttft-cost", pods=1)
    adapter = h.adapter(1)
    h.run(adapter)
    h.run(adapter, Outcome.FAILED)
    assert not h.route(adapter).send_weights


def test_pod_restart_resets_residency_and_in_flight(make_harness: Callable[..., Harness]) -> None:
    h = make_harness("ttft-cost", pods=2)
    adapter = h.adapter(1)
    decision, ticket = h.send(adapter)
    pod = decision.pod
    h.uids[pod] = "uid-new"
    h.sync_pods()
    assert h.resident(pod) == set()
    assert h.fleet.snapshot().pods[int(pod[1])].inflight == 0
    h.finish(ticket)  # a ticket of the old incarnation releases nothing
    h.fleet.check_invariants()
    again = h.route(adapter)
    assert (again.pod, again.send_weights) == (pod, True)


def test_readiness_follows_discovery(make_harness: Callable[..., Harness]) -> None:
    h = make_harness("ttft-cost", pods=2)
    adapter = h.adapter(1)
    pod = h.run(adapter).pod
    h.sync_pods()
    assert not h.route(adapter).send_weights
    h.ready[pod] = False
    h.sync_pods()
    other = h.route(adapter)
    assert other.pod != pod and other.send_weights
    h.ready[pod] = True
    h.sync_pods()
    assert h.route(adapter).pod == pod


def test_ready_again_resets_the_shadow_like_a_restart(make_harness: Callable[..., Harness]) -> None:
    # A container restart keeps the pod's uid and IP but empties TRT-LLM's cache; it shows as
    # not ready -> ready, so that transition starts the pod's shadow afresh.
    h = make_harness("ttft-cost", pods=1)
    adapter = h.adapter(1)
    h.run(adapter)
    decision, ticket = h.send(adapter)
    assert not decision.send_weights
    pod = decision.pod
    h.ready[pod] = False
    h.sync_pods()
    assert h.resident(pod) == {adapter.task_id}  # not ready alone keeps the shadow
    h.ready[pod] = True
    h.sync_pods()
    assert h.resident(pod) == set()
    assert h.fleet.snapshot().pods[0].inflight == 0
    h.finish(ticket)  # a ticket from before the pod came back releases nothing
    h.fleet.check_invariants()
    assert h.route(adapter).send_weights


def test_removed_pod_is_dropped_and_its_tickets_finish_quietly(make_harness: Callable[..., Harness]) -> None:
    h = make_harness("ttft-cost", pods=2)
    adapter = h.adapter(1)
    decision, ticket = h.send(adapter)
    h.pod_ids.remove(decision.pod)
    h.sync_pods()
    assert [p.pod_id for p in h.fleet.snapshot().pods] == h.pod_ids
    h.finish(ticket)
    assert h.route(adapter).pod == h.pod_ids[0]
    with pytest.raises(UnknownPod):
        h.fleet.start(decision, h.request(adapter))


def test_no_capacity(make_harness: Callable[..., Harness]) -> None:
    h = make_harness("ttft-cost", pods=2, config={"noCapacityRetryAfterS": 3})
    with pytest.raises(NoCapacity) as caught:
        h.route(None, exclude=["p0", "p1"])
    assert caught.value.retry_after_s == 3
    h.ready = dict.fromkeys(h.ready, False)
    h.sync_pods()
    with pytest.raises(NoCapacity, match="no ready pod") as no_pod:
        h.route(h.adapter(1))
    assert not isinstance(no_pod.value, CachesBusy)  # nothing to wait for: 503 at once


def test_adapter_larger_than_any_cache(make_harness: Callable[..., Harness]) -> None:
    h = make_harness("ttft-cost", pods=2, host_pages=8)
    with pytest.raises(AdapterTooLarge):
        h.route(h.adapter(1, pages=9))


def test_ticket_finished_twice(make_harness: Callable[..., Harness]) -> None:
    h = make_harness("least-load", pods=1)
    _, ticket = h.send(None)
    h.finish(ticket)
    with pytest.raises(RoutingError, match="twice"):
        h.fleet.finish(ticket, Outcome.OK)


def test_scraped_metrics_go_stale(make_harness: Callable[..., Harness]) -> None:
    h = make_harness("least-load", pods=2, config={"metricsStaleAfterS": 5})
    h.fleet.observe_metrics(
        "p0", PodMetrics(active_requests=4, waiting_requests=3, kv_cache_used_fraction=0.7)
    )
    h.fleet.observe_metrics("nobody", PodMetrics(1, 1))  # unknown pods are ignored
    h.load("p1", 2)
    assert h.route(None).pod == "p1"
    pod = h.fleet.snapshot().pods[0]
    assert (pod.waiting_requests, pod.kv_cache_used_fraction) == (3, 0.7)
    h.now_s += 5.01
    assert h.route(None).pod == "p0"
    pod = h.fleet.snapshot().pods[0]
    assert (pod.waiting_requests, pod.kv_cache_used_fraction) == (None, None)


def test_pod_load_sums_the_fresh_readings_of_ready_pods(make_harness: Callable[..., Harness]) -> None:
    """What the router exports for the operator: fresh readings of ready pods only, KV averaged where known."""
    h = make_harness("least-load", pods=4, config={"metricsStaleAfterS": 5})
    assert h.fleet.pod_load() == PodLoadSummary(0, 0, None)
    h.fleet.observe_metrics("p0", PodMetrics(2, 1, kv_cache_used_fraction=0.2))
    h.fleet.observe_metrics("p1", PodMetrics(4, 0, kv_cache_used_fraction=0.6))
    h.fleet.observe_metrics("p2", PodMetrics(1, 1))  # no KV fraction exported
    h.ready["p3"] = False
    h.sync_pods()
    h.fleet.observe_metrics("p3", PodMetrics(9, 9, kv_cache_used_fraction=1.0))  # not ready: left out
    summary = h.fleet.pod_load()
    assert (summary.pods_reporting, summary.requests) == (3, 9)
    assert summary.kv_cache_used_fraction == pytest.approx(0.4)
    h.now_s += 5.01
    assert h.fleet.pod_load() == PodLoadSummary(0, 0, None)


def test_prewarm_plan_follows_the_rendezvous_ranking(make_harness: Callable[..., Harness]) -> None:
    h = make_harness("ttft-cost", pods=5, host_pages=2)
    wanted = h.adapter(1, min_pods=3)
    none = h.adapter(2)
    ranking = rendezvous_rank(wanted.name, h.pod_ids)
    assert h.fleet.prewarm_plan([wanted, none]) == [(pod, wanted) for pod in ranking[:3]]
    h.make_warm(ranking[1], wanted)
    h.pin(ranking[0], h.adapter(3))
    h.pin(ranking[0], h.adapter(4))  # ranking[0] full of busy adapters: skipped
    plan = h.fleet.prewarm_plan([wanted])
    assert plan == [(ranking[2], wanted), (ranking[3], wanted)]
    for pod, adapter in plan:
        h.fleet.finish(h.fleet.start(h.fleet.prewarm_decision(pod), h.request(adapter)), Outcome.OK)
    assert h.fleet.prewarm_plan([wanted]) == []


def test_warm_start_plan_gives_new_pods_the_hottest_adapters_that_fit(make_harness: Callable[..., Harness]) -> None:
    h = make_harness("ttft-cost", pods=3, host_pages=4, device_pages=4)
    hot, warm_already, big, cold = h.adapter(1), h.adapter(2), h.adapter(3, pages=2), h.adapter(4)
    h.make_warm("p1", warm_already)
    h.ready["p2"] = False
    h.sync_pods()
    # p1: hot, skip the warm one, big (2 pages) -> 4 device pages used, cold does not fit; p2 not ready; p9 unknown
    plan = h.fleet.warm_start_plan(["p1", "p2", "p9"], [hot, warm_already, big, cold])
    assert plan == [("p1", hot), ("p1", big)]
    h.pin("p0", h.adapter(5, pages=4))  # p0's cache full of a busy adapter: nothing can be stored there
    assert h.fleet.warm_start_plan(["p0"], [hot]) == []
    for pod, adapter in plan:
        h.fleet.finish(h.fleet.start(h.fleet.prewarm_decision(pod), h.request(adapter)), Outcome.OK)
    assert h.fleet.warm_start_plan(["p1"], [hot, warm_already, big]) == []


def test_snapshot_counts(make_harness: Callable[..., Harness]) -> None:
    h = make_harness("ttft-cost", pods=1, host_pages=2)
    a, b, c = h.adapter(1), h.adapter(2), h.adapter(3)
    for adapter in (a, a, b, c):
        h.run(adapter)
    snapshot = h.fleet.snapshot()
    pod = snapshot.pods[0]
    assert (snapshot.policy, snapshot.model, snapshot.open_tickets) == ("ttft-cost", "m", 0)
    assert (pod.cold_loads_total, pod.warm_routes_total, pod.evictions_total) == (3, 1, 1)
    assert pod.resident_task_ids == (b.task_id, c.task_id)
    assert (pod.host_pages_used, pod.host_pages) == (2, 2)
    assert (snapshot.cold_loads_total, snapshot.warm_routes_total) == (3, 1)


class RecordingPolicy:
    """A fake implementing the Policy protocol: always the first candidate; records pod changes."""

    name = "recording"

    def __init__(self) -> None:
        self.changes: list[list[str]] = []

    def choose(self, ctx: RoutingContext) -> Choice:
        return Choice(ctx.pods[0], "first")

    def pods_changed(self, pod_ids: Sequence[str]) -> None:
        self.changes.append(list(pod_ids))


def test_policies_hear_only_real_pod_set_changes() -> None:
    policy = RecordingPolicy()
    fleet = Fleet(policy, now=lambda: 0.0, rng=random.Random(0), config=parse_routing_config(None))
    pods = {name: PodInfo(name, "x:1", "u", 4, 2) for name in ("b", "a")}
    fleet.set_pods(pods)
    fleet.set_pods({**pods, "a": PodInfo("a", "x:2", "u2", 4, 2, ready=False)})  # restart + readiness only
    fleet.set_pods({"a": pods["a"]})
    assert policy.changes == [["a", "b"], ["a"]]
    assert fleet.route(RouteRequest("m", None, 1, 1)) == Decision("a", False, True, "recording", "first")
    with pytest.raises(RoutingError, match="calls itself"):
        fleet.set_pods({"c": pods["a"]})
    assert [p.pod_id for p in fleet.snapshot().pods] == ["a"]  # nothing changed


def test_weights_in_transit_until_the_pod_admits_the_request(make_harness: Callable[..., Harness]) -> None:
    # adapter-affinity stays on the loading pod; the priced default may send the next request elsewhere
    h = make_harness("adapter-affinity", pods=2)
    adapter = h.adapter(1)
    first, ticket = h.send(adapter)
    assert first.send_weights and not first.loading
    during = h.route(adapter)
    assert (during.pod, during.send_weights, during.warm, during.loading) == (first.pod, False, True, True)
    h.fleet.confirm(ticket)
    h.fleet.confirm(ticket)  # idempotent
    after = h.route(adapter)
    assert (after.pod, after.send_weights, after.loading) == (first.pod, False, False)
    h.fleet.check_invariants()


def test_an_overtaken_load_makes_the_next_request_carry_weights(make_harness: Callable[..., Harness]) -> None:
    h = make_harness("adapter-affinity", pods=2)
    adapter = h.adapter(1)
    first, _loading = h.send(adapter)
    overtaking = h.run(adapter, Outcome.MISS)  # id-only, arrived before the weights
    assert (overtaking.pod, overtaking.loading) == (first.pod, True)
    retry = h.route(adapter)
    assert (retry.pod, retry.send_weights) == (first.pod, True)


def test_finish_ends_an_unconfirmed_load_and_restarts_forget_it(make_harness: Callable[..., Harness]) -> None:
    h = make_harness("ttft-cost", pods=2)
    adapter = h.adapter(1)
    first, ticket = h.send(adapter)
    h.finish(ticket)
    assert not h.route(adapter).loading
    second, ticket = h.send(h.adapter(2))
    h.uids[second.pod] = "new"
    h.sync_pods()
    h.fleet.confirm(ticket)  # a load on the old incarnation: nothing to end
    h.fleet.check_invariants()


@pytest.mark.parametrize("policy", ["ttft-cost", "adapter-affinity"])
def test_batch_lines_do_not_push_interactive_requests_off_their_warm_pod(
    make_harness: Callable[..., Harness], policy: str
) -> None:
    """Batch lines leave interactive room on a pod (the dispatcher's batch slots), so an interactive request is
    routed as if they were not there; a batch line still sees them, and the books count them apart."""
    h = make_harness(policy, pods=2)
    adapter = h.adapter(1)
    for pod in ("p0", "p1"):  # equal load everywhere, so no policy's spreading decides on its own
        h.load(pod, 6, background=True)
    h.make_warm("p0", adapter)
    interactive = h.fleet.route(h.request(adapter))
    assert (interactive.pod, interactive.send_weights) == ("p0", False)
    assert [p.inflight for p in h.fleet.snapshot().pods] == [6, 6]
    h.fleet.check_invariants()


def test_interactive_load_still_spills_and_batch_lines_count_their_own(
    make_harness: Callable[..., Harness],
) -> None:
    """What the rule leaves alone: interactive requests in flight still make a warm pod busy, and a batch line
    compares every request in flight (its own class included)."""
    h = make_harness("ttft-cost", pods=2)
    adapter = h.adapter(1)
    h.make_warm("p0", adapter)
    h.load("p0", 6, background=True)
    batch = h.fleet.route(replace(h.request(adapter), background=True))
    interactive = h.fleet.route(h.request(adapter))
    assert (batch.pod, batch.reason) == ("p1", "spill")
    assert (interactive.pod, interactive.reason) == ("p0", "warm")
    h.load("p0", 6)  # interactive requests this time
    assert h.fleet.route(h.request(adapter)).pod == "p1"


def test_a_batch_line_books_no_queued_prefill(make_harness: Callable[..., Harness]) -> None:
    """A batch line is not streamed: its first answer is its last, so its prefill would count as queued on the
    pod for as long as it decodes, and price every interactive request there too high."""
    h = make_harness("ttft-cost", pods=1)
    h.load("p0", 2, background=True)
    assert h.fleet.prefix_index.pending_prefill_tokens("p0") == 0
    h.load("p0", 1)
    assert h.fleet.prefix_index.pending_prefill_tokens("p0") == 16  # the harness's prompt


@pytest.mark.parametrize(
    ("per_pod", "free", "full"),
    [
        (2, 2, {"p0", "p1"}),  # p0 its own 2, p1 1 + another replica's 1: full; p2 has room for 2
        (1, 1, {"p0", "p1"}),
        (2.5, 5, set()),  # a fraction rounds up: 3 each, so 1 + 1 + 3
        (3, 5, set()),
    ],
)
def test_room_counts_every_replicas_requests_on_the_ready_pods(
    make_harness: Callable[..., Harness], per_pod: float, free: int, full: set[str]
) -> None:
    h = make_harness("ttft-cost", pods=4)
    h.load("p0", 2)
    h.load("p1", 1)
    assert h.fleet.apply_remote(ResidencyEvent("r1", 1, "m", "p1", "uid-p1", EventKind.ACQUIRE, 7))
    h.load("p3", 4)
    h.ready["p3"] = False  # its requests and its room count for nothing: no request goes there
    h.sync_pods()
    assert h.fleet.room(per_pod) == (free, frozenset(full))
