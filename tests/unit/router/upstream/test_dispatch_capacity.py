"""The dispatcher against echo upstreams: a request waits for LoRA cache capacity instead of a 503, and the
first response confirms a load (the next request for that adapter goes id-only, settled)."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from pathlib import Path

import openai
from trtfleet_router.routing import RoutingConfig
from trtfleet_router.upstream.capacity import DrainRate

from tests.unit.router.harness import EchoFleet


def _client(fleet: EchoFleet) -> openai.OpenAI:
    return openai.OpenAI(base_url=fleet.router.http_url + "/v1", api_key="unused", max_retries=0)


def _eventually(check: Callable[[], bool], timeout_s: float = 20.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not check():
        assert time.monotonic() < deadline, "condition not reached"
        time.sleep(0.01)


def _busy_then(fleet: EchoFleet, model: str) -> tuple[str, BaseException | None]:
    """Keep adapter a1 busy on the only pod (one cache page) while a request for ``model`` arrives: the
    stream (100 pieces, 50 ms apart) is held open until that request waits for capacity or has its answer,
    then closed, which frees the page."""
    client = _client(fleet)
    stream = client.completions.create(model="a1", prompt="x" * 200, max_tokens=200, stream=True)
    first = next(iter(stream))  # a1 admitted: the single page is pinned until the stream ends
    assert first.choices[0].text
    result: list[str] = []
    error: list[BaseException] = []

    def other() -> None:
        try:
            result.append(client.completions.create(model=model, prompt="p", max_tokens=8).choices[0].text)
        except openai.APIError as exc:
            error.append(exc)

    thread = threading.Thread(target=other)
    thread.start()
    waiting = fleet.router.router.metrics.capacity_waiting.labels("tiny")
    _eventually(lambda: waiting.value == 1 or not thread.is_alive())
    stream.close()  # the client goes away: the router cancels the stream and the page frees
    thread.join(timeout=20)
    assert not thread.is_alive(), "the competing request never ended"
    return (result[0] if result else ""), (error[0] if error else None)


def test_request_waits_for_a_busy_cache_then_runs(tmp_path: Path) -> None:
    echo = EchoFleet(tmp_path, count=1, host_pages=1, chunk_chars=2, chunk_delay_s=0.05)
    try:
        text, error = _busy_then(echo, "a2")
        assert error is None and text == "[102] p"
        fleet = echo.router.router.fleets.fleets["tiny"]
        assert fleet.is_warm("echo0", 102) and not fleet.is_warm("echo0", 101)
        metrics = echo.router.router.metrics
        assert metrics.capacity_waits.labels("tiny", "routed").value == 1
        assert metrics.capacity_waiting.labels("tiny").value == 0
        _eventually(lambda: echo.router.router.lifecycle.inflight == 0)
        echo.router.check_books()
    finally:
        echo.close()


def test_no_wait_configured_answers_503(tmp_path: Path) -> None:
    echo = EchoFleet(tmp_path, count=1, host_pages=1, chunk_chars=2, chunk_delay_s=0.05,
                     routing=RoutingConfig(capacity_wait_s=0))
    try:
        _text, error = _busy_then(echo, "a2")
        assert isinstance(error, openai.APIStatusError) and error.status_code == 503
        assert echo.router.router.metrics.capacity_waits.labels("tiny", "timed_out").value == 1
        _eventually(lambda: echo.router.router.lifecycle.inflight == 0)
        echo.router.check_books()
    finally:
        echo.close()


def test_a_hopeless_wait_is_answered_at_once_with_the_drain_estimate(tmp_path: Path) -> None:
    """Requests of the base model ended 5 s apart (on the drain estimate's own clock): with 2 s allowed to
    wait, a request that finds every cache busy is turned away at once, Retry-After 5."""
    echo = EchoFleet(tmp_path, count=1, host_pages=1, chunk_chars=2, chunk_delay_s=0.05,
                     routing=RoutingConfig(capacity_wait_s=2))
    try:
        clock = [100.0]
        echo.router.router.dispatcher.admission.capacity.drain = DrainRate(lambda: clock[0])
        client = _client(echo)
        for at in (100.0, 105.0):
            clock[0] = at
            client.completions.create(model="a1", prompt="p", max_tokens=8)
        _text, error = _busy_then(echo, "a2")
        assert isinstance(error, openai.APIStatusError) and error.status_code == 503
        assert error.response.headers["Retry-After"] == "5"
        metrics = echo.router.router.metrics
        assert metrics.capacity_waits.labels("tiny", "queue_full").value == 1  # turned away, never waited
        assert metrics.capacity_waits.labels("tiny", "timed_out").value == 0
        _eventually(lambda: echo.router.router.lifecycle.inflight == 0)
        echo.router.check_books()
    finally:
        echo.close()


def test_first_response_confirms_the_load(tmp_path: Path) -> None:
    echo = EchoFleet(tmp_path, count=1, host_pages=2, chunk_chars=2, chunk_delay_s=0.05)
    try:
        client = _client(echo)
        stream = client.completions.create(model="a1", prompt="a long answer here", max_tokens=40, stream=True)
        assert next(iter(stream)).choices[0].text
        pods = echo.router.router.fleets.fleets["tiny"]._residency  # the shadow (loading state)
        assert not pods.pod("echo0").is_loading(101)  # confirmed while the stream still runs
        list(stream)
        echo.router.check_books()
    finally:
        echo.close()
