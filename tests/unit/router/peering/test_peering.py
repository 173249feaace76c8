"""The peering shell's parts: the event ring, the peer port's answers, a subscriber (snapshots:
``test_view.py``)."""

from __future__ import annotations

import asyncio
import json
import socket
import time

import pytest
from aiohttp.test_utils import TestClient, TestServer
from trtfleet_router.internalaccess import AccessMode, InternalAccess
from trtfleet_router.liveview import DiscoverySnapshot, FleetSet
from trtfleet_router.metrics import RouterMetrics
from trtfleet_router.models_registry import ModelRegistry
from trtfleet_router.peering.journal import EventLog
from trtfleet_router.peering.peers import OriginState, Peers, PeerSettings
from trtfleet_router.peering.server import PeerServer
from trtfleet_router.routing import (
    Decision,
    Outcome,
    RouteRequest,
    parse_routing_config,
)
from trtfleet_router.routing.events import EventKind, decode_event, encode_event

from tests.unit.router.peering.support import Membership, Replica

OPEN = InternalAccess(AccessMode.OPEN)  # the protocol's tests; who may use the port: test_internal_access.py


@pytest.mark.parametrize(
    ("since", "gap", "seqs"),
    [
        pytest.param(0, True, [3, 4, 5], id="older than the ring: gap"),
        pytest.param(2, False, [3, 4, 5], id="just at the ring's start"),
        pytest.param(4, False, [5], id="the tail"),
        pytest.param(5, False, [], id="up to date"),
        pytest.param(9, False, [], id="ahead (another incarnation)"),
    ],
)
def test_event_ring_tells_a_gap(since: int, gap: bool, seqs: list[int]) -> None:
    journal = EventLog("me", ring_events=3)
    for ticket in range(1, 6):
        journal.record("m", "p0", "u", EventKind.ACQUIRE, ticket)  # no event loop: flushed at once
    found_gap, lines = journal.after(since)
    assert found_gap is gap
    assert [decode_event("me", line).seq for line in lines] == seqs


def test_the_ring_carries_a_requests_block_hashes() -> None:
    journal = EventLog("me")
    journal.record("m", "p0", "u", EventKind.PUT, 1, 7, 2, (3, 2**64 - 1))
    journal.record("m", "p0", "u", EventKind.ACQUIRE, 2, 7)
    _gap, lines = journal.after(0)
    assert [decode_event("me", line).blocks for line in lines] == [(3, 2**64 - 1), ()]
    assert lines[0] == encode_event(decode_event("me", lines[0]))  # the same bytes as the codec


def test_events_of_one_loop_turn_are_flushed_together() -> None:
    async def scenario() -> None:
        journal = EventLog("me")
        for ticket in range(3):
            journal.record("m", "p0", "u", EventKind.ACQUIRE, ticket)
        assert journal.after(0) == (False, []) and journal.seq == 3  # pending until the turn ends
        await journal.wait_beyond(0, timeout_s=5)
        assert len(journal.after(0)[1]) == 3

    asyncio.run(scenario())


def _served_fleets() -> tuple[EventLog, FleetSet]:
    """Replica "srv"'s journal and its (empty) fleets, for a peer port."""
    journal = EventLog("srv")
    fleets = FleetSet(parse_routing_config({"policy": "trtfleet"}), journal=journal)
    fleets.apply(DiscoverySnapshot(ModelRegistry(), {}))
    return journal, fleets


def test_peer_port_streams_events_and_refuses_bad_requests() -> None:
    async def scenario() -> None:
        journal, fleets = _served_fleets()
        membership = Membership()
        server = PeerServer(journal, fleets, membership, access=OPEN, heartbeat_s=0.05)
        async with TestClient(TestServer(server.app())) as client:
            assert (await client.get("/fleet/v1/events", params={"since": "x"})).status == 400
            assert (await client.get("/fleet/v1/events", params={"replica": "srv"})).status == 409
            for bad in ("2.0", "0"):
                assert (await client.get("/fleet/v1/events", params={"version": bad})).status == 400
            response = await client.get(
                "/fleet/v1/events", params={"since": "0", "replica": "sub", "advertise": "http://sub:1"}
            )
            assert response.status == 200
            header = json.loads(await response.content.readline())
            assert header == {"replica": "srv", "seq": 0, "since": 0, "gap": False, "version": 1}
            assert membership.heard == [("sub", "http://sub:1")]
            assert await response.content.readline() == b"\n"  # a heartbeat while idle
            journal.record("m", "p0", "u", EventKind.ACQUIRE, 5)
            line = await response.content.readline()
            while line == b"\n":
                line = await response.content.readline()
            assert decode_event("srv", line).ticket == 5
            server.close()
            snapshot = await (await client.get("/fleet/v1/snapshot")).json()
            assert snapshot["replica"] == "srv" and snapshot["seq"] == 1
            demand = await (await client.get("/fleet/v1/demand")).json()
            assert demand["base_models"] == {}

    asyncio.run(scenario())


def test_the_ring_holds_the_codecs_bytes() -> None:
    journal = EventLog("me")
    journal.record("base/ü", "p0", 'u"1', EventKind.PUT, 3, 1001, 4)
    journal.record("m", "p0", "u", EventKind.POD_RESET)
    _, lines = journal.after(0)
    assert [encode_event(decode_event("me", line)) for line in lines] == lines
    assert decode_event("me", lines[0]).pod_uid == 'u"1'


def test_the_ring_writes_a_batch_lines_class_for_subscribers_of_version_2_only() -> None:
    journal = EventLog("me")
    journal.record("m", "p0", "u", EventKind.PUT, 1, 7, 2, (), True)
    journal.record("m", "p0", "u", EventKind.ACQUIRE, 2, 7, 0, (3,), True)
    journal.record("m", "p0", "u", EventKind.ACQUIRE, 3, 7)
    journal.record("m", "p0", "u", EventKind.RELEASE, 1)
    _, old = journal.after(0)
    _, new = journal.after(0, version=2)
    assert [decode_event("me", line).background for line in old] == [False] * 4
    assert [decode_event("me", line).background for line in new] == [True, True, False, False]
    assert old[2:] == new[2:]  # the same bytes where there is no class to tell
    for version, lines in ((1, old), (2, new)):  # the codec's bytes, either way
        assert [encode_event(decode_event("me", line), version) for line in lines] == lines
    assert decode_event("me", new[1]).blocks == (3,)


def test_a_subscriber_of_version_2_gets_the_class_over_the_peer_port() -> None:
    async def scenario() -> None:
        journal, fleets = _served_fleets()
        journal.record("m", "p0", "u", EventKind.ACQUIRE, 5, None, 0, (), True)
        server = PeerServer(journal, fleets, Membership(), access=OPEN, heartbeat_s=0.05)
        async with TestClient(TestServer(server.app())) as client:
            for asked, version, background in (("2", 2, True), ("9", 2, True), (None, 1, False)):
                params = {"since": "0"} | ({} if asked is None else {"version": asked})
                response = await client.get("/fleet/v1/events", params=params)
                assert json.loads(await response.content.readline())["version"] == version
                assert decode_event("srv", await response.content.readline()).background is background
                response.close()
            server.close()

    asyncio.run(scenario())


def _peers(settings: PeerSettings) -> Peers:
    fleets = FleetSet(parse_routing_config({"policy": "trtfleet"}), journal=EventLog("me"))
    assert isinstance(fleets.journal, EventLog)
    return Peers(fleets.journal, fleets, RouterMetrics(), settings)


def test_a_replica_alone_starts_at_once_and_one_with_dead_peers_within_the_bound() -> None:
    async def scenario() -> None:
        alone = _peers(PeerSettings())
        assert await alone.sync() is False
        with socket.socket() as probe:  # a port nothing listens on
            probe.bind(("127.0.0.1", 0))
            closed = probe.getsockname()[1]
        peers = _peers(PeerSettings(seeds=(f"http://127.0.0.1:{closed}",), sync_timeout_s=0.5))
        started = time.monotonic()
        assert await peers.sync() is False
        assert time.monotonic() - started < 5.0
        await peers.close()

    asyncio.run(scenario())


def test_a_headless_service_name_resolves_to_peer_urls() -> None:
    async def scenario() -> None:
        peers = _peers(PeerSettings(dns="localhost:8082"))
        urls = await peers._resolve()
        assert "http://127.0.0.1:8082" in urls
        assert await _peers(PeerSettings(dns="no-such-name.invalid:8082"))._resolve() == []

    asyncio.run(scenario())


def test_the_advertised_url_defaults_to_the_loopback_for_a_wildcard_host() -> None:
    peers = _peers(PeerSettings())
    peers.listening("0.0.0.0", 8123)
    assert peers.advertise_url == "http://127.0.0.1:8123"
    given = _peers(PeerSettings(advertise_url="http://10.1.2.3:8082/"))
    given.listening("0.0.0.0", 8123)
    assert given.advertise_url == "http://10.1.2.3:8082"
    assert given.known_peers() == {"me": "http://10.1.2.3:8082"}


def test_a_subscriber_that_missed_events_the_ring_dropped_forgets_that_replicas_requests() -> None:
    async def scenario() -> None:
        a_journal = EventLog("a", ring_events=4)
        a_fleets = FleetSet(parse_routing_config({"policy": "trtfleet"}), journal=a_journal)
        server = PeerServer(a_journal, a_fleets, Membership(), access=OPEN, heartbeat_s=0.05)
        b = Replica("b")
        b_fleets = FleetSet(parse_routing_config({"policy": "trtfleet"}), journal=b.journal)
        b_fleets.fleets["m"] = b.fleet
        metrics = RouterMetrics()
        async with TestServer(server.app()) as test_server:
            url = str(test_server.make_url("")).rstrip("/")
            peers = Peers(b.journal, b_fleets, metrics, PeerSettings(seeds=(url,), advertise_url="http://b:1"))
            # b once followed a up to seq 1: a's request 1 is in flight in b's view
            b.fleet.apply_remote(decode_event("a", b'[1,"m","p0","uid-p0","acquire",1,5]\n'))
            peers.origins["a"] = OriginState(watermark=1)
            peers._url_origin[url] = "a"
            for ticket in range(2, 12):  # a moved on; its ring keeps only the last 4
                a_journal.record("m", "p1", "uid-p1", EventKind.ACQUIRE, ticket)
            peers._subscribe(url)
            try:
                deadline = time.monotonic() + 10
                while metrics.peer_stream_gaps.labels().value < 1 or peers.origins["a"].watermark < a_journal.seq:
                    assert time.monotonic() < deadline, "the gap was never noticed"
                    await asyncio.sleep(0.01)
            finally:
                server.close()
                await peers.close()
            assert [t for _, _, t in b.fleet.remote.tickets() if t.pod_id == "p0"] == []  # request 1 forgotten
            assert b.fleet.pods["p1"].load.remote_inflight == 4  # the 4 requests the ring still had

    asyncio.run(scenario())


def test_a_subscribing_replica_leaves_the_origins_batch_lines_out_of_interactive_load() -> None:
    async def scenario() -> None:
        a, b = Replica("a"), Replica("b")
        a_fleets = FleetSet(parse_routing_config({"policy": "trtfleet"}), journal=a.journal)
        a_fleets.fleets["m"] = a.fleet
        server = PeerServer(a.journal, a_fleets, Membership(), access=OPEN, heartbeat_s=0.05)
        b_fleets = FleetSet(parse_routing_config({"policy": "trtfleet"}), journal=b.journal)
        b_fleets.fleets["m"] = b.fleet
        async with TestServer(server.app()) as test_server:
            url = str(test_server.make_url("")).rstrip("/")
            peers = Peers(b.journal, b_fleets, RouterMetrics(), PeerSettings(seeds=(url,), advertise_url="http://b:1"))
            lines = [
                a.fleet.start(Decision("p0", False, True, "t", "t"), RouteRequest("m", None, 1, 1, background=True))
                for _ in range(2)
            ]
            chat = a.fleet.start(Decision("p0", False, True, "t", "t"), RouteRequest("m", None, 1, 1))
            peers._subscribe(url)
            load = b.fleet.pods["p0"].load
            try:
                deadline = time.monotonic() + 10
                while load.remote_inflight < 3:
                    assert time.monotonic() < deadline, "b never saw a's requests"
                    await asyncio.sleep(0.01)
                assert (load.remote_background, load.foreground(100.0), load.load(100.0)) == (2, 1, 3)
                for ticket in [*lines, chat]:
                    a.fleet.finish(ticket, Outcome.OK)
                while load.remote_inflight:
                    assert time.monotonic() < deadline, "b never saw a's requests end"
                    await asyncio.sleep(0.01)
                assert load.remote_background == 0
                b.fleet.check_invariants()
            finally:
                server.close()
                await peers.close()

    asyncio.run(scenario())
