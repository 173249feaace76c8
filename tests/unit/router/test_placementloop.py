"""The placement loop with a fake push: it re-plans, pushes each due prefetch through the push it was given (marked
as a prefetch, so no demand), tells the pacer when each ends, failed or not, and does nothing when placement is off."""

from __future__ import annotations

import asyncio

from trtfleet_router.chat import chat_renderer
from trtfleet_router.errors import RouterError
from trtfleet_router.liveview import DiscoverySnapshot, FleetSet, PodEndpoint
from trtfleet_router.models_registry import AdapterEntry, BaseModelEntry, EngineLimits, ModelRegistry
from trtfleet_router.placementloop import PlacementLoop
from trtfleet_router.routing import Fleet, Outcome, RouteRequest, parse_routing_config

PLACEMENT = {"placement": {"enabled": True, "minHostCopies": 1, "intervalS": 10.0}}


def fleet_set(config: dict[str, object]) -> FleetSet:
    base = BaseModelEntry("tiny", "reference", EngineLimits(512, 1024), chat_renderer("reference"))
    adapters = [AdapterEntry(f"a{i}", "tiny", 10 + i, f"file:///a{i}", weights_bytes=1000) for i in range(4)]
    fleets = FleetSet(parse_routing_config(config), seed=1)
    pods = {f"p{i}": PodEndpoint(f"p{i}", f"127.0.0.1:{9000 + i}", f"u{i}") for i in range(2)}
    fleets.apply(DiscoverySnapshot(ModelRegistry([base], adapters), {"tiny": pods}))
    return fleets


def test_due_prefetches_are_pushed_and_their_end_reaches_the_pacer() -> None:
    fleets = fleet_set(PLACEMENT)
    fleet = fleets.fleets["tiny"]
    pushed: list[tuple[str, str, str]] = []

    async def push(base: str, pod: str, served: str) -> None:
        pushed.append((base, pod, served))
        adapter = fleets.registry.resolve(served).adapter
        assert adapter is not None
        ticket = fleet.start(Fleet.prefetch_decision(pod), RouteRequest("tiny", adapter.ref, 3, 1))
        fleet.finish(ticket, Outcome.OK)
        if served == "a3":
            raise RouterError("the pod refused it")

    async def scenario() -> None:
        clock = [0.0]
        loop = PlacementLoop(fleets, push, clock=lambda: clock[0])
        rounds = 0
        while fleet.placer.pending() or rounds == 0:
            loop.tick()
            await asyncio.sleep(0)  # let the pushes run
            rounds += 1
            assert rounds < 20
        await asyncio.sleep(0)
        assert loop.pushed_total == 3 and loop.failed_total == 1
        assert fleet.placer.pacer.inflight_total() == 0

    asyncio.run(scenario())
    plan = fleet.placement
    assert sorted(served for _, _, served in pushed) == ["a0", "a1", "a2", "a3"]
    assert all(pod == plan.pods_of(10 + int(served[1:]))[0] for _, pod, served in pushed)
    assert all(fleet.placer.forecast.rate(10 + i, 0.0) == 0.0 for i in range(4))  # prefetches are no demand


def test_placement_off_runs_nothing() -> None:
    fleets = fleet_set({})

    async def push(base: str, pod: str, served: str) -> None:
        raise AssertionError("nothing is pushed with placement off")

    loop = PlacementLoop(fleets, push)
    asyncio.run(loop.run())  # returns at once
    assert fleets.fleets["tiny"].placement.copies() == 0
