"""A broken or hostile peer's event stream (hypothesis, derandomized; :mod:`tests.support.portfuzz`): garbage
headers, wrong versions, lines of the wrong shape, huge lines, bytes that are not UTF-8, served over real HTTP to a
replica's subscriber (:class:`~trtfleet_router.peering.peers.Peers`). The subscriber never crashes: a stream ends
only with one of :data:`~trtfleet_router.peering.peers.STREAM_FAILURES` (retried by its loop) or at its end; a
stream whose header is refused changes nothing; whatever a stream applied leaves the fleet's books consistent."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest
from aiohttp import web
from hypothesis import given
from trtfleet_router.liveview import FleetSet
from trtfleet_router.metrics import RouterMetrics
from trtfleet_router.peering import PeerProtocolError
from trtfleet_router.peering.peers import STREAM_FAILURES, Peers, PeerSettings
from trtfleet_router.peering.view import export_view
from trtfleet_router.routing import parse_routing_config

from tests.support.loopthread import LoopThread
from tests.support.portfuzz import FUZZ, stream_bodies
from tests.unit.router.peering.support import Replica


class FakePeer:
    """A real HTTP server whose ``/fleet/v1/events`` answers whatever body the test sets."""

    def __init__(self, loop: LoopThread) -> None:
        self.loop = loop
        self.body = b""
        self.runner = web.AppRunner(self._app())
        self.url = loop.run(self._start())

    def _app(self) -> web.Application:
        app = web.Application()
        app.router.add_get("/fleet/v1/events", self._events)
        return app

    async def _events(self, request: web.Request) -> web.Response:
        return web.Response(body=self.body, content_type="application/x-ndjson")

    async def _start(self) -> str:
        await self.runner.setup()
        site = web.TCPSite(self.runner, "127.0.0.1", 0)
        await site.start()
        return f"http://127.0.0.1:{self.runner.addresses[0][1]}"


@pytest.fixture(scope="module")
def peer() -> Iterator[FakePeer]:
    loop = LoopThread()
    fake = FakePeer(loop)
    yield fake
    loop.run(fake.runner.cleanup())
    loop.close()


def _state(replica: Replica, peers: Peers) -> Any:
    view = export_view({"m": replica.fleet}, "b", replica.journal.seq, peers.watermarks(), peers.known_peers())
    return json.dumps(view, sort_keys=True), sorted((o, s.watermark, s.connected) for o, s in peers.origins.items())


@FUZZ
@given(body=stream_bodies(("m", "p0", "uid-p0")))
def test_a_broken_peers_stream_never_crashes_the_subscriber(peer: FakePeer, body: bytes) -> None:
    replica = Replica("b")
    fleets = FleetSet(parse_routing_config({"policy": "trtfleet"}), journal=replica.journal)
    fleets.fleets["m"] = replica.fleet
    peers = Peers(replica.journal, fleets, RouterMetrics(), PeerSettings(seeds=(peer.url,), advertise_url="http://b:1"))
    peer.body = body
    before = _state(replica, peers)

    async def follow_once() -> BaseException | None:
        try:
            await peers._stream(peer.url)
        except STREAM_FAILURES as exc:
            return exc
        finally:
            await peers.close()
        return None

    ended = peer.loop.run(follow_once())
    if isinstance(ended, PeerProtocolError):  # the header was refused: nothing of the stream was taken
        assert _state(replica, peers) == before
    assert not any(state.connected for state in peers.origins.values())  # the stream is over either way
    replica.fleet.check_invariants()
