"""The loop-thread metric types write exactly what prometheus_client writes for the same updates."""

from __future__ import annotations

import asyncio
import contextlib
import time

import pytest
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, disable_created_metrics, generate_latest
from trtfleet_router.loopmetrics import LoopCollector, LoopCounter, LoopGauge, LoopHistogram, LoopLagProbe, lag_s
from trtfleet_router.metrics import RouterMetrics

BUCKETS = (0.001, 0.01, 0.1, 1.0)
OBSERVED = (0.0005, 0.001, 0.001, 0.0099, 0.5, 1.0, 2.5, 70.0)  # on a bound counts in that bucket (le)


def exposition_of(*metrics: LoopCounter | LoopGauge | LoopHistogram) -> bytes:
    collector = LoopCollector()
    collector.metrics.extend(metrics)
    registry = CollectorRegistry()
    registry.register(collector)
    return generate_latest(registry)


def reference_exposition(build: object) -> bytes:
    disable_created_metrics()  # type: ignore[no-untyped-call]  # as RouterMetrics does (no *_created series)
    registry = CollectorRegistry()
    assert callable(build)
    build(registry)
    return generate_latest(registry)


def test_histogram_matches_prometheus_client() -> None:
    ours = LoopHistogram("t_seconds", "doc", ("kind",), BUCKETS)
    for value in OBSERVED:
        ours.labels("a").observe(value)
    ours.labels("b").observe(0.02)

    def build(registry: CollectorRegistry) -> None:
        theirs = Histogram("t_seconds", "doc", ("kind",), buckets=BUCKETS, registry=registry)
        for value in OBSERVED:
            theirs.labels("a").observe(value)
        theirs.labels("b").observe(0.02)

    assert exposition_of(ours) == reference_exposition(build)
    assert b't_seconds_bucket{kind="a",le="0.001"} 3.0' in exposition_of(ours)


def test_counter_and_gauge_match_prometheus_client() -> None:
    requests = LoopCounter("t_requests", "doc", ("code",))
    requests.labels("ok").inc()
    requests.labels("ok").inc(2)
    requests.labels("bad").inc()
    sent = LoopCounter("t_bytes_sent", "doc", ())
    sent.inc(1024)
    inflight = LoopGauge("t_inflight", "doc", ("pod",))
    inflight.labels("p0").inc()
    inflight.labels("p0").inc()
    inflight.labels("p0").dec()
    inflight.labels("p1").set(7)

    def build(registry: CollectorRegistry) -> None:
        c = Counter("t_requests", "doc", ("code",), registry=registry)
        c.labels("ok").inc()
        c.labels("ok").inc(2)
        c.labels("bad").inc()
        Counter("t_bytes_sent", "doc", registry=registry).inc(1024)
        g = Gauge("t_inflight", "doc", ("pod",), registry=registry)
        g.labels("p0").inc()
        g.labels("p0").inc()
        g.labels("p0").dec()
        g.labels("p1").set(7)

    assert exposition_of(requests, sent, inflight) == reference_exposition(build)


def test_wrong_label_count_and_bad_buckets_are_errors() -> None:
    with pytest.raises(ValueError, match="takes labels"):
        LoopCounter("t", "doc", ("a", "b")).labels("only-one")
    with pytest.raises(ValueError, match="increasing"):
        LoopHistogram("t", "doc", (), (1.0, 0.5))


def test_router_metrics_expose_the_per_request_series() -> None:
    metrics = RouterMetrics()
    metrics.requests.labels("openai", "adapter", "ok").inc()
    metrics.routing_decision.observe(0.00002)
    text = metrics.exposition().decode()
    assert 'trtfleet_router_requests_total{code="ok",frontend="openai",model_kind="adapter"} 1.0' in text
    assert "trtfleet_router_routing_decision_seconds_count 1.0" in text


def test_loop_lag_is_how_late_a_wake_up_came() -> None:
    assert lag_s(10.0, 0.02, 10.02) == 0.0
    assert lag_s(10.0, 0.02, 10.5) == pytest.approx(0.48)
    assert lag_s(10.0, 0.02, 10.01) == 0.0  # an early wake-up is no lag
    with pytest.raises(ValueError, match="positive"):
        LoopLagProbe(RouterMetrics().event_loop_lag, interval_s=0)


def test_loop_lag_probe_records_a_blocked_loop() -> None:
    """A callback that holds the loop 100 ms while the probe sleeps 10 ms: the probe wakes at least 90 ms late
    (time.sleep sleeps at least what it is asked, so the bound holds however fast the machine)."""
    metrics = RouterMetrics()
    samples: list[float] = []

    class Recorder:
        def observe(self, value: float) -> None:
            samples.append(value)
            metrics.event_loop_lag.observe(value)
            if len(samples) == 1:  # runs after the probe has asked for its next wake-up
                asyncio.get_running_loop().call_soon(time.sleep, 0.1)

    async def two_samples() -> None:
        task = asyncio.create_task(LoopLagProbe(Recorder(), interval_s=0.01).run())
        while len(samples) < 2:
            await asyncio.sleep(0.005)
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task

    asyncio.run(two_samples())
    assert samples[1] >= 0.09
    text = metrics.exposition().decode()
    assert "trtfleet_router_event_loop_lag_seconds_count 2.0" in text
    assert 'trtfleet_router_event_loop_lag_seconds_bucket{le="0.05"}' in text
