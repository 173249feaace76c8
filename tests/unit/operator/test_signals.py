"""Demand signals from the routers' metrics: the parser (against the router's real exposition, the pods'
load and warm demand included) and the combination over router replicas."""

from __future__ import annotations

import math

import pytest
from trtfleet_operator.signals import MetricsParseError, RouterReading, combine, parse_router_metrics
from trtfleet_router.activity import warm_demand
from trtfleet_router.metrics import RouterMetrics

from trtfleet.autoscaling import DemandSignals


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
