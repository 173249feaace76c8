"""Wiring: builds the router's parts, starts its servers and background loops, drains on stop.

Ports: HTTP (OpenAI + Triton HTTP on one aiohttp server), gRPC (Triton), metrics (``/metrics``, and
``/debug/fleets`` when ``debug_endpoints`` is on), peers. The peer port and the debug endpoints are internal:
:mod:`trtfleet_router.internalaccess` decides who may use them. Background loops: discovery, load-signal
scraping, prewarming, the placement's prefetches. ``stop`` drains: readiness turns false and new requests get
503 at once, in-flight requests get ``drain_timeout_s`` to finish, then the servers close (remaining streams are
cancelled, which cancels their upstream calls).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final, Protocol

from aiohttp import web

from trtfleet.internalauth import TokenFile
from trtfleet_router.batch.wiring import BatchSettings, build_batch_parts
from trtfleet_router.epp.exchange import PickerSettings
from trtfleet_router.epp.server import EndpointPicker, PickerHealth, build_picker_server
from trtfleet_router.epp.wire import WireServer
from trtfleet_router.errors import RouterError, mapping_for, openai_error_body, triton_error_body
from trtfleet_router.internalaccess import InternalAccess, choose_access
from trtfleet_router.liveview import DiscoverySnapshot, FleetSet
from trtfleet_router.loopmetrics import LoopLagProbe
from trtfleet_router.metrics import RouterMetrics
from trtfleet_router.peering.journal import EventLog, new_replica_id
from trtfleet_router.peering.peers import Peers, PeerSettings
from trtfleet_router.peering.server import PeerServer
from trtfleet_router.placementloop import PlacementLoop
from trtfleet_router.routing.config import RoutingConfig
from trtfleet_router.server.auth import ApiKeys
from trtfleet_router.server.common import LINGER_S, FrontendSettings, Lifecycle, Services
from trtfleet_router.server.openai_http import OpenAIFrontend
from trtfleet_router.server.triton_grpc import build_grpc_server
from trtfleet_router.server.triton_http import TritonHttpFrontend
from trtfleet_router.upstream.dispatch import Dispatcher
from trtfleet_router.upstream.grpc_transport import STREAMS_PER_POD_DEFAULT, UpstreamCalls
from trtfleet_router.upstream.health import PodHealth
from trtfleet_router.upstream.kvevents_poller import KvEventPoller
from trtfleet_router.upstream.modelinfo import ModelInfoCache
from trtfleet_router.upstream.pool import ChannelPool
from trtfleet_router.upstream.prewarm import Prewarmer
from trtfleet_router.upstream.scrape import SCRAPE_INTERVAL_S_DEFAULT, MetricsScraper
from trtfleet_router.upstream.text import TextGenerator
from trtfleet_router.warmstart import WarmStarts
from trtfleet_router.weights import DEFAULT_CAPACITY_BYTES, SchemeReader, WeightStore

log = logging.getLogger(__name__)

DRAIN_TIMEOUT_S_DEFAULT: Final = 30.0
PREWARM_INTERVAL_S_DEFAULT: Final = 10.0
HTTP_OVERHEAD_BYTES: Final = 64 * 1024


class Discovery(Protocol):
    def initial(self) -> DiscoverySnapshot: ...

    async def run(self, apply: Callable[[DiscoverySnapshot], None]) -> None: ...


@dataclass(frozen=True)
class RouterSettings:
    host: str = "0.0.0.0"
    http_port: int = 8080
    grpc_port: int | None = 8081
    metrics_port: int | None = 9090
    routing: RoutingConfig = field(default_factory=RoutingConfig)
    frontend: FrontendSettings = field(default_factory=FrontendSettings)
    weight_store_bytes: int = DEFAULT_CAPACITY_BYTES
    scrape_interval_s: float = SCRAPE_INTERVAL_S_DEFAULT
    prewarm_interval_s: float = PREWARM_INTERVAL_S_DEFAULT
    drain_timeout_s: float = DRAIN_TIMEOUT_S_DEFAULT
    max_attempts: int = 3
    upstream_calls: UpstreamCalls = UpstreamCalls.AUTO
    streams_per_pod: int = STREAMS_PER_POD_DEFAULT
    warm_over_http: bool = True
    seed: int | None = None
    api_keys_path: Path | None = None
    peering: PeerSettings | None = None  # None: no peer port, this replica's own view only
    picker: PickerSettings | None = None  # None: no endpoint-picker port (docs/gateway.md)
    picker_port: int = -1
    internal_token_file: Path | None = None  # the internal endpoints' bearer tokens (None: loopback only)
    internal_open: bool = False  # --no-internal-auth: the internal endpoints answer anyone
    debug_endpoints: bool = False  # /debug/fleets on the metrics port
    batch: BatchSettings = field(default_factory=BatchSettings)


class Router:
    """One router process: build with settings + discovery, then ``await start()`` / ``await stop()``."""

    def __init__(self, settings: RouterSettings, discovery: Discovery) -> None:
        self.settings = settings
        self.discovery = discovery
        self.metrics = RouterMetrics()
        peering = settings.peering
        mode = choose_access(
            settings.internal_token_file,
            settings.internal_open,
            peering is not None and bool(peering.seeds or peering.dns),
        )
        tokens = TokenFile(settings.internal_token_file) if settings.internal_token_file is not None else None
        self.access = InternalAccess(mode, tokens)
        self.journal = EventLog(new_replica_id()) if peering is not None else None
        self.fleets = FleetSet(settings.routing, seed=settings.seed, journal=self.journal)
        self.peers = (
            Peers(self.journal, self.fleets, self.metrics, peering, tokens=tokens)
            if peering is not None and self.journal is not None
            else None
        )
        self.pool = ChannelPool()
        self.reader = SchemeReader()
        self.weights = WeightStore(settings.weight_store_bytes, self.reader, self.metrics)
        self.model_info = ModelInfoCache(self.pool, self.fleets)
        self.dispatcher = Dispatcher(
            self.fleets,
            self.pool,
            self.weights,
            self.model_info,
            self.metrics,
            max_attempts=settings.max_attempts,
            calls=settings.upstream_calls,
            streams_per_pod=settings.streams_per_pod,
            warm_over_http=settings.warm_over_http,
        )
        if self.peers is not None:  # another replica's request end frees room for requests waiting here
            self.peers.release_listeners.append(self.dispatcher.admission.remote_ended)
        self.text = TextGenerator(self.dispatcher)
        self.prewarmer = Prewarmer(self.fleets, self.text, self.dispatcher)
        self.health = PodHealth(self.fleets, self.pool, self.dispatcher, self.metrics)
        self.warm_starts = WarmStarts(self.fleets, self.metrics.activity, self.prewarmer.push)
        self.placement = PlacementLoop(self.fleets, self.prewarmer.prefetch)
        self.metrics.pod_warm_demand = self.warm_starts.pod_warm_demand
        api_keys = ApiKeys.load(settings.api_keys_path) if settings.api_keys_path is not None else None
        self.lifecycle = Lifecycle()
        self.services = Services(
            fleets=self.fleets,
            text=self.text,
            dispatcher=self.dispatcher,
            model_info=self.model_info,
            metrics=self.metrics,
            settings=settings.frontend,
            api_keys=api_keys,
            lifecycle=self.lifecycle,
        )
        self.batch = build_batch_parts(settings.batch, self.services, discovery) if settings.batch.store else None
        self._runners: list[web.AppRunner] = []
        self._grpc: Any = None
        self._tasks: list[asyncio.Task[None]] = []
        self.http_port: int | None = None
        self.grpc_port: int | None = None
        self.metrics_port: int | None = None
        self.peer_port: int | None = None
        self._peer_server: PeerServer | None = None
        self._picker: WireServer | None = None
        self.picker_health = PickerHealth()
        self.picker_port_bound: int | None = None

    # -- discovery -------------------------------------------------------------------------------------
    def apply(self, snapshot: DiscoverySnapshot) -> None:
        old_models = {name: base.upstream_model for name, base in self.fleets.registry.bases.items()}
        self.fleets.apply(snapshot)
        for name, base in snapshot.registry.bases.items():
            if old_models.get(name) not in (None, base.upstream_model):
                self.model_info.forget(name)
        addresses = self.fleets.addresses()
        self.pool.retain(addresses)
        self.dispatcher.retain(addresses)
        log.info(
            "fleet updated",
            extra={
                "ctx": {
                    "base_models": len(snapshot.registry.bases),
                    "adapters": len(snapshot.registry.adapters),
                    "pods": sum(len(p) for p in snapshot.pods.values()),
                }
            },
        )

    # -- lifecycle -------------------------------------------------------------------------------------
    def http_app(self) -> web.Application:
        app = web.Application(client_max_size=self.settings.frontend.max_body_bytes + HTTP_OVERHEAD_BYTES)
        app.add_routes(guarded(OpenAIFrontend(self.services).routes()))
        app.add_routes(guarded(TritonHttpFrontend(self.services).routes()))
        if self.batch is not None:
            app.add_routes(guarded(self.batch.frontend.routes()))
        return app

    def metrics_app(self) -> web.Application:
        app = web.Application()
        app.add_routes([web.get("/metrics", self._metrics)])
        if self.settings.debug_endpoints:
            app.add_routes([web.get("/debug/fleets", self._fleets_debug)])
        return app

    async def start(self) -> None:
        initial = await asyncio.to_thread(self.discovery.initial)
        self.apply(initial)
        s = self.settings
        listed = asyncio.Event()  # discovery has listed everything once (Kubernetes: every watch)

        def apply(snapshot: DiscoverySnapshot) -> None:
            self.apply(snapshot)
            listed.set()

        self._background(self.discovery.run(apply), "discovery")
        if s.peering is not None or s.debug_endpoints:
            self.access.describe()
        if self.peers is not None and self.journal is not None and s.peering is not None:
            # before the public ports: a replica answers its first request with the other replicas' view,
            # copied once it knows the pods (a snapshot's pods it does not know yet are skipped)
            holds = self.dispatcher.admission.holds
            self._peer_server = server = PeerServer(
                self.journal, self.fleets, self.peers, access=self.access, holds=holds
            )
            self.peer_port = await self._serve_http(server.app(), s.peering.port)
            self.peers.listening(s.host, self.peer_port)
            if not initial.registry.bases:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(listed.wait(), s.peering.sync_timeout_s)
            await self.peers.sync()
            self._background(self.peers.run(), "peers")
        self.http_port = await self._serve_http(
            self.http_app(),
            s.http_port,
            handler_cancellation=True,
            keepalive_timeout=s.frontend.header_timeout_s,
            lingering_time=LINGER_S,
        )
        if s.metrics_port is not None:
            self.metrics_port = await self._serve_http(self.metrics_app(), s.metrics_port)
        if s.picker is not None:
            picker = EndpointPicker(self.services, self.dispatcher, self.prewarmer, s.picker)
            self._picker = build_picker_server(
                picker, self.picker_health, max_message_bytes=s.frontend.max_body_bytes + HTTP_OVERHEAD_BYTES
            )
            self.picker_port_bound = await self._picker.start(s.host, max(0, s.picker_port))
            self.picker_health.serving(True)
        if s.grpc_port is not None:
            self._grpc = build_grpc_server(
                self.services, max_message_bytes=s.frontend.max_body_bytes + HTTP_OVERHEAD_BYTES
            )
            self.grpc_port = self._grpc.add_insecure_port(f"{s.host}:{s.grpc_port}")
            await self._grpc.start()
        self._background(MetricsScraper(self.fleets, self.metrics, s.scrape_interval_s).run(), "scraper")
        self._background(KvEventPoller(self.fleets, s.scrape_interval_s).run(), "kv-events")
        self._background(self.prewarmer.run(s.prewarm_interval_s), "prewarm")
        self._background(self.warm_starts.run(), "warm-start")
        self._background(self.placement.run(), "placement")
        self._background(self.health.run(), "health")
        self._background(LoopLagProbe(self.metrics.event_loop_lag).run(), "loop-lag")
        if self.batch is not None:
            self._background(self.batch.run(), "batch")
        log.info(
            "router started",
            extra={
                "ctx": {
                    "http_port": self.http_port,
                    "grpc_port": self.grpc_port,
                    "metrics_port": self.metrics_port,
                    "peer_port": self.peer_port,
                    "epp_port": self.picker_port_bound,
                    "policy": s.routing.policy,
                }
            },
        )

    async def _serve_http(self, app: web.Application, port: int, **options: Any) -> int:
        runner = web.AppRunner(app, access_log=None, **options)
        await runner.setup()
        site = web.TCPSite(runner, self.settings.host, port, backlog=1024, reuse_address=True)
        await site.start()
        self._runners.append(runner)
        server = site._server
        sockets = getattr(server, "sockets", None) or []
        return int(sockets[0].getsockname()[1]) if sockets else port

    def _background(self, coro: Awaitable[None], name: str) -> None:
        async def guarded() -> None:
            try:
                await coro
            except asyncio.CancelledError:
                raise
            except Exception:
                log.exception("background loop failed", extra={"ctx": {"loop": name}})

        self._tasks.append(asyncio.create_task(guarded(), name=name))

    async def stop(self) -> None:
        self.lifecycle.start_draining()
        if self._picker is not None:
            self.picker_health.serving(False)
        drained = await self.lifecycle.wait_idle(self.settings.drain_timeout_s)
        log.info("router draining done", extra={"ctx": {"drained": drained, "left": self.lifecycle.inflight}})
        if self._peer_server is not None:
            self._peer_server.close()
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        if self._grpc is not None:
            await self._grpc.stop(grace=1.0)
        if self._picker is not None:
            await self._picker.stop(grace_s=1.0)
        for runner in self._runners:
            await runner.cleanup()
        if self.peers is not None:
            await self.peers.close()
        await self.dispatcher.close()
        await self.pool.close()
        await self.reader.close()

    # -- metrics port ----------------------------------------------------------------------------------
    async def _metrics(self, request: web.Request) -> web.Response:
        return web.Response(body=self.metrics.exposition(), content_type="text/plain", charset="utf-8")

    async def _fleets_debug(self, request: web.Request) -> web.Response:
        self.access.check(request)
        snapshots = {name: dataclasses.asdict(fleet.snapshot()) for name, fleet in self.fleets.fleets.items()}
        return web.json_response(snapshots)


Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def _unexpected_errors(handler: Handler) -> Handler:
    """Last resort: an unexpected exception becomes a logged 500 with the front end's error body (Triton's
    on ``/v2`` routes, OpenAI's elsewhere)."""

    async def guarded(request: web.Request) -> web.StreamResponse:
        try:
            return await handler(request)
        except web.HTTPException:
            raise
        except (asyncio.CancelledError, ConnectionError):
            raise
        except Exception:
            log.exception("unhandled error", extra={"ctx": {"path": request.path}})
            error = RouterError("internal error")
            body = triton_error_body(error) if request.path.startswith("/v2") else openai_error_body(error)
            return web.json_response(body, status=mapping_for(error).http_status)

    return guarded


def guarded(routes: Iterable[web.RouteDef]) -> list[web.RouteDef]:
    """``routes`` with every handler wrapped by :func:`_unexpected_errors` (a wrapper per route rather
    than an aiohttp middleware: any middleware adds two coroutine layers to every request)."""
    return [web.RouteDef(r.method, r.path, _unexpected_errors(r.handler), r.kwargs) for r in routes]
