"""The operator's calls to the routers' peer port carry the routers' internal token (``--router-token-file``): a
real router (echo upstreams) that requires it answers the demand and held requests of an operator that has it,
and of no other."""

from __future__ import annotations

from pathlib import Path

import aiohttp
from trtfleet_operator.config import AutoscaleConfig, MergeAdviceConfig
from trtfleet_operator.holdwatch import HoldWatch
from trtfleet_operator.mergeadvisor import RouterDemand
from trtfleet_router.peering.peers import PeerSettings

from tests.unit.router.harness import EchoFleet
from trtfleet.internalauth import TokenFile


def test_demand_and_held_requests_are_read_with_the_routers_token_only(tmp_path: Path) -> None:
    router_file, operator_file, stale_file = tmp_path / "router", tmp_path / "operator", tmp_path / "stale"
    router_file.write_text("the-routers-internal-token-01\n")
    operator_file.write_text("a-newer-token-not-yet-rolled-out\nthe-routers-internal-token-01\n")  # mid-rotation
    stale_file.write_text("a-token-the-router-never-had\n")
    echo = EchoFleet(tmp_path, count=1, peering=PeerSettings(port=0), internal_token_file=router_file)
    try:
        base = f"http://127.0.0.1:{echo.router.router.peer_port}"
        peers = MergeAdviceConfig(router_demand_urls=(base + "/fleet/v1/demand",))

        async def read(tokens: TokenFile | None) -> tuple[int, bool]:
            client = None  # fixed router URLs: the Kubernetes client is never called
            demand = RouterDemand(client, AutoscaleConfig(), peers, tokens=tokens)  # type: ignore[arg-type]
            watch = HoldWatch(client, AutoscaleConfig(), peers, tokens=tokens)  # type: ignore[arg-type]
            views = await demand.read("default")
            async with aiohttp.ClientSession() as session:
                held = await watch._ask(session, base, "tiny", None, 0.0)
            return len(views), held is not None

        assert echo.loop.run(read(TokenFile(operator_file))) == (1, True)
        assert echo.loop.run(read(TokenFile(stale_file))) == (0, False)
        assert echo.loop.run(read(None)) == (0, False)  # with a token file, no loopback client is let in either
    finally:
        echo.close()
