"""The router's batch seams: free capacity over pod loads, and router errors as batch answers (retry
later for the retryable ones, an answered error line for the rest)."""

from __future__ import annotations

import asyncio
import dataclasses
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from trtfleet_router import errors as e
from trtfleet_router.batch.capacity import free_slots
from trtfleet_router.batch.executor import DispatchExecutor
from trtfleet_router.batch.leader import LeaseAction, lease_body, plan_lease
from trtfleet_router.batch.resources import batch_id_for, status_for

from trtfleet.batch.lines import BatchLine
from trtfleet.batch.records import BatchRecord, BatchStatus, RequestCounts


@pytest.mark.parametrize(
    ("loads", "slots", "free"),
    [
        pytest.param([], 4, 0, id="no-ready-pod"),
        pytest.param([0, 0], 4, 8, id="idle"),
        pytest.param([4, 6], 4, 0, id="saturated"),
        pytest.param([3, 9], 4, 1, id="one-slot-left"),
    ],
)
def test_free_slots(loads: list[int], slots: int, free: int) -> None:
    assert free_slots(loads, slots) == free


class Answerer:
    def __init__(self, outcome: dict[str, Any] | e.RouterError) -> None:
        self.outcome = outcome
        self.chat: bool | None = None

    async def answer(self, body: Any, *, chat: bool, request_id: str) -> dict[str, Any]:
        self.chat = chat
        if isinstance(self.outcome, e.RouterError):
            raise self.outcome
        return self.outcome


@pytest.mark.parametrize(
    ("outcome", "status", "retry"),
    [
        pytest.param({"choices": []}, 200, None, id="answer"),
        pytest.param(e.LimitExceeded("too long"), 400, None, id="bad-request-is-answered"),
        pytest.param(e.UpstreamTimeout("slow"), 504, None, id="timeout-is-answered"),
        pytest.param(e.Overloaded("busy", retry_after_s=3), 429, 3.0, id="busy-retries"),
        pytest.param(e.NoCapacityAvailable("no pod"), 503, 1.0, id="no-pod-retries"),
        pytest.param(e.ShuttingDown("draining"), 503, 1.0, id="draining-retries"),
    ],
)
def test_router_errors_become_answers_or_retries(outcome: Any, status: int, retry: float | None) -> None:
    answerer = Answerer(outcome)
    item = BatchLine(1, "c1", "tiny", {"model": "tiny", "messages": []})
    answer = asyncio.run(DispatchExecutor(answerer).execute("/v1/chat/completions", item, "r1"))
    assert (answer.status_code, answer.retry_after_s, answer.request_id) == (status, retry, "r1")
    assert answerer.chat is True
    if status != 200:
        assert answer.body["error"]["message"] == outcome.message


def _record(status: BatchStatus, completed: int, failed: int, **stamps: int) -> BatchRecord:
    base = BatchRecord("batch_1", "/v1/completions", "file-1", "24h", BatchStatus.VALIDATING, 100, 86500)
    return dataclasses.replace(
        base.moved_to(status, 200), request_counts=RequestCounts(10, completed, failed), **stamps
    )


@pytest.mark.parametrize(
    ("record", "phase", "progress", "complete"),
    [
        pytest.param(_record(BatchStatus.IN_PROGRESS, 3, 2), "Running", 50, "False", id="running"),
        pytest.param(_record(BatchStatus.COMPLETED, 8, 2), "Succeeded", 100, "True", id="succeeded"),
        pytest.param(_record(BatchStatus.CANCELLED, 1, 0), "Cancelled", 10, "True", id="cancelled"),
        pytest.param(_record(BatchStatus.EXPIRED, 4, 0), "Expired", 40, "True", id="expired"),
    ],
)
def test_batch_resource_status_follows_the_record(
    record: BatchRecord, phase: str, progress: int, complete: str
) -> None:
    status = status_for(record, generation=3, output_uri="s3://b/out/output.jsonl")
    assert (status["phase"], status["progressPercent"], status["observedGeneration"]) == (phase, progress, 3)
    assert status["batchId"] == "batch_1" and status["outputUri"] == "s3://b/out/output.jsonl"
    assert status["conditions"][0]["type"] == "Complete" and status["conditions"][0]["status"] == complete


def test_batch_resource_status_without_a_record() -> None:
    failed = status_for(None, generation=1, message="cannot read s3://b/in.jsonl")
    assert failed["phase"] == "Failed" and "s3://b/in.jsonl" in failed["message"]
    assert status_for(None, generation=1, cancelled=True)["phase"] == "Cancelled"
    assert status_for(None, generation=1)["phase"] == "Pending"
    assert batch_id_for({"metadata": {"uid": "ab-cd"}}) == "batch_abcd"


NOW = datetime(2026, 1, 1, 12, 0, 0, tzinfo=UTC)


def _lease(holder: str | None, renewed_s_ago: float, duration_s: int = 15) -> dict[str, Any]:
    renew = (NOW - timedelta(seconds=renewed_s_ago)).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
    spec = {"holderIdentity": holder, "renewTime": renew, "leaseDurationSeconds": duration_s, "leaseTransitions": 2}
    return {"metadata": {"name": "l", "resourceVersion": "7"}, "spec": spec}


@pytest.mark.parametrize(
    ("lease", "action"),
    [
        pytest.param(None, LeaseAction.CREATE, id="no-lease"),
        pytest.param(_lease("me", 3), LeaseAction.RENEW, id="mine"),
        pytest.param(_lease("other", 3), LeaseAction.FOLLOW, id="held-by-another"),
        pytest.param(_lease("other", 16), LeaseAction.TAKE, id="expired"),
        pytest.param(_lease(None, 1), LeaseAction.TAKE, id="released"),
    ],
)
def test_lease_plan(lease: dict[str, Any] | None, action: LeaseAction) -> None:
    assert plan_lease(lease, "me", NOW) is action


def test_lease_writes_are_compare_and_swap_and_count_transitions() -> None:
    taken = lease_body(_lease("other", 16), "me", NOW, 15, "l")
    assert taken["metadata"] == {"name": "l", "resourceVersion": "7"}
    assert taken["spec"]["holderIdentity"] == "me" and taken["spec"]["leaseTransitions"] == 3
    renewed = lease_body(_lease("me", 3), "me", NOW, 15, "l")
    assert renewed["spec"]["leaseTransitions"] == 2 and renewed["spec"]["renewTime"].startswith("2026-01-01T12:00:00")
    assert "resourceVersion" not in lease_body(None, "me", NOW, 15, "l")["metadata"]


def test_fleet_capacity_follows_the_fleets_in_flight_requests() -> None:
    from trtfleet_router.batch.capacity import FleetCapacity
    from trtfleet_router.chat import chat_renderer
    from trtfleet_router.liveview import DiscoverySnapshot, FleetSet, PodEndpoint
    from trtfleet_router.models_registry import AdapterEntry, BaseModelEntry, EngineLimits, ModelRegistry
    from trtfleet_router.routing.config import RoutingConfig
    from trtfleet_router.routing.types import Outcome, RouteRequest

    fleets = FleetSet(RoutingConfig(), seed=1)
    registry = ModelRegistry(
        [BaseModelEntry("tiny", "reference", EngineLimits(100, 150), chat_renderer("reference"))],
        [AdapterEntry("a", "tiny", 1, "/tiny/a")],
    )
    fleets.apply(DiscoverySnapshot(registry, {"tiny": {n: PodEndpoint(n, f"{n}:1", n) for n in ("p1", "p2")}}))
    capacity = FleetCapacity(fleets, pod_slots=2)
    fleet = fleets.fleet("tiny")
    tickets = []
    for index in range(4):  # two on each pod: every slot taken
        assert capacity.has_free_capacity("a")
        request = RouteRequest("tiny", None, 4, 4, request_id=f"r{index}")
        tickets.append(fleet.start(fleet.route(request), request))
    assert not capacity.has_free_capacity("a") and not capacity.has_free_capacity("tiny")
    fleet.finish(tickets[0], Outcome.OK)
    assert capacity.has_free_capacity("a")
    assert capacity.has_free_capacity("unknown-model")  # the line runs and gets its 404 answer


def test_fleet_capacity_leaves_out_the_pods_a_reserve_holds_for_interactive_requests() -> None:
    """With ``--batch-reserve-pods 1`` the runner counts the batch's room and lanes without the reserved pod once
    an interactive request came, and with it again when none came for the hold time."""
    from trtfleet_router.batch.capacity import FleetCapacity
    from trtfleet_router.chat import chat_renderer
    from trtfleet_router.liveview import DiscoverySnapshot, FleetSet, PodEndpoint
    from trtfleet_router.models_registry import BaseModelEntry, EngineLimits, ModelRegistry
    from trtfleet_router.routing.config import RESERVE_HOLD_S, RoutingConfig
    from trtfleet_router.routing.types import Outcome, RouteRequest

    clock = [1000.0]
    fleets = FleetSet(RoutingConfig(), seed=1, now=lambda: clock[0])
    registry = ModelRegistry([BaseModelEntry("tiny", "reference", EngineLimits(100, 150), chat_renderer("reference"))])
    fleets.apply(DiscoverySnapshot(registry, {"tiny": {n: PodEndpoint(n, f"{n}:1", n) for n in ("p1", "p2", "p3")}}))
    capacity = FleetCapacity(fleets, pod_slots=1, reserve_pods=1)
    fleet = fleets.fleet("tiny")
    assert capacity.lanes("tiny") == 3 and fleet.reserved_now(1) == frozenset()  # no interactive request yet
    interactive = RouteRequest("tiny", None, 4, 4, request_id="i", reserve_pods=1, reserve_room=1)
    fleet.finish(fleet.start(fleet.route(interactive), interactive), Outcome.OK)  # the reserve holds from now
    (kept,) = fleet.reserved_now(1)
    assert capacity.lanes("tiny") == 2
    tickets = []
    for index in range(2):  # one batch line on each pod that is not reserved: no room left for the batch
        line = RouteRequest("tiny", None, 4, 4, request_id=f"b{index}", background=True, batch_slots=1,
                            reserve_pods=1, reserve_room=1)
        decision = fleet.route(line)
        assert decision.pod != kept
        tickets.append(fleet.start(decision, line))
    assert not capacity.has_free_capacity("tiny")
    clock[0] += RESERVE_HOLD_S + 1  # no interactive request for the hold time: the batch may use every pod
    assert capacity.has_free_capacity("tiny") and capacity.lanes("tiny") == 3
    for ticket in tickets:
        fleet.finish(ticket, Outcome.OK)
    fleet.check_invariants()


def test_the_reserve_flag_reaches_the_batch_settings_and_a_bad_one_is_refused() -> None:
    import argparse

    from trtfleet_router.batch.wiring import BatchSettings
    from trtfleet_router.cli import configure, settings_from_args

    parser = argparse.ArgumentParser()
    configure(parser)
    args = ["--fleet-config", "f.yaml", "--batch-store", "/tmp/store"]
    settings = settings_from_args(parser.parse_args([*args, "--batch-reserve-pods", "1"]))
    assert settings.batch.reserve_pods == 1
    assert settings_from_args(parser.parse_args(args)).batch.reserve_pods == 0
    assert settings_from_args(parser.parse_args([*args, "--batch-reserve-pods", "auto"])).batch.reserve_pods == -1
    for bad in ("-1", "many"):  # argparse: "a number of pods (0 or more) or auto, not ..."
        with pytest.raises(SystemExit):
            parser.parse_args([*args, "--batch-reserve-pods", bad])
    with pytest.raises(ValueError, match="--batch-reserve-pods must be 0 or more, or auto; got -2"):
        BatchSettings(store="/tmp/store", reserve_pods=-2)
