"""Autoscaling in the operator: the signal parser (against the router's real exposition), the combination
over router replicas, and the pure decision on a BaseModel object (what it writes, the condition, the events,
restart safety)."""

from __future__ import annotations

import math
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from trtfleet_operator.reconcile.autoscale import autoscale_basemodel
from trtfleet_operator.signals import MetricsParseError, RouterReading, combine, parse_router_metrics
from trtfleet_router.metrics import RouterMetrics

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
    assert parse_router_metrics(text, "tiny") == RouterReading(5, 2, 7)
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
