"""Slow and half-open HTTP clients (raw sockets against a real router): a connection that sends no whole
request head is closed after the header timeout, a body that does not arrive in time is answered 408 in
the front end's error format and the connection closed; none of it reaches a pod."""

from __future__ import annotations

import json
import socket
import time
from collections.abc import Iterator

import pytest
from trtfleet_router.server.common import FrontendSettings

from tests.unit.router.harness import EchoFleet

TIMEOUT_S = 0.5
WAIT_S = 20.0  # far above the timeouts: only a router that never closes reaches it


@pytest.fixture(scope="module")
def echo(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EchoFleet]:
    settings = FrontendSettings(header_timeout_s=TIMEOUT_S, body_timeout_s=TIMEOUT_S)
    fleet = EchoFleet(tmp_path_factory.mktemp("timeouts"), count=1, frontend=settings)
    try:
        yield fleet
    finally:
        fleet.close()


def _connect(echo: EchoFleet) -> socket.socket:
    sock = socket.create_connection(("127.0.0.1", echo.router.router.http_port), timeout=WAIT_S)
    return sock


def _read_until_closed(sock: socket.socket) -> tuple[bytes, float]:
    """Everything the router sends until it closes; and how long that took."""
    started = time.monotonic()
    data = b""
    while chunk := sock.recv(65536):
        data += chunk
    return data, time.monotonic() - started


@pytest.mark.parametrize(
    "sent",
    [
        pytest.param(b"", id="nothing"),
        pytest.param(b"POST /v1/completions HTTP/1.1\r\nHost: router\r\n", id="half a request head"),
    ],
)
def test_a_connection_without_a_request_head_is_closed(echo: EchoFleet, sent: bytes) -> None:
    with _connect(echo) as sock:
        sock.sendall(sent)
        data, took_s = _read_until_closed(sock)
    assert data == b"" and took_s < WAIT_S / 2


@pytest.mark.parametrize(
    ("path", "error_of"),
    [
        pytest.param("/v1/completions", lambda doc: doc["error"]["message"], id="openai"),
        pytest.param("/v2/models/a1/generate", lambda doc: doc["error"], id="triton generate"),
        pytest.param("/v2/models/a1/infer", lambda doc: doc["error"], id="triton infer"),
    ],
)
def test_a_body_that_does_not_arrive_is_answered_408_and_closed(echo: EchoFleet, path: str, error_of: object) -> None:
    before = echo.upstreams[0].stats.requests
    head = f"POST {path} HTTP/1.1\r\nHost: router\r\nContent-Type: application/json\r\nContent-Length: 1000\r\n\r\n"
    with _connect(echo) as sock:
        sock.sendall(head.encode() + b"{")
        data, took_s = _read_until_closed(sock)
    assert took_s < WAIT_S / 2
    status_line, _, rest = data.partition(b"\r\n")
    assert status_line.startswith(b"HTTP/1.1 408")
    body = json.loads(rest.partition(b"\r\n\r\n")[2])
    assert "did not arrive" in error_of(body)  # type: ignore[operator]
    assert echo.upstreams[0].stats.requests == before


def test_a_keep_alive_client_is_served_before_its_connection_idles_out(echo: EchoFleet) -> None:
    body = json.dumps({"model": "a1", "prompt": "hi", "max_tokens": 8}).encode()
    head = (
        "POST /v1/completions HTTP/1.1\r\nHost: router\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\n\r\n"
    )
    with _connect(echo) as sock:
        sock.sendall(head.encode() + body)
        data, _ = _read_until_closed(sock)  # served, then closed once idle for the header timeout
    assert data.startswith(b"HTTP/1.1 200") and b"[101] hi" in data
