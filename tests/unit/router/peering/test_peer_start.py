"""A second router replica starts warm: real routers (in process) over echo upstreams, one peer stream.

Replica B's discovery lists the pods only after B has started its peer port (as Kubernetes discovery does:
its first snapshot is empty); B must copy A's view after that, before it serves, and route warm at once.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from pathlib import Path

import openai
from trtfleet_router.app import Router, RouterSettings
from trtfleet_router.discovery.static import FleetConfig, StaticDiscovery
from trtfleet_router.liveview import DiscoverySnapshot
from trtfleet_router.models_registry import ModelRegistry
from trtfleet_router.peering.peers import PeerSettings

from tests.unit.router.harness import EchoFleet


class ListedLater:
    """Static discovery whose first snapshot is empty; the pods come when the test says so."""

    def __init__(self, config: FleetConfig) -> None:
        self.static = StaticDiscovery(config=config)
        self.release = asyncio.Event()

    def initial(self) -> DiscoverySnapshot:
        return DiscoverySnapshot(ModelRegistry())

    async def run(self, apply: Callable[[DiscoverySnapshot], None]) -> None:
        await self.release.wait()
        apply(self.static.initial())
        await asyncio.Event().wait()


def test_a_replica_whose_discovery_lists_late_still_starts_warm(tmp_path: Path) -> None:
    tokens = tmp_path / "tokens"
    tokens.write_text("a-shared-token-of-the-replicas\n")
    echo = EchoFleet(tmp_path, peering=PeerSettings(port=0), internal_token_file=tokens)
    try:
        a = echo.router.router
        client = openai.OpenAI(base_url=f"{echo.router.http_url}/v1", api_key="x", max_retries=0)
        client.completions.create(model="a1", prompt="hi", max_tokens=4)
        assert a.metrics.adapter_loads.labels("a1").value == 1

        async def start_b() -> Router:
            discovery = ListedLater(FleetConfig.model_validate(echo.fleet))
            settings = RouterSettings(
                host="127.0.0.1",
                http_port=0,
                grpc_port=None,
                metrics_port=None,
                prewarm_interval_s=3600.0,
                peering=PeerSettings(port=0, seeds=(f"http://127.0.0.1:{a.peer_port}",)),
                internal_token_file=tokens,
            )
            b = Router(settings, discovery)
            starting = asyncio.create_task(b.start())
            while b.peer_port is None:  # the peer port is up: B now waits for its discovery to list
                await asyncio.sleep(0.01)
            assert not starting.done() and b.http_port is None
            discovery.release.set()
            await starting
            return b

        b = echo.loop.run(start_b())
        try:
            b_client = openai.OpenAI(base_url=f"http://127.0.0.1:{b.http_port}/v1", api_key="x", max_retries=0)
            assert b_client.completions.create(model="a1", prompt="hi", max_tokens=4).choices[0].text
            assert b.metrics.adapter_loads.labels("a1").value == 0  # warm from its first request
            assert b.metrics.adapter_cache_hits.labels("a1").value == 1
        finally:
            echo.loop.run(b.stop())
    finally:
        echo.close()
