"""Upstream call modes, prewarming, passive health, metric names and JSON logs."""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable
from pathlib import Path

import httpx
import openai
import pytest
from trtfleet_router.logs import JsonFormatter
from trtfleet_router.metrics import RouterMetrics
from trtfleet_router.routing.config import RoutingConfig
from trtfleet_router.routing.outlier import OutlierDetectionConfig
from trtfleet_router.testing.echo import serve_echo
from trtfleet_router.upstream.dispatch import UpstreamCalls

from tests.unit.router.harness import EchoFleet
from trtfleet.demand import parse_router_metrics


def _eventually(check: Callable[[], bool], timeout_s: float = 10.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not check():
        assert time.monotonic() < deadline, "condition not reached"
        time.sleep(0.02)


@pytest.mark.parametrize(("calls", "http"), [(c, False) for c in UpstreamCalls] + [(UpstreamCalls.AUTO, True)])
def test_every_transport_serves_and_recovers_misses(tmp_path: Path, calls: UpstreamCalls, http: bool) -> None:
    echo = EchoFleet(tmp_path, count=2, upstream_calls=calls, http=http)
    try:
        client = openai.OpenAI(base_url=echo.router.http_url + "/v1", api_key="x", max_retries=0)
        assert client.completions.create(model="a1", prompt="one", max_tokens=30).choices[0].text == "[101] one"
        for upstream in echo.upstreams:
            upstream.cache.evict(101)
        pieces = client.completions.create(model="a1", prompt="two", max_tokens=30, stream=True)
        assert "".join(c.choices[0].text for c in pieces) == "[101] two"
        assert sum(u.stats.misses for u in echo.upstreams) == 1
        assert client.completions.create(model="a1", prompt="three", max_tokens=30).choices[0].text == "[101] three"
        attempts = echo.router.router.metrics.upstream_attempts
        used = {t for t in ("http", "grpc_call", "grpc_shared") if attempts.labels(t).value}
        expected = {
            (UpstreamCalls.AUTO, False): {"grpc_shared", "grpc_call"},
            (UpstreamCalls.PER_REQUEST, False): {"grpc_call"},
            (UpstreamCalls.MULTIPLEXED, False): {"grpc_shared"},
            (UpstreamCalls.AUTO, True): {"http", "grpc_shared", "grpc_call"},  # weights always go over gRPC
        }[(calls, http)]
        assert used == expected
        # Triton generate without an id: a multiplexed attempt's own request id never reaches the client
        for _ in range(2):  # cold (weights over gRPC), then warm
            for upstream in echo.upstreams:
                upstream.cache.evict(102)
            answer = httpx.post(echo.router.http_url + "/v2/models/a2/generate",
                                json={"text_input": "x", "max_tokens": 30}, timeout=30).json()
            assert "id" not in answer and answer["text_output"] == "[102] x"
        echo.router.check_books()
    finally:
        echo.close()


def test_prewarm_pushes_weights_before_any_request(tmp_path: Path) -> None:
    echo = EchoFleet(tmp_path, count=2, adapters=("a1",), prewarm_interval_s=0.1)
    try:
        assert not any(u.stats.weights_received for u in echo.upstreams)
        fleet = echo.fleet["baseModels"][0]
        fleet["adapters"][0]["minPods"] = 2
        from trtfleet_router.discovery.static import FleetConfig, snapshot_from_config

        echo.loop.run(_apply(echo, snapshot_from_config(FleetConfig.model_validate(echo.fleet))))
        _eventually(lambda: all(u.stats.weights_received == 1 for u in echo.upstreams))
        client = openai.OpenAI(base_url=echo.router.http_url + "/v1", api_key="x", max_retries=0)
        client.completions.create(model="a1", prompt="warm", max_tokens=30)
        assert sum(u.stats.weights_received for u in echo.upstreams) == 2  # the request found it warm
    finally:
        echo.close()


def test_a_new_pod_gets_the_hottest_adapter_before_its_first_request(tmp_path: Path) -> None:
    """Warm scale-up: echo1 joins after a1 was in demand; the router pushes a1 to it with no request."""
    from trtfleet_router.discovery.static import FleetConfig, snapshot_from_config

    echo = EchoFleet(tmp_path, count=2, adapters=("a1", "a2"))
    try:
        both = echo.fleet["baseModels"][0]["backends"]
        one = {"baseModels": [{**echo.fleet["baseModels"][0], "backends": both[:1]}]}
        echo.loop.run(_apply(echo, snapshot_from_config(FleetConfig.model_validate(one))))  # scaled down to echo0
        client = openai.OpenAI(base_url=echo.router.http_url + "/v1", api_key="x", max_retries=0)
        for i in range(3):
            client.completions.create(model="a1", prompt=f"hot {i}", max_tokens=8)
        assert echo.upstreams[1].stats.weights_received == 0
        echo.loop.run(_apply(echo, snapshot_from_config(FleetConfig.model_validate(echo.fleet))))  # echo1 is new
        _eventually(lambda: echo.upstreams[1].stats.weights_received == 1)
        fleet = echo.router.router.fleets.fleets["tiny"]
        task = echo.router.router.fleets.registry.resolve("a1").adapter
        assert task is not None

        async def warm_and_done() -> bool:  # on the loop thread, which owns the fleet's books
            return fleet.is_warm("echo1", task.task_id) and fleet.snapshot().open_tickets == 0

        _eventually(lambda: echo.loop.run(warm_and_done()))

        async def exposition() -> str:
            return echo.router.router.metrics.exposition().decode()

        warm = parse_router_metrics(echo.loop.run(exposition()), "tiny").pod_warm_demand
        assert warm == {"echo0": 3.0, "echo1": 3.0}  # both hold a1, asked 3 times in the window
        assert echo.router.router.metrics.activity.in_flight("tiny") == 0  # the prewarm was not demand
        echo.router.check_books()
    finally:
        echo.close()


async def _apply(echo: EchoFleet, snapshot: object) -> None:
    echo.router.router.apply(snapshot)  # type: ignore[arg-type]


def _ejecting_fleet(tmp_path: Path) -> EchoFleet:
    outliers = OutlierDetectionConfig(consecutive_failures=2, base_ejection_time_s=0.2, probe_interval_s=0.05)
    return EchoFleet(tmp_path, count=2, routing=RoutingConfig(outlier_detection=outliers))


def _eject_echo0(echo: EchoFleet, client: openai.OpenAI) -> int:
    """Stop echo0's servers and send base-model requests (none fails) until the router ejects it; its port."""
    port = int(echo.fleet["baseModels"][0]["backends"][0]["address"].rsplit(":", 1)[1])
    echo.stop_upstream(0)
    fleets = echo.router.router.fleets
    for i in range(30):  # base-model requests spread over both pods; none fails
        assert client.completions.create(model="tiny", prompt=f"p{i}", max_tokens=30).choices[0].text == f"p{i}"
        if fleets.ejected("tiny"):
            break
    assert fleets.ejected("tiny") == {"echo0"}
    return port


def test_failed_pod_is_ejected_and_readmitted(tmp_path: Path) -> None:
    echo = _ejecting_fleet(tmp_path)
    try:
        client = openai.OpenAI(base_url=echo.router.http_url + "/v1", api_key="x", max_retries=0)
        port = _eject_echo0(echo, client)
        fleets = echo.router.router.fleets
        echo.servers[0], _ = echo.loop.run(serve_echo(echo.upstreams[0], port=port))
        _eventually(lambda: not fleets.ejected("tiny"))
        assert len(fleets.ready_endpoints("tiny")) == 2
    finally:
        echo.close()


def test_a_readmitted_pod_gets_the_adapter_that_turned_hot_while_it_was_ejected(tmp_path: Path) -> None:
    """Warm scale-up applies to a pod that comes back from an ejection: a1 was asked for only while echo0
    was out, so echo0 never held it; once readmitted it is pushed a1 with no request for it."""
    echo = _ejecting_fleet(tmp_path)
    try:
        client = openai.OpenAI(base_url=echo.router.http_url + "/v1", api_key="x", max_retries=0)
        port = _eject_echo0(echo, client)
        fleets = echo.router.router.fleets
        for i in range(3):  # a1 turns hot while echo0 is out: only echo1 gets it
            client.completions.create(model="a1", prompt=f"hot {i}", max_tokens=8)
        assert echo.upstreams[0].stats.weights_received == 0
        echo.servers[0], _ = echo.loop.run(serve_echo(echo.upstreams[0], port=port))
        _eventually(lambda: not fleets.ejected("tiny"))
        _eventually(lambda: echo.upstreams[0].stats.weights_received == 1)  # a1, pushed by the warm start
        echo.router.check_books()
    finally:
        echo.close()


def test_metric_names_follow_prometheus_conventions() -> None:
    metrics = RouterMetrics()
    metrics.requests.labels("openai", "adapter", "ok").inc()
    metrics.inflight_requests.labels("pod-0").inc()
    text = metrics.exposition().decode()
    families = [line.split()[2:4] for line in text.splitlines() if line.startswith("# TYPE")]
    assert families and all(name.startswith("trtfleet_router_") for name, _ in families)
    for name, kind in families:
        assert (kind == "counter") == name.endswith("_total"), name
        assert not name.endswith("_created"), name
        assert kind != "histogram" or name.endswith(("_seconds", "_bytes")), name


def test_adapter_label_cardinality_is_capped() -> None:
    metrics = RouterMetrics(adapter_label_cap=2)
    labels = [metrics.adapter_label(name) for name in ("a", "b", "c", "a", None)]
    assert labels == ["a", "b", "other", "a", ""]


def test_json_logs_carry_context() -> None:
    record = logging.LogRecord("trtfleet_router.x", logging.INFO, __file__, 1, "request %s", ("done",), None)
    record.ctx = {"request_id": "r-1", "adapter": "a1", "pod": "p0", "warm": True}
    record.pod_extra = "kept"
    doc = json.loads(JsonFormatter().format(record))
    assert doc["msg"] == "request done" and doc["level"] == "info" and doc["request_id"] == "r-1"
    assert doc["warm"] is True and doc["pod_extra"] == "kept"
