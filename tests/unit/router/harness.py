"""Test harness for the router: converted-adapter artifacts, an event loop thread, in-process fleets.

:class:`LoopThread` runs an asyncio loop in a thread so tests can drive the router with the real
synchronous clients (``openai``, ``tritonclient.http``/``grpc``). :class:`EchoFleet` starts echo
upstreams (real gRPC servers implementing the LoRA cache contract) and a router in front of them.
Integration tests reuse :class:`RouterThread` with reference workers instead of echo upstreams.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any, TypeVar

import grpc
import numpy as np
from aiohttp import web
from trtfleet_router.app import Router, RouterSettings
from trtfleet_router.discovery.static import FleetConfig, StaticDiscovery
from trtfleet_router.testing.echo import EchoUpstream, echo_http_app, serve_echo

from tests.support.loopthread import LoopThread

T = TypeVar("T")


def write_artifact(directory: Path, *, rows: int = 4, width: int = 16, seed: int = 0, dtype: str = "float16") -> str:
    """A converted adapter like ``trtfleet lora convert`` writes; returns the weights sha256."""
    directory.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    weights = rng.standard_normal((1, rows, width)).astype(np.float16)
    if dtype == "bfloat16":
        weights = weights.view(np.uint16).astype(np.uint16).view("V2")
    np.save(directory / "model.lora_weights.npy", weights)
    np.save(directory / "model.lora_config.npy", np.array([[[1, i, 8] for i in range(rows)]], np.int32))
    digests = {
        name: {
            "sha256": hashlib.sha256((directory / name).read_bytes()).hexdigest(),
            "size_bytes": (directory / name).stat().st_size,
        }
        for name in ("model.lora_weights.npy", "model.lora_config.npy")
    }
    manifest = {
        "format": "trtfleet.lora/v1",
        "outputs": digests,
        "rank": 8,
        "modules": ["attn_q"],
        "weights_bytes": int(weights.nbytes),
    }
    (directory / "manifest.json").write_text(json.dumps(manifest, sort_keys=True))
    return str(digests["model.lora_weights.npy"]["sha256"])


class RouterThread:
    """A :class:`Router` on a :class:`LoopThread`, with its bound ports."""

    def __init__(self, loop: LoopThread, fleet: dict[str, Any], **settings: Any) -> None:
        self.loop = loop
        config = FleetConfig.model_validate(fleet)
        defaults: dict[str, Any] = {
            "host": "127.0.0.1",
            "http_port": 0,
            "grpc_port": 0,
            "metrics_port": 0,
            "seed": 7,
            "prewarm_interval_s": 3600.0,
            "debug_endpoints": True,  # the tests read a router's view from /debug/fleets (loopback: no token)
        }
        self.router = Router(RouterSettings(**{**defaults, **settings}), StaticDiscovery(config=config))
        loop.run(self.router.start())

    @property
    def http_url(self) -> str:
        return f"http://127.0.0.1:{self.router.http_port}"

    @property
    def grpc_address(self) -> str:
        return f"127.0.0.1:{self.router.grpc_port}"

    @property
    def metrics_url(self) -> str:
        return f"http://127.0.0.1:{self.router.metrics_port}/metrics"

    def check_books(self, settle_s: float = 20.0) -> None:
        """Every ticket finished and shadow caches consistent (call when no client request runs).

        The router's own requests may still be in flight when a client has its answer: a pod that turned
        ready is pushed the hottest adapters (warm start) in the background. Those end by themselves, so
        the books are read once no ticket is open; a ticket still open after ``settle_s`` is a leak."""

        async def check() -> None:
            fleets = self.router.fleets.fleets
            deadline_s = asyncio.get_running_loop().time() + settle_s
            while any(fleet.snapshot().open_tickets for fleet in fleets.values()):
                if asyncio.get_running_loop().time() > deadline_s:
                    open_tickets = {name: fleet.open_tickets() for name, fleet in fleets.items()}
                    raise AssertionError(f"tickets still open after {settle_s} s: {open_tickets}")
                await asyncio.sleep(0.01)
            for fleet in fleets.values():
                fleet.check_invariants()

        self.loop.run(check(), timeout_s=settle_s + 10)

    def stop(self) -> None:
        self.loop.run(self.router.stop())


class EchoFleet:
    """``count`` echo upstreams (gRPC, plus Triton's HTTP generate extension unless ``http=False``) and a
    router in front of them (base model ``tiny``, adapters given)."""

    def __init__(
        self,
        tmp: Path,
        *,
        count: int = 3,
        host_pages: int = 2,
        adapters: Sequence[str] = ("a1", "a2"),
        chunk_chars: int = 4,
        chunk_delay_s: float = 0.0,
        http: bool = True,
        **settings: Any,
    ) -> None:
        self.loop = LoopThread()
        self.upstreams = [
            EchoUpstream(host_pages=host_pages, chunk_chars=chunk_chars, chunk_delay_s=chunk_delay_s)
            for _ in range(count)
        ]
        self.servers: list[grpc.aio.Server] = []
        self.http_runners: list[web.AppRunner | None] = []
        backends = []
        for index, upstream in enumerate(self.upstreams):
            server, port = self.loop.run(serve_echo(upstream))
            self.servers.append(server)
            backend = {"address": f"127.0.0.1:{port}", "podId": f"echo{index}"}
            runner = None
            if http:
                runner, http_port = self.loop.run(_serve_http(upstream))
                backend["http"] = f"127.0.0.1:{http_port}"
            self.http_runners.append(runner)
            backends.append(backend)
        entries = []
        for index, name in enumerate(adapters, start=1):
            sha = write_artifact(tmp / name, seed=index)
            entries.append({"servedName": name, "taskId": 100 + index, "artifact": str(tmp / name), "sha256": sha})
        self.fleet = {
            "baseModels": [
                {
                    "name": "tiny",
                    "architecture": "reference",
                    "maxInputLen": 256,
                    "maxSeqLen": 512,
                    "hostPages": host_pages,
                    "backends": backends,
                    "adapters": entries,
                }
            ]
        }
        self.router = RouterThread(self.loop, self.fleet, **settings)

    def stop_upstream(self, index: int) -> None:
        """The pod dies: both its gRPC and its HTTP server stop (open connections are cut)."""
        self.loop.run(self.servers[index].stop(None))
        runner = self.http_runners[index]
        if runner is not None:
            self.http_runners[index] = None
            self.loop.run(runner.cleanup())

    def close(self) -> None:
        try:
            self.router.stop()
        finally:
            for index in range(len(self.servers)):
                self.stop_upstream(index)
            self.loop.close()


async def _serve_http(upstream: EchoUpstream) -> tuple[web.AppRunner, int]:
    runner = web.AppRunner(echo_http_app(upstream), access_log=None, shutdown_timeout=0.1)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    server = site._server
    assert server is not None
    return runner, int(server.sockets[0].getsockname()[1])  # type: ignore[union-attr]
