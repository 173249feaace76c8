"""Admission with tenants and bands, on the event loop alone: a saturated fleet queues requests in band and tenant
order, charges tenants as they are served, turns the over-share tenant away with a 429 that says so, and makes room
in a full line by pushing out the request shed first.

A real :class:`~trtfleet_router.liveview.FleetSet` of one pod (no server: nothing is sent) and the real
:class:`~trtfleet_router.upstream.admission.Admission`; requests are decided, leased and ended by hand.
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Awaitable
from typing import Any

import pytest
from trtfleet_router.discovery.static import FleetConfig, snapshot_from_config
from trtfleet_router.errors import Shed, http_headers_for, mapping_for, openai_error_body
from trtfleet_router.liveview import FleetSet
from trtfleet_router.metrics import RouterMetrics
from trtfleet_router.models_registry import Target
from trtfleet_router.routing import RoutingConfig
from trtfleet_router.routing.events import EventKind, ResidencyEvent
from trtfleet_router.routing.fairqueue import Priority
from trtfleet_router.routing.types import Decision, Outcome
from trtfleet_router.upstream.admission import Admission, Lease
from trtfleet_router.upstream.call import UpstreamCall
from trtfleet_router.upstream.payload import OpenAIPayload
from trtfleet_router.upstream.protocol import SamplingParams

FLEET = {
    "baseModels": [
        {
            "name": "tiny",
            "architecture": "reference",
            "maxInputLen": 256,
            "maxSeqLen": 512,
            "backends": [{"address": "127.0.0.1:1", "podId": "pod0"}],
        }
    ]
}


TWO_PODS = {
    "baseModels": [
        {**FLEET["baseModels"][0], "backends": [{"address": f"127.0.0.1:{port}", "podId": f"pod{port - 1}"}
                                                for port in (1, 2)]}
    ]
}


def admission_for(fleet: dict[str, Any] = FLEET, **tenancy: Any) -> Admission:
    config = RoutingConfig.model_validate({"capacityWaitS": 30, "tenancy": {"saturation": {"inflightPerPod": 1},
                                                                             **tenancy}})
    fleets = FleetSet(config, seed=0)
    fleets.apply(snapshot_from_config(FleetConfig.model_validate(fleet)))
    return Admission(fleets, RouterMetrics())


def batch_lines_elsewhere(admission: Admission, pod: str, count: int) -> None:
    """Another replica's ``count`` batch lines in flight on ``pod``: they fill it, and an interactive request's load
    comparison leaves them out, so the policy prefers that pod."""
    fleet = admission.fleets.fleet("tiny")
    uid = admission.fleets.pods["tiny"][pod].uid
    for seq in range(1, count + 1):
        assert fleet.apply_remote(ResidencyEvent("other", seq, "tiny", pod, uid, EventKind.ACQUIRE, seq,
                                                 background=True))


def call(admission: Admission, name: str, tenant: str, band: Priority = Priority.INTERACTIVE) -> UpstreamCall:
    target = Target(admission.fleets.registry.bases["tiny"], None)
    payload = OpenAIPayload(target, "p", None, SamplingParams(max_tokens=8), stream=False)
    return UpstreamCall(name, target, payload, 10, 8, deadline_s=1e12, priority=band, tenant=tenant)


async def start(admission: Admission, request: UpstreamCall) -> Lease:
    fleet = admission.fleets.fleet("tiny")
    route = admission.route_request(request)
    decision = await admission.decide(fleet, route, request.priority, None, request.deadline_s, call=request)
    return admission.lease(fleet, decision, route)


def start_on(admission: Admission, pod: str, request: UpstreamCall) -> Lease:
    """``request`` started on ``pod`` as if routed there (the test's setup, not a decision)."""
    route = admission.route_request(request)
    return admission.lease(admission.fleets.fleet("tiny"), Decision(pod, False, True, "test", "setup"), route)


async def turns(admission: Admission, tasks: dict[str, asyncio.Task[Lease]], running: Lease) -> list[str]:
    """End ``running`` and each request it let start, in turn: the order the waiting requests started in."""
    started = []
    while True:
        running.end(Outcome.OK)
        await settle()
        done = [name for name, task in tasks.items() if task.done() and name not in started]
        if not done:
            return started
        assert len(done) == 1, done  # one ended, one started: the fleet holds one request
        started += done
        running = tasks[done[0]].result()


async def settle() -> None:
    for _ in range(20):
        await asyncio.sleep(0)


def run(scenario: Awaitable[Any]) -> Any:
    return asyncio.run(asyncio.wait_for(scenario, 30))  # type: ignore[arg-type]


def test_a_saturated_fleet_starts_waiting_requests_by_band_then_least_served_tenant() -> None:
    async def scenario() -> list[str]:
        admission = admission_for()
        first = await start(admission, call(admission, "a0", "a"))
        admission.tenants.meter(call(admission, "a0", "a")).add(200)  # a's first request streams: a is charged
        tasks = {}
        for name, tenant, band in [
            ("a1", "a", Priority.INTERACTIVE),
            ("a2", "a", Priority.INTERACTIVE),
            ("s1", "c", Priority.SHEDDABLE),
            ("b1", "b", Priority.INTERACTIVE),
            ("x1", "x", Priority.CRITICAL),
        ]:
            tasks[name] = asyncio.create_task(start(admission, call(admission, name, tenant, band)))
            await settle()
        assert not any(task.done() for task in tasks.values())  # all wait: the pod holds one
        assert admission.capacity.waiting("tiny") == 5
        return await turns(admission, tasks, first)

    # critical first; b joined while a waited, so it was lifted to a's counter (no credit for having been idle): it
    # goes after a's head (a tie goes to the older) and before a's next, which a1's prompt made dearer; sheddable last
    assert run(scenario()) == ["x1", "a1", "b1", "a2", "s1"]


def test_tenants_are_charged_prompt_at_start_and_output_as_served() -> None:
    async def scenario() -> tuple[float, float]:
        admission = admission_for(tenants={"gold": {"weight": 2}})
        request = call(admission, "g", "gold")
        lease = await start(admission, request)
        admission.tenants.meter(request).add(5)
        lease.end(Outcome.OK)
        retry = await start(admission, request)  # a retry of the same call pays no prompt again
        retry.end(Outcome.OK)
        order = admission.tenants.order("tiny")
        tokens = admission.metrics.tenant_tokens
        assert (tokens.labels("tiny", "gold", "input").value, tokens.labels("tiny", "gold", "output").value) == (10, 5)
        waits = admission.metrics.queue_wait.labels("tiny", "interactive", "gold")
        return order.counters["gold"], sum(waits.counts)  # type: ignore[attr-defined]

    counter, observed = run(scenario())
    assert counter == pytest.approx((10 * 1.0 + 5 * 2.0) / 2)  # (prompt + 2 x output) / weight
    assert observed == 1


def test_the_over_share_tenant_is_turned_away_with_a_429_that_says_so() -> None:
    async def scenario() -> tuple[Shed, Shed, list[str]]:
        admission = admission_for()
        admission.capacity.max_waiting = 2
        b_earlier = call(admission, "b0", "b")
        lease = await start(admission, b_earlier)  # b was served a little before a floods
        admission.tenants.meter(b_earlier).add(2)
        lease.end(Outcome.OK)
        running = await start(admission, call(admission, "a0", "a"))
        admission.tenants.meter(call(admission, "a0", "a")).add(300)
        tasks = {name: asyncio.create_task(start(admission, call(admission, name, "a"))) for name in ("a1", "a2")}
        await settle()
        with pytest.raises(Shed) as refused:
            await start(admission, call(admission, "a3", "a"))
        tasks["b1"] = asyncio.create_task(start(admission, call(admission, "b1", "b")))  # takes a2's place
        await settle()
        with pytest.raises(Shed) as pushed:
            await tasks.pop("a2")
        return refused.value, pushed.value, await turns(admission, tasks, running)

    refused, pushed, order = run(scenario())
    assert order == ["a1", "b1"]  # b took a2's place, after a's head (b was lifted to a's counter)
    assert mapping_for(refused).http_status == 429
    body = openai_error_body(refused)["error"]
    assert body["code"] == "tenant_over_share" and body["type"] == "rate_limit_error"
    assert "tenant 'a' is over its share of base model 'tiny'" in body["message"]
    assert int(http_headers_for(refused)["Retry-After"]) >= 1
    assert pushed.code == "tenant_over_share" and "pushed out of the line" in pushed.message


def test_a_full_line_sheds_the_lowest_band_first_and_never_a_batch_line() -> None:
    async def scenario() -> tuple[Shed, list[str]]:
        admission = admission_for()
        admission.capacity.max_waiting = 1
        running = await start(admission, call(admission, "i0", "a"))
        tasks = {
            "line": asyncio.create_task(start(admission, call(admission, "line", "batch", Priority.BATCH))),
            "s1": asyncio.create_task(start(admission, call(admission, "s1", "c", Priority.SHEDDABLE))),
        }
        await settle()
        tasks["c1"] = asyncio.create_task(start(admission, call(admission, "c1", "d", Priority.CRITICAL)))
        await settle()
        with pytest.raises(Shed) as shed:
            await tasks.pop("s1")
        metrics = admission.metrics
        assert metrics.shed_requests.labels("tiny", "sheddable", "c", "priority_shed").value == 1
        return shed.value, await turns(admission, tasks, running)

    shed, order = run(scenario())
    assert shed.code == "priority_shed" and "'sheddable' are shed first" in shed.message
    assert order == ["c1", "line"]


def test_another_replicas_request_ending_starts_a_request_waiting_here() -> None:
    """The limit counts every replica's requests; when another replica's ends (its release event arrives), a request
    waiting here starts without waiting for a request of this replica to end."""

    async def scenario() -> bool:
        admission = admission_for()
        fleet = admission.fleets.fleet("tiny")
        uid = admission.fleets.pods["tiny"]["pod0"].uid
        assert fleet.apply_remote(ResidencyEvent("other", 1, "tiny", "pod0", uid, EventKind.ACQUIRE, 7))
        waiting = asyncio.create_task(start(admission, call(admission, "r1", "a")))
        await settle()
        assert not waiting.done() and admission.capacity.waiting("tiny") == 1  # the other replica's fills the pod
        assert fleet.apply_remote(ResidencyEvent("other", 2, "tiny", "pod0", uid, EventKind.RELEASE, 7))
        admission.remote_ended("tiny")  # what the peer stream calls after applying the release
        lease = await asyncio.wait_for(waiting, 5)
        lease.end(Outcome.OK)
        return True

    assert run(scenario())


def test_without_a_saturation_limit_nothing_waits() -> None:
    async def scenario() -> int:
        config = RoutingConfig()
        fleets = FleetSet(config, seed=0)
        fleets.apply(snapshot_from_config(FleetConfig.model_validate(FLEET)))
        admission = Admission(fleets, RouterMetrics())
        leases = [await start(admission, call(admission, f"r{i}", "a")) for i in range(5)]
        for lease in leases:
            lease.end(Outcome.OK)
        return len(leases)

    assert run(scenario()) == 5


def test_a_request_goes_to_a_pod_below_the_limit_never_to_a_full_one_the_policy_prefers() -> None:
    """While some ready pod holds fewer than ``inflightPerPod``, a request starts there, not on a full pod (which
    would queue it behind its batch, out of the router's order); a request waiting on a saturated fleet starts on
    the pod whose request ended."""

    async def scenario() -> tuple[str, str, str]:
        admission = admission_for(TWO_PODS, saturation={"inflightPerPod": 2})
        fleet = admission.fleets.fleet("tiny")
        batch_lines_elsewhere(admission, "pod0", 2)  # pod0 full
        held = start_on(admission, "pod1", call(admission, "r0", "a"))
        preferred = fleet.route(admission.route_request(call(admission, "probe", "a"))).pod
        second = await start(admission, call(admission, "r1", "a"))
        waiting = asyncio.create_task(start(admission, call(admission, "r2", "b")))
        await settle()
        assert not waiting.done() and admission.capacity.waiting("tiny") == 1  # both pods full
        held.end(Outcome.OK)
        third = await asyncio.wait_for(waiting, 5)
        for lease in (second, third):
            lease.end(Outcome.OK)
        return preferred, second.pod, third.pod

    preferred, second, third = run(scenario())
    assert preferred == "pod0"  # what the policy alone picks (pod1 holds an interactive request, pod0 batch lines)
    assert (second, third) == ("pod1", "pod1")


def test_a_full_pod_takes_the_request_when_none_below_the_limit_can() -> None:
    """The pod below the limit was tried already (a retry): the request goes to the full pod rather than fail."""

    async def scenario() -> str:
        admission = admission_for(TWO_PODS, saturation={"inflightPerPod": 2})
        fleet = admission.fleets.fleet("tiny")
        batch_lines_elsewhere(admission, "pod0", 2)
        request = call(admission, "retry", "a")
        route = dataclasses.replace(admission.route_request(request), exclude_pods=frozenset({"pod1"}))
        decision = await admission.decide(fleet, route, request.priority, None, request.deadline_s, call=request)
        lease = admission.lease(fleet, decision, route)
        lease.end(Outcome.OK)
        return lease.pod

    assert run(scenario()) == "pod0"


def test_without_a_limit_the_policy_alone_picks_the_pod() -> None:
    async def scenario() -> tuple[str, str]:
        admission = admission_for(TWO_PODS, saturation={"inflightPerPod": 0})
        fleet = admission.fleets.fleet("tiny")
        batch_lines_elsewhere(admission, "pod0", 2)
        held = start_on(admission, "pod1", call(admission, "r0", "a"))
        request = call(admission, "r1", "a")
        preferred = fleet.route(admission.route_request(request)).pod
        lease = await start(admission, request)
        for done in (held, lease):
            done.end(Outcome.OK)
        return preferred, lease.pod

    assert run(scenario()) == ("pod0", "pod0")


def flood_by_a(admission: Admission) -> Lease:
    """b was served a little, then a a lot (a is over its share, b under it); a's request holds a slot of pod0."""
    b_earlier = call(admission, "b0", "b")
    start_on(admission, "pod0", b_earlier).end(Outcome.OK)
    admission.tenants.meter(b_earlier).add(2)
    running = start_on(admission, "pod0", call(admission, "a0", "a"))
    admission.tenants.meter(call(admission, "a0", "a")).add(300)
    return running


@dataclasses.dataclass(frozen=True)
class ReserveCase:
    reserved: int | None
    """``saturation.reservedPerPod`` (None: unset) beside ``inflightPerPod: 2`` on one pod holding a's request."""
    tenant: str
    band: Priority
    starts_at_once: bool


RESERVE_CASES = [
    ReserveCase(reserved=1, tenant="a", band=Priority.INTERACTIVE, starts_at_once=False),
    ReserveCase(reserved=1, tenant="a", band=Priority.CRITICAL, starts_at_once=False),
    ReserveCase(reserved=1, tenant="b", band=Priority.SHEDDABLE, starts_at_once=False),
    ReserveCase(reserved=1, tenant="b", band=Priority.INTERACTIVE, starts_at_once=True),
    ReserveCase(reserved=1, tenant="b", band=Priority.CRITICAL, starts_at_once=True),
    ReserveCase(reserved=0, tenant="a", band=Priority.INTERACTIVE, starts_at_once=True),
    ReserveCase(reserved=None, tenant="b", band=Priority.SHEDDABLE, starts_at_once=True),
]


@pytest.mark.parametrize(
    "case",
    [
        pytest.param(RESERVE_CASES[0], id="the over-share tenant never takes the reserved slot"),
        pytest.param(RESERVE_CASES[1], id="nor does its critical request"),
        pytest.param(RESERVE_CASES[2], id="nor a sheddable request of a tenant under its share"),
        pytest.param(RESERVE_CASES[3], id="an interactive request under its share takes it"),
        pytest.param(RESERVE_CASES[4], id="a critical one under its share takes it"),
        pytest.param(RESERVE_CASES[5], id="reservedPerPod 0: the flood takes every slot, as without the key"),
        pytest.param(RESERVE_CASES[6], id="unset: every band takes every slot"),
    ],
)
def test_the_reserved_slot_goes_only_to_a_request_not_flooding(case: ReserveCase) -> None:
    async def scenario() -> tuple[bool, int]:
        saturation: dict[str, Any] = {"inflightPerPod": 2}
        if case.reserved is not None:
            saturation["reservedPerPod"] = case.reserved
        admission = admission_for(saturation=saturation)
        running = flood_by_a(admission)
        task = asyncio.create_task(start(admission, call(admission, "new", case.tenant, case.band)))
        await settle()
        started, waiting = task.done(), admission.capacity.waiting("tiny")
        running.end(Outcome.OK)  # the slot below the reserve frees: whatever waited starts now
        (await asyncio.wait_for(task, 5)).end(Outcome.OK)
        return started, waiting

    started, waiting = run(scenario())
    assert (started, waiting) == (case.starts_at_once, 0 if case.starts_at_once else 1)


def test_a_reserved_slot_a_flooding_waiter_cannot_take_goes_to_the_next_that_may() -> None:
    """Both slots full, a's request waits first and heads the line (b's joined later, lifted to a's counter): when a
    slot frees and the pod still holds what a flooding request may not go beyond, a's wake-up passes to b's request;
    a's starts only once the pod holds fewer than ``inflightPerPod - reservedPerPod``, whoever's requests they are."""

    async def scenario() -> list[list[str]]:
        admission = admission_for(saturation={"inflightPerPod": 2, "reservedPerPod": 1})
        running = {"a0": flood_by_a(admission), "b1": await start(admission, call(admission, "b1", "b"))}
        tasks = {name: asyncio.create_task(start(admission, call(admission, name, tenant)))
                 for name, tenant in (("a1", "a"), ("b2", "b"))}
        await settle()
        assert admission.capacity.waiting("tiny") == 2
        started: list[list[str]] = []
        for ended in ("b1", "a0", "b2", "a1"):
            running.pop(ended).end(Outcome.OK)
            await settle()
            now = [name for name, task in tasks.items() if task.done() and name not in running]
            for name in now:
                running[name] = tasks.pop(name).result()
            started.append(now)
        return started

    assert run(scenario()) == [["b2"], [], ["a1"], []]
