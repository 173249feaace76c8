"""The KV-event poller against real HTTP servers: events land in the fleet's prefix index; a pod without the
route is not asked again; a payload in the wrong format changes nothing."""

from __future__ import annotations

import asyncio
from typing import Any

import aiohttp
from aiohttp import web
from trtfleet_router.chat import chat_renderer
from trtfleet_router.liveview import DiscoverySnapshot, FleetSet, PodEndpoint
from trtfleet_router.models_registry import BaseModelEntry, EngineLimits, ModelRegistry
from trtfleet_router.routing import parse_routing_config
from trtfleet_router.routing.prefix import payload_block_hashes, reference_prompt_payload
from trtfleet_router.upstream.kvevents_poller import KvEventPoller

from trtfleet.api.basemodel import Runtime

PROMPT = "x" * 70  # <bos> + 70 bytes + <sep>: 72 tokens, two full blocks of 32


def stored_events() -> list[dict[str, Any]]:
    ids = [257] + [ord("x")] * 70 + [259]
    blocks = [{"type": "stored_block", "block_hash": 100 + i, "lora_id": 0, "cache_level": 0, "priority": 35,
               "tokens": [{"type": "unique_token", "token_id": t, "token_extra_id": 0}
                          for t in ids[32 * i : 32 * i + 32]]}
              for i in range(2)]
    return [{"event_id": 1, "window_size": 72, "data": {"type": "stored", "parent_hash": None, "blocks": blocks}}]


async def serve(handler: Any) -> tuple[web.AppRunner, str]:
    app = web.Application()
    app.router.add_post("/kv_cache_events", handler)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]
    return runner, f"127.0.0.1:{port}"


def test_poller_applies_events_and_skips_pods_without_them() -> None:
    async def scenario() -> None:
        calls = {"good": 0, "bad": 0}
        answers = [stored_events()]

        async def good(_request: web.Request) -> web.Response:
            calls["good"] += 1
            return web.json_response(answers.pop() if answers else [])

        async def bad(_request: web.Request) -> web.Response:
            calls["bad"] += 1
            return web.json_response({"not": "a list"})

        servers = [await serve(good), await serve(bad)]
        none_runner = web.AppRunner(web.Application())  # no /kv_cache_events route: 404
        await none_runner.setup()
        none_site = web.TCPSite(none_runner, "127.0.0.1", 0)
        await none_site.start()
        none_address = f"127.0.0.1:{none_runner.addresses[0][1]}"
        try:
            base = BaseModelEntry("tiny", "reference", EngineLimits(512, 1024), chat_renderer("reference"),
                                  bytes_per_token=1.0, runtime=Runtime.PYTORCH)
            fleets = FleetSet(parse_routing_config({}), seed=1)
            pods = {"good": PodEndpoint("good", servers[0][1], "u1"), "bad": PodEndpoint("bad", servers[1][1], "u2"),
                    "none": PodEndpoint("none", none_address, "u3")}
            fleets.apply(DiscoverySnapshot(ModelRegistry([base], []), {"tiny": pods}))
            poller = KvEventPoller(fleets)
            async with aiohttp.ClientSession() as session:
                await poller.poll_once(session)
                await poller.poll_once(session)
            hashes = payload_block_hashes(reference_prompt_payload(PROMPT), 0, 32).hashes
            index = fleets.fleets["tiny"].prefix_index
            assert index.match(hashes) == {"good": 2}
            assert calls == {"good": 2, "bad": 2}
            assert poller.silent == {("none", "u3")}
            fleets.fleets["tiny"].check_invariants()
        finally:
            for runner, _ in servers:
                await runner.cleanup()
            await none_runner.cleanup()

    asyncio.run(scenario())
