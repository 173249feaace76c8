"""Who may use the router's internal endpoints (``trtfleet_router.internalaccess``): the mode a router's flags
choose, and the check every peer-port request passes before it can change anything."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest
from aiohttp.test_utils import TestClient, TestServer, make_mocked_request
from trtfleet_router.internalaccess import AccessMode, InternalAccess, choose_access
from trtfleet_router.liveview import DiscoverySnapshot, FleetSet
from trtfleet_router.models_registry import ModelRegistry
from trtfleet_router.peering.journal import EventLog
from trtfleet_router.peering.server import PeerServer
from trtfleet_router.routing import parse_routing_config

from tests.unit.router.peering.support import Membership
from trtfleet.internalauth import TokenFile

TOKEN = "the-replicas-shared-token-1"


@pytest.mark.parametrize(
    ("token_file", "open_access", "peers", "mode"),
    [
        pytest.param(Path("t"), False, True, AccessMode.TOKEN, id="token, peers configured"),
        pytest.param(Path("t"), False, False, AccessMode.TOKEN, id="token, alone"),
        pytest.param(None, True, True, AccessMode.OPEN, id="opt-out, peers configured"),
        pytest.param(None, False, False, AccessMode.LOOPBACK, id="nothing, alone: loopback only"),
    ],
)
def test_the_flags_choose_the_mode(token_file: Path | None, open_access: bool, peers: bool, mode: AccessMode) -> None:
    assert choose_access(token_file, open_access, peers) is mode


@pytest.mark.parametrize(
    ("token_file", "open_access", "message"),
    [
        pytest.param(None, False, "--peer/--peer-dns without a credential", id="peers without a credential"),
        pytest.param(Path("t"), True, "not both", id="token and opt-out"),
    ],
)
def test_flags_that_leave_replicas_open_by_accident_stop_the_start(
    token_file: Path | None, open_access: bool, message: str
) -> None:
    with pytest.raises(ValueError, match=message):
        choose_access(token_file, open_access, True)


class _Transport:
    """The one thing aiohttp asks a transport for a request's remote address."""

    def __init__(self, address: str) -> None:
        self.address = address

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return (self.address, 40000) if name == "peername" else default


@pytest.mark.parametrize(
    ("remote", "admitted"),
    [
        pytest.param("127.0.0.1", True, id="IPv4 loopback"),
        pytest.param("127.3.4.5", True, id="anywhere in 127/8"),
        pytest.param("::1", True, id="IPv6 loopback"),
        pytest.param("10.0.0.7", False, id="a pod address"),
        pytest.param("::ffff:10.0.0.7", False, id="IPv4-mapped pod address"),
    ],
)
def test_without_a_credential_only_loopback_clients_are_let_in(remote: str, admitted: bool) -> None:
    request = make_mocked_request("GET", "/fleet/v1/snapshot", transport=_Transport(remote))
    assert InternalAccess(AccessMode.LOOPBACK).admits(request) is admitted
    assert InternalAccess(AccessMode.OPEN).admits(request)


def test_the_peer_port_answers_only_with_the_token_and_a_refusal_changes_nothing(tmp_path: Path) -> None:
    path = tmp_path / "tokens"
    path.write_text(f"{TOKEN}\n")
    access = InternalAccess(AccessMode.TOKEN, TokenFile(path))

    async def scenario() -> None:
        journal = EventLog("srv")
        fleets = FleetSet(parse_routing_config({"policy": "trtfleet"}), journal=journal)
        fleets.apply(DiscoverySnapshot(ModelRegistry(), {}))
        membership = Membership()
        server = PeerServer(journal, fleets, membership, access=access, heartbeat_s=0.05)
        subscribe = {"since": "0", "replica": "evil", "advertise": "http://10.9.9.9:18999"}
        async with TestClient(TestServer(server.app())) as client:
            for headers in ({}, {"Authorization": "Bearer wrong-token-of-the-same-size"}, {"Authorization": TOKEN}):
                for path_, params in (("/fleet/v1/events", subscribe), ("/fleet/v1/snapshot", {}),
                                      ("/fleet/v1/demand", {}), ("/fleet/v1/held", {"base_model": "m"})):
                    response = await client.get(path_, params=params, headers=headers)
                    assert response.status == 401, (path_, headers)
                    assert response.headers["WWW-Authenticate"].startswith("Bearer")
                    assert TOKEN not in await response.text()
            assert membership.heard == []  # nobody was subscribed to
            good = {"Authorization": f"Bearer {TOKEN}"}
            snapshot = await client.get("/fleet/v1/snapshot", headers=good)
            assert snapshot.status == 200 and (await snapshot.json())["replica"] == "srv"
            stream = await client.get("/fleet/v1/events", params=subscribe, headers=good)
            assert stream.status == 200 and json.loads(await stream.content.readline())["replica"] == "srv"
            assert membership.heard == [("evil", "http://10.9.9.9:18999")]  # an admitted subscriber only
            path.write_text("the-next-token-after-rotation\n")  # this stream's token is taken out: it ends
            assert set(await asyncio.wait_for(stream.content.read(), 5)) <= set(b"\n")  # heartbeats, then its end
            server.close()

    asyncio.run(scenario())
