"""The router's internal endpoints keep strangers out: real ``trtfleet router`` processes with the replicas' token
file, real reference workers, and a stranger's own HTTP server that would feed the router events if it were ever
subscribed to.

* without the token, or with a wrong one, a client can neither subscribe a router to its URL, read a snapshot,
  the demand, the held requests or ``/debug/fleets``, nor get its events applied, and the router's membership and
  view (read with the token) are as they were; the router's own requests to its peers carry the token;
* a router with peers and no credential refuses to start; the explicit opt-out starts and says what it exposes,
  and serves no ``/debug/fleets`` unless asked;
* the token rotated under traffic (each replica and the operator's client reading its own copy of the file,
  changed at different times, as the kubelet updates each pod's Secret volume) loses no request: every client
  request and every internal read succeeds, the streams reconnect from their watermarks without a gap, and both
  replicas keep each other's view.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import aiohttp
import openai
import pytest
from aiohttp import web

from tests.integration.router.replica_process import (
    TRTFLEET,
    RouterProcess,
    get,
    logged,
    new_token_file,
    open_stream,
    wait_for,
)
from tests.integration.router.support import ConvertedAdapter
from tests.support.loopthread import LoopThread
from trtfleet.internalauth import TokenFile, authorized_get, presented_bearer

pytestmark = pytest.mark.integration


class StrangerPeer:
    """An HTTP server the stranger controls: it records every request and answers ``/fleet/v1/events`` with a
    peer stream that claims every adapter resident on pod ``w0`` (what a router must never apply)."""

    def __init__(self, loop: LoopThread) -> None:
        self.loop = loop
        self.requests: list[tuple[str, str | None]] = []  # (path and query, bearer token presented)
        self.runner: web.AppRunner | None = None
        self.url = loop.run(self._start())

    async def _start(self) -> str:
        app = web.Application()
        app.router.add_get("/{tail:.*}", self._any)
        self.runner = web.AppRunner(app)
        await self.runner.setup()
        site = web.TCPSite(self.runner, "127.0.0.1", 0)
        await site.start()
        port = self.runner.addresses[0][1]
        return f"http://127.0.0.1:{port}"

    async def _any(self, request: web.Request) -> web.StreamResponse:
        self.requests.append((request.path_qs, presented_bearer(request.headers)))
        header = {"replica": "stranger", "seq": 3, "since": 0, "gap": False, "version": 2}
        lines = [json.dumps(header)] + [
            json.dumps([seq, "tiny", "w0", "uid", "put", seq, 40 + seq, 1]) for seq in (1, 2, 3)
        ]
        return web.Response(body="\n".join(lines) + "\n", content_type="application/x-ndjson")

    def close(self) -> None:
        if self.runner is not None:
            self.loop.run(self.runner.cleanup())


@pytest.fixture
def loop() -> Iterator[LoopThread]:
    thread = LoopThread()
    yield thread
    thread.close()


@pytest.fixture
def routers(fleet_file: Path, tmp_path: Path) -> Iterator[Callable[..., RouterProcess]]:
    started: list[RouterProcess] = []

    def start(*peers: RouterProcess, token_file: Path | None, extra: tuple[str, ...] = ()) -> RouterProcess:
        log_file = tmp_path / f"router{len(started)}.log"
        urls = tuple(p.peer_url for p in peers)
        router = RouterProcess(fleet_file, log_file, urls, extra=extra, token_file=token_file)
        started.append(router)
        return router

    yield start
    for router in started:
        router.stop()


def membership(router: RouterProcess) -> dict[str, Any]:
    """What a subscription or an applied event would change: the peers, the watermarks, the fleets' view."""
    snapshot = router.snapshot()
    return {key: snapshot[key] for key in ("peers", "watermarks", "seq", "fleets")}


def test_a_stranger_can_neither_subscribe_read_nor_inject(
    routers: Callable[..., RouterProcess], tmp_path: Path, loop: LoopThread
) -> None:
    token_file = new_token_file(tmp_path / "tokens")
    a = routers(token_file=token_file)
    b = routers(a, token_file=token_file)
    wait_for(lambda: b.snapshot()["replica"] in a.snapshot()["watermarks"], "A follows B (it subscribed back)")
    stranger = StrangerPeer(loop)
    try:
        before = membership(a)
        token = a.token
        assert token is not None
        subscribe = f"/fleet/v1/events?since=0&replica=stranger&advertise={stranger.url}&version=2"
        attempts = [
            a.peer_url + subscribe,
            a.peer_url + "/fleet/v1/snapshot",
            a.peer_url + "/fleet/v1/demand",
            a.peer_url + "/fleet/v1/held?base_model=tiny",
            f"http://127.0.0.1:{a.ports['metrics']}/debug/fleets",
        ]
        for presented in (None, "x" * len(token), token[:-1], token + "x", token.upper()):
            for url in attempts:
                status, body = get(url, presented)
                assert status == 401, (url, presented, status)
                assert token.encode() not in body
                assert membership(a) == before, url  # nothing subscribed to, nothing applied, read with the token
        assert open_stream(a.peer_url + subscribe + f"&token={token}", None)[0] == 401  # not in the query
        assert membership(a) == before
        assert all(token not in line for line in a.log_file.read_text().splitlines())
        assert not stranger.requests
        # The same subscription with the token is heard: the router's task to the URL starts at once, so the
        # stranger's server would have been asked before it had any of the attempts above been heard.
        status, header = open_stream(a.peer_url + subscribe.replace("replica=stranger", "replica=trusted"), token)
        assert status == 200 and json.loads(header)["replica"] == a.snapshot()["replica"]
        wait_for(lambda: bool(stranger.requests), "A subscribes to the URL an authenticated request advertised")
        assert {presented for _, presented in stranger.requests} == {token}  # its own requests carry the token
        assert all("replica=" in path for path, _ in stranger.requests)
    finally:
        stranger.close()


def test_replicas_without_a_credential_refuse_to_start_and_the_opt_out_says_what_it_exposes(
    routers: Callable[..., RouterProcess], fleet_file: Path
) -> None:
    refused = subprocess.run(
        [TRTFLEET, "router", "--fleet-config", str(fleet_file), "--host", "127.0.0.1", "--http-port", "0",
         "--grpc-port", "-1", "--metrics-port", "0", "--peer-port", "0", "--peer", "http://127.0.0.1:9"],
        capture_output=True, text=True, timeout=60, stdin=subprocess.DEVNULL,
    )  # fmt: skip
    assert refused.returncode != 0
    assert "--internal-token-file" in refused.stderr and "--no-internal-auth" in refused.stderr
    opened = routers(token_file=None, extra=("--no-internal-auth",))
    (warning,) = logged(opened, "internal endpoints without a credential (--no-internal-auth)")
    assert "feed this router residency and load events" in warning["exposes"]
    assert opened.snapshot()["replica"]  # open to anyone: read here without a token
    alone = routers(token_file=None)  # no token file, no peers: loopback clients only
    assert logged(alone, "internal endpoints answer loopback clients only (no --internal-token-file)")
    assert get(alone.peer_url + "/fleet/v1/demand", None)[0] == 200  # this test is such a client


def test_debug_endpoints_are_off_unless_asked(fleet_file: Path, tmp_path: Path) -> None:
    token_file = new_token_file(tmp_path / "tokens")
    router = RouterProcess(fleet_file, tmp_path / "r.log", (), token_file=token_file, debug=False)
    try:
        assert get(f"http://127.0.0.1:{router.ports['metrics']}/debug/fleets", router.token)[0] == 404
        assert get(f"http://127.0.0.1:{router.ports['metrics']}/metrics", None)[0] == 200  # Prometheus needs none
    finally:
        router.stop()


class InternalReader:
    """The operator's side of a rotation: reads both replicas' demand and held requests in a loop through
    :func:`trtfleet.internalauth.authorized_get` with its own copy of the token file, counting every answer."""

    def __init__(self, token_file: Path, urls: list[str]) -> None:
        self.tokens = TokenFile(token_file)
        self.urls = urls
        self.statuses: list[int] = []
        self.loop = LoopThread()
        self.stopping = threading.Event()
        self.future = asyncio.run_coroutine_threadsafe(self._run(), self.loop.loop)

    async def _run(self) -> None:
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=10)) as session:
            while not self.stopping.is_set():
                for url in self.urls:
                    async with authorized_get(session, url, self.tokens) as response:
                        self.statuses.append(response.status)
                await asyncio.sleep(0.02)

    def stop(self) -> None:
        self.stopping.set()
        self.future.result(30)
        self.loop.close()


class ClientTraffic:
    """Completions through both replicas in turn, from a thread, until stopped; every failure is kept."""

    def __init__(self, replicas: list[RouterProcess], adapter: ConvertedAdapter) -> None:
        self.clients = [replica.client() for replica in replicas]
        self.adapter = adapter
        self.answered = 0
        self.failures: list[BaseException] = []
        self.stopping = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        turn = 0
        while not self.stopping.is_set():
            client = self.clients[turn % len(self.clients)]
            turn += 1
            try:
                client.completions.create(model=self.adapter.name, prompt=f"rotation {turn}", max_tokens=2)
                self.answered += 1
            except openai.OpenAIError as exc:
                self.failures.append(exc)

    def stop(self) -> None:
        self.stopping.set()
        self.thread.join(60)


def test_rotating_the_token_under_traffic_loses_no_request(
    routers: Callable[..., RouterProcess], converted_adapters: list[ConvertedAdapter], tmp_path: Path
) -> None:
    old, new = "the-old-token-of-the-fleet-0001", "the-new-token-of-the-fleet-0002"
    files = {name: tmp_path / f"{name}-tokens" for name in ("a", "b", "operator")}
    for path in files.values():
        path.write_text(f"{old}\n")
    a = routers(token_file=files["a"])
    b = routers(a, token_file=files["b"])
    wait_for(lambda: b.snapshot()["replica"] in a.snapshot()["watermarks"], "A follows B")
    ids = {"a": a.snapshot()["replica"], "b": b.snapshot()["replica"]}
    urls = [f"{r.peer_url}{path}" for r in (a, b) for path in ("/fleet/v1/demand", "/fleet/v1/held?base_model=tiny")]
    reader = InternalReader(files["operator"], urls)
    traffic = ClientTraffic([a, b], converted_adapters[0])

    def connected(router: RouterProcess, origin: str) -> int:
        return sum(1 for line in logged(router, "peer connected") if line["replica"] == origin)

    def step(name: str, text: str) -> None:
        """One copy of the file changes, then requests and streams run on until the change is seen."""
        files[name].write_text(text)
        served = len(reader.statuses) + traffic.answered
        wait_for(lambda: len(reader.statuses) + traffic.answered > served + 20, f"traffic after {name} changed")

    try:
        for name in ("a", "operator", "b"):  # step 1, one copy at a time: the new token first, the old one kept
            step(name, f"{new}\n{old}\n")
        reconnects = {"a": connected(a, ids["b"]), "b": connected(b, ids["a"])}
        for name in ("operator", "b", "a"):  # step 2: the old token goes; streams it opened end and reconnect
            step(name, f"{new}\n")
        wait_for(lambda: connected(b, ids["a"]) > reconnects["b"], "B's stream from A reopened with the new token")
        wait_for(lambda: connected(a, ids["b"]) > reconnects["a"], "A's stream from B reopened with the new token")
    finally:
        traffic.stop()
        reader.stop()
    assert not traffic.failures and traffic.answered > 0
    assert reader.statuses and set(reader.statuses) == {200}, sorted(set(reader.statuses))
    assert a.counter("peer_stream_gaps") == 0 and b.counter("peer_stream_gaps") == 0  # reconnected from watermarks
    snapshot_url = a.peer_url + "/fleet/v1/snapshot"
    assert get(snapshot_url, old)[0] == 401 and get(snapshot_url, new)[0] == 200
    # both still sync: what one replica loads now is in the other's view, and the views agree
    for router, other in ((a, b), (b, a)):
        adapter = converted_adapters[2 if router is a else 1]
        router.client().completions.create(model=adapter.name, prompt="after the rotation", max_tokens=2)
        wait_for(lambda adapter=adapter, other=other: any(
            task == adapter.task_id for pod in other.snapshot()["fleets"]["tiny"]["pods"] for task, _ in pod["resident"]
        ), "the other replica's view holds what this one loaded")
    wait_for(lambda: a.snapshot()["fleets"] == b.snapshot()["fleets"], "the two views agree", 10)
