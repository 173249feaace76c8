"""Autoscaling in the operator: the signal parser (against the router's real exposition), the combination
over router replicas, and the pure decision on a BaseModel object (what it writes, the condition, the events,
restart safety)."""

from __future__ import annotations

import math
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from trtfleet_operator.builders.serving import SPEC_KEY, build_model_repo_configmap
from trtfleet_operator.config import OperatorConfig
from trtfleet_operator.reconcile.autoscale import autoscale_basemodel, cold_start
from trtfleet_operator.reconcile.deletioncost import DELETION_COST, deletion_cost_patches
from trtfleet_operator.signals import MetricsParseError, RouterReading, combine, parse_router_metrics
from trtfleet_router.activity import warm_demand
from trtfleet_router.metrics import RouterMetrics

from trtfleet.api import BaseModelSpec
from trtfleet.autoscaling import DemandSignals

NOW = datetime(2026, 1, 1, 12, 0, tzinfo=UTC)


def test_router_exposition_is_read_per_base_model() -> None:
    metrics = RouterMetrics()
    metrics.base_model_requests.labels("tiny").set(5)
    metrics.held_requests.labels("tiny").set(2)
    metrics.base_model_requests.labels("other").set(7)
    metrics.activity.record("tiny", "a1", 3)
    metrics.activity.record("tiny", "a2", 4)
    text = metrics.exposition().decode()
    # two in flight, each adapter half the window's requests: 7 pages x (1 - e^-1), demand-weighted, rounded up
    assert parse_router_metrics(text, "tiny") == RouterReading(5, 2, 5)
    assert parse_router_metrics(text, "absent") == RouterReading(0, 0, 0)


def test_the_pods_load_is_read_from_the_router() -> None:
    """The operator scrapes no pod: the load the router scraped comes with the router's exposition."""
    metrics = RouterMetrics()
    metrics.pods_reporting_load.labels("tiny").set(2)
    metrics.pod_requests.labels("tiny").set(7)
    metrics.pod_kv_cache_used_ratio.labels("tiny").set(0.25)
    metrics.pod_kv_cache_used_ratio.labels("cold").set(math.nan)  # no pod exports a KV fraction
    text = metrics.exposition().decode()
    assert parse_router_metrics(text, "tiny") == RouterReading(0, 0, 0, 2, 7, 0.25)
    assert parse_router_metrics(text, "cold").pod_kv_fraction is None
    with pytest.raises(MetricsParseError):
        parse_router_metrics("{not prometheus", "tiny")


@pytest.mark.parametrize(
    ("routers", "want"),
    [
        pytest.param([], DemandSignals(0, 0, 0, None, None, 2), id="no-router"),
        pytest.param(
            [RouterReading(3, 1, 5, 2, 4, 0.2), RouterReading(2, 0, 4, 2, 4, 0.2)],
            DemandSignals(5, 1, 4, 0.2, 9, 2),
            id="router-demand-summed-pod-load-once",
        ),
        pytest.param(
            [RouterReading(1, 0, 0, 1, 3, 0.5), RouterReading(1, 0, 0, 2, 6, 0.4)],
            DemandSignals(2, 0, 6, 0.4, 0, 2),
            id="pod-load-of-the-replica-seeing-most-pods",
        ),
    ],
)
def test_combine(routers: list[RouterReading], want: DemandSignals) -> None:
    assert combine(routers, ready_pods=2) == want


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


def _pod(name: str, cost: str | None = None, *, deleting: bool = False) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name}
    if cost is not None:
        meta["annotations"] = {DELETION_COST: cost}
    if deleting:
        meta["deletionTimestamp"] = "2026-01-01T12:00:00Z"
    return {"metadata": meta}


@pytest.mark.parametrize(
    ("pods", "warm", "want"),
    [
        pytest.param([_pod("hot"), _pod("cold")], {"hot": 120.0, "cold": 3.4}, [("hot", "120"), ("cold", "3")],
                     id="demand-becomes-the-cost"),
        pytest.param([_pod("new")], {}, [("new", "0")], id="unknown-to-the-routers-costs-nothing"),
        pytest.param([_pod("same", "7")], {"same": 7.2}, [], id="unchanged-not-patched"),
        pytest.param([_pod("gone", deleting=True)], {"gone": 9.0}, [], id="terminating-left-alone"),
        pytest.param([_pod("huge")], {"huge": 1e12}, [("huge", str(2**31 - 1))], id="clamped-to-int32"),
        pytest.param([_pod("nan")], {"nan": float("nan")}, [("nan", "0")], id="nan-is-zero"),
    ],
)
def test_deletion_cost_patches(pods: list[dict[str, Any]], warm: dict[str, float], want: list[tuple[str, str]]) -> None:
    assert deletion_cost_patches(pods, warm) == want


def test_router_reports_each_pods_warm_demand_and_the_operator_reads_it() -> None:
    metrics = RouterMetrics()
    metrics.pod_warm_demand = lambda: [("tiny", "p0", 12), ("tiny", "p1", 0), ("other", "p9", 5)]
    reading = parse_router_metrics(metrics.exposition().decode(), "tiny")
    assert reading.pod_warm_demand == {"p0": 12.0, "p1": 0.0}


def test_warm_demand_counts_the_window_requests_of_the_adapters_a_pod_holds() -> None:
    served_of = {101: "a1", 102: "a2", 103: "a3"}
    requests = {"a1": 10, "a2": 1}
    assert warm_demand([101, 102], served_of, requests) == 11
    assert warm_demand([103, 999], served_of, requests) == 0  # not requested lately; unknown task id


def test_sizing_the_fleet_does_not_change_what_a_reference_pod_serves() -> None:
    """basemodel.json leaves out serving.replicas and autoscaling, so a decision never rolls the pods."""
    repos = []
    for replicas, scaling in ((2, None), (5, None), (3, {"minReplicas": 1, "maxReplicas": 4})):
        body: dict[str, Any] = {"source": {"uri": "file:///m"}, "architecture": "llama", "runtime": "reference",
                                "serving": {"replicas": replicas}}
        if scaling is not None:
            body["autoscaling"] = scaling
        repo = build_model_repo_configmap(BaseModelSpec.model_validate(body), name="tiny", namespace="ns",
                                          owner={}, engine_hash="h", config=OperatorConfig())
        repos.append(repo["data"])
    assert repos[0] == repos[1] == repos[2]
    assert "replicas" not in repos[0][SPEC_KEY] and "autoscaling" not in repos[0][SPEC_KEY]
