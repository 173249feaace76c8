"""BaseModel autoscaling (pure): the decision on a BaseModel object (what it writes, the condition, the events,
restart safety) and the cold start it measures."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from trtfleet_operator.reconcile.autoscale import autoscale_basemodel, cold_start

from trtfleet.autoscaling import DemandSignals

NOW = datetime(2026, 1, 1, 12, 0, tzinfo=UTC)


def _basemodel(replicas: int, *, status: dict[str, Any] | None = None, **scaling: Any) -> dict[str, Any]:
    return {
        "apiVersion": "trtfleet.io/v1alpha1",
        "kind": "BaseModel",
        "metadata": {"name": "tiny", "namespace": "ns", "generation": 3},
        "spec": {
            "source": {"uri": "hf://org/model"},
            "architecture": "llama",
            "serving": {"replicas": replicas},
            "autoscaling": {"minReplicas": 0, "maxReplicas": 8, "targetRequestsPerPod": 4, **scaling},
        },
        "status": status or {},
    }


def test_scale_from_zero_writes_replicas_status_condition_and_event() -> None:
    result = autoscale_basemodel(_basemodel(0), DemandSignals(router_requests=9, held_requests=9), NOW, sources=1)
    assert result is not None and result.replicas == 3
    scaling = result.status["autoscaling"]
    assert scaling["desiredReplicas"] == 3 and scaling["lastScaleTime"] == "2026-01-01T12:00:00Z"
    assert scaling["lastDemand"] == {"requests": 9, "heldRequests": 9, "sources": 1}
    condition = next(c for c in result.status["conditions"] if c["type"] == "ScalingActive")
    assert (condition["status"], condition["reason"]) == ("True", "ScaledFromZero")
    assert [(e.type, e.reason) for e in result.events] == [("Normal", "ScaledFromZero")]


def test_the_history_in_status_survives_a_restart() -> None:
    """Decide, keep only the object (as a new operator process would), decide again: the down window holds."""
    first = autoscale_basemodel(_basemodel(2), DemandSignals(router_requests=8), NOW)
    assert first is not None and first.replicas is None  # steady at 2
    later = NOW + timedelta(seconds=30)
    second = autoscale_basemodel(_basemodel(2, status=first.status), DemandSignals(router_requests=1), later)
    assert second is not None and second.replicas is None  # 1 recommended, but 2 was recommended 30 s ago
    reason = next(c["reason"] for c in second.status["conditions"] if c["type"] == "ScalingActive")
    assert reason == "ScaleDownStabilized"
    done = NOW + timedelta(seconds=331)  # 300 s after 2 was last recommended
    third = autoscale_basemodel(_basemodel(2, status=second.status), DemandSignals(router_requests=1), done)
    assert third is not None and third.replicas == 1


def test_no_signals_keeps_the_size_and_warns_once() -> None:
    first = autoscale_basemodel(_basemodel(2), None, NOW)
    assert first is not None and first.replicas is None
    assert [(e.type, e.reason) for e in first.events] == [("Warning", "SignalsUnavailable")]
    again = autoscale_basemodel(_basemodel(2, status=first.status), None, NOW + timedelta(seconds=15))
    assert again is not None and again.events == ()
    condition = next(c for c in again.status["conditions"] if c["type"] == "ScalingActive")
    assert condition["status"] == "False"


def test_without_autoscaling_nothing_is_decided() -> None:
    obj = _basemodel(2)
    del obj["spec"]["autoscaling"]
    assert autoscale_basemodel(obj, DemandSignals(router_requests=100), NOW) is None


def _epoch(seconds_after: float) -> float:
    return (NOW + timedelta(seconds=seconds_after)).timestamp()


@pytest.mark.parametrize(
    ("pending", "scaling_up", "desired", "ready_since", "want_pending", "want_s"),
    [
        pytest.param(None, True, 3, [], "STAMP", None, id="scale-up-starts-a-wait"),
        pytest.param(None, True, 2, [_epoch(-60), _epoch(-50)], None, None, id="ready-pods-meet-it-no-wait"),
        pytest.param(None, False, 2, [], None, None, id="steady-no-wait"),
        pytest.param("2026-01-01T12:00:00Z", False, 3, [], "2026-01-01T12:00:00Z", None, id="still-waiting"),
        pytest.param("2026-01-01T12:00:00Z", False, 3, [_epoch(-30), _epoch(37)], None, 37.0, id="first-new-pod"),
        pytest.param("2026-01-01T12:00:00Z", False, 3, [_epoch(50), _epoch(41)], None, 41.0, id="earliest-counts"),
        pytest.param("2026-01-01T12:00:00Z", True, 5, [_epoch(20)], "STAMP", 20.0, id="measured-then-new-wait"),
        pytest.param("2026-01-01T12:00:00Z", False, 1, [_epoch(-30)], None, None, id="scaled-down-to-ready-pods"),
        pytest.param("yesterday", False, 3, [_epoch(5)], None, None, id="unreadable-stamp-dropped"),
    ],
)
def test_cold_start(pending: str | None, scaling_up: bool, desired: int, ready_since: list[float],
                    want_pending: str | None, want_s: float | None) -> None:
    wait = cold_start(pending, scaling_up=scaling_up, desired=desired, ready_since_s=ready_since, stamp="STAMP")
    assert wait.pending == want_pending
    assert wait.measured_s == (pytest.approx(want_s, abs=1e-6) if want_s is not None else None)


def test_cold_start_is_written_to_status_with_an_event() -> None:
    up = autoscale_basemodel(_basemodel(0), DemandSignals(router_requests=4, held_requests=4), NOW, sources=1)
    assert up is not None and up.replicas == 1
    assert up.status["autoscaling"]["scaleUpTime"] == "2026-01-01T12:00:00Z"
    later = NOW + timedelta(seconds=45)
    ready = autoscale_basemodel(_basemodel(1, status=up.status), DemandSignals(router_requests=4), later,
                                sources=1, ready_since_s=[_epoch(38)])
    assert ready is not None and ready.replicas is None
    scaling = ready.status["autoscaling"]
    assert scaling["lastColdStartSeconds"] == 38.0 and scaling["scaleUpTime"] is None
    assert ("Normal", "ColdStart") in [(e.type, e.reason) for e in ready.events]
    steady = autoscale_basemodel(_basemodel(1, status={**ready.status, "autoscaling": {
        k: v for k, v in scaling.items() if v is not None}}), DemandSignals(router_requests=4),
        later + timedelta(seconds=15), sources=1, ready_since_s=[_epoch(38)])
    assert steady is not None and "scaleUpTime" not in steady.status["autoscaling"]
    assert steady.status["autoscaling"]["lastColdStartSeconds"] == 38.0 and steady.events == ()
