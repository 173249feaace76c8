"""Broken and frozen pods behind a real router (echo upstreams, real gRPC/HTTP servers, the real openai
client): a dead stub's error answer and a pod that stops answering are retried elsewhere before the first
token, streams that had tokens end with an error event within the inter-token timeout, the pod is
ejected and comes back after a successful probe; request errors never eject a pod."""

from __future__ import annotations

import threading
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path

import openai
import pytest
from trtfleet_router.routing.config import RoutingConfig, StreamTimeouts
from trtfleet_router.routing.outlier import OutlierDetectionConfig

from tests.unit.router.harness import EchoFleet

DEAD_STUB = (
    "Failed to process the request(s) for model 'tensorrt_llm_bls_0_0', message: "
    "Stub process 'tensorrt_llm_bls_0_0' is not healthy."
)
FIRST_TOKEN_S = 2.0
INTER_TOKEN_S = 1.0


def _eventually(check: Callable[[], bool], timeout_s: float = 15.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not check():
        assert time.monotonic() < deadline, "condition not reached"
        time.sleep(0.02)


def _routing(base_ejection_time_s: float = 0.3) -> RoutingConfig:
    return RoutingConfig(
        policy="round-robin",
        outlier_detection=OutlierDetectionConfig(
            consecutive_failures=2,
            base_ejection_time_s=base_ejection_time_s,
            probe_interval_s=0.1,
            probe_timeout_s=1.0,  # a busy machine must not make a healthy echo pod miss its probes
        ),
        stream_timeouts=StreamTimeouts(first_token_s=FIRST_TOKEN_S, inter_token_s=INTER_TOKEN_S),
    )


def _client(echo: EchoFleet) -> openai.OpenAI:
    return openai.OpenAI(base_url=echo.router.http_url + "/v1", api_key="x", max_retries=0, timeout=30)


def _on_loop(echo: EchoFleet, action: Callable[[], None]) -> None:
    async def run() -> None:
        action()

    echo.loop.run(run())


@pytest.mark.parametrize("http", [pytest.param(False, id="grpc"), pytest.param(True, id="http")])
def test_a_dead_stub_is_retried_elsewhere_and_ejected(tmp_path: Path, http: bool) -> None:
    echo = EchoFleet(tmp_path, count=3, http=http, routing=_routing(base_ejection_time_s=60.0))
    try:
        echo.upstreams[0].fail_with = DEAD_STUB
        client = _client(echo)
        for i in range(12):  # round-robin sends every third request to the broken pod: none fails
            assert client.completions.create(model="tiny", prompt=f"p{i}", max_tokens=30).choices[0].text == f"p{i}"
        fleets = echo.router.router.fleets
        assert fleets.ejected("tiny") == {"echo0"}
        broken_answers = echo.upstreams[0].stats.requests
        assert broken_answers == 2  # two consecutive failures eject it; nothing reached it afterwards
        metrics = urllib.request.urlopen(echo.router.metrics_url, timeout=10).read().decode()
        assert 'trtfleet_router_upstream_retries_total{reason="pod_failed"} 2.0' in metrics
        assert 'trtfleet_router_pod_ejections_total{pod="echo0"} 1.0' in metrics
    finally:
        echo.close()


@pytest.mark.parametrize(
    ("error", "status"),
    [
        pytest.param("unexpected inference input 'foo' for model 'tensorrt_llm_bls'", 400, id="invalid"),
        pytest.param("something odd happened", 502, id="unknown"),
    ],
)
def test_request_errors_never_eject_a_pod(tmp_path: Path, error: str, status: int) -> None:
    echo = EchoFleet(tmp_path, count=2, routing=_routing())
    try:
        for upstream in echo.upstreams:
            upstream.fail_with = error
        client = _client(echo)
        for i in range(6):
            with pytest.raises(openai.APIStatusError) as info:
                client.completions.create(model="tiny", prompt=f"p{i}", max_tokens=30)
            assert info.value.status_code == status
        assert sum(u.stats.requests for u in echo.upstreams) == 6  # not retried
        assert echo.router.router.fleets.ejected("tiny") == frozenset()
    finally:
        echo.close()


def test_a_frozen_pod_ends_its_streams_retries_the_rest_and_is_ejected(tmp_path: Path) -> None:
    echo = EchoFleet(tmp_path, count=3, chunk_chars=1, chunk_delay_s=0.05, routing=_routing())
    try:
        client = _client(echo)
        prompt = "x" * 40  # 40 one-character pieces, 50 ms apart: streams run about 2 s
        started = threading.Barrier(7)
        outcomes: dict[int, tuple[str, float]] = {}

        def stream(index: int) -> None:
            ended = ""
            try:
                pieces = iter(client.completions.create(model="tiny", prompt=prompt, max_tokens=40, stream=True))
                text = next(pieces).choices[0].text
                started.wait(30)
                for chunk in pieces:
                    text += chunk.choices[0].text
                ended = "done" if text == prompt else f"wrong text {text!r}"
            except openai.APIError as exc:
                ended = f"error: {exc}"
            outcomes[index] = (ended, time.monotonic())

        threads = [threading.Thread(target=stream, args=(i,)) for i in range(6)]
        for thread in threads:
            thread.start()
        started.wait(30)
        frozen_at = time.monotonic()
        _on_loop(echo, echo.upstreams[0].freeze)
        on_frozen = echo.upstreams[0].stats.requests
        assert on_frozen == 2  # round-robin: two of the six streams are on the frozen pod

        # new requests while it is frozen: none fails (a silent first answer is retried elsewhere)
        texts = [
            client.completions.create(model="tiny", prompt=f"n{i}", max_tokens=30).choices[0].text for i in range(6)
        ]
        assert texts == [f"n{i}" for i in range(6)]
        for thread in threads:
            thread.join(30)
            assert not thread.is_alive(), "a stream hung"
        interrupted = [(text, at) for text, at in outcomes.values() if text != "done"]
        assert len(interrupted) == on_frozen
        assert all("broke after it started" in text and "stalled: no next answer" in text for text, _ in interrupted)
        assert all(at - frozen_at < 10 * INTER_TOKEN_S for _, at in interrupted)  # not the request deadline
        fleets = echo.router.router.fleets
        _eventually(lambda: fleets.ejected("tiny") == {"echo0"})
        _on_loop(echo, echo.upstreams[0].thaw)
        _eventually(lambda: not fleets.ejected("tiny"))
    finally:
        _on_loop(echo, echo.upstreams[0].thaw)
        echo.close()
