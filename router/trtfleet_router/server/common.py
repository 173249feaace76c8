"""What every front end shares: the services they call, request bookkeeping, body reading.

:class:`Services` is the whole surface the front ends see (registry lookups with API-key checks,
the text generator, the dispatcher, upstream model info, metrics, the drain state). Each request runs
inside :meth:`Services.track`, which counts it for draining and records ``requests_total`` and
``request_duration_seconds`` once, whatever the outcome.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import os
import time
from dataclasses import dataclass
from types import TracebackType
from typing import Any, Final

from aiohttp import web

from trtfleet_router import jsoncodec
from trtfleet_router.errors import (
    BodyTooLarge,
    MalformedRequest,
    RequestTimeout,
    RouterError,
    ShuttingDown,
    mapping_for,
)
from trtfleet_router.liveview import FleetSet
from trtfleet_router.metrics import RouterMetrics
from trtfleet_router.models_registry import Target
from trtfleet_router.routing.tenancy import DEFAULT_TENANT, RequestClass
from trtfleet_router.server.auth import ApiKeys
from trtfleet_router.upstream.dispatch import Dispatcher
from trtfleet_router.upstream.modelinfo import ModelInfoCache
from trtfleet_router.upstream.text import TextGenerator

log = logging.getLogger(__name__)

MAX_BODY_BYTES_DEFAULT: Final = 8 * 1024 * 1024
REQUEST_TIMEOUT_S_DEFAULT: Final = 600.0
HEADER_TIMEOUT_S_DEFAULT: Final = 30.0
BODY_TIMEOUT_S_DEFAULT: Final = 30.0
LINGER_S: Final = 1.0
"""After an answer to a request whose body was not read to its end (408, 413), how long aiohttp reads on
before it closes the connection."""
REQUEST_ID_HEADER: Final = "x-request-id"


@dataclass(frozen=True, slots=True)
class FrontendSettings:
    max_body_bytes: int = MAX_BODY_BYTES_DEFAULT
    request_timeout_s: float = REQUEST_TIMEOUT_S_DEFAULT
    header_timeout_s: float = HEADER_TIMEOUT_S_DEFAULT
    """HTTP: a connection with no whole request head for this long is closed (aiohttp's keep-alive timer,
    which runs from the connection's start and after each answer: half-open and idle connections alike)."""
    body_timeout_s: float = BODY_TIMEOUT_S_DEFAULT
    """HTTP: a request body not fully received within this time is answered 408 and its connection closed."""


class Lifecycle:
    """Counts requests in flight; after :meth:`start_draining` new requests get 503."""

    def __init__(self) -> None:
        self.draining = False
        self.inflight = 0
        self._idle = asyncio.Event()
        self._idle.set()

    def enter(self) -> None:
        if self.draining:
            raise ShuttingDown("the router is shutting down; retry on another replica", retry_after_s=1)
        self.inflight += 1
        self._idle.clear()

    def exit(self) -> None:
        self.inflight -= 1
        if self.inflight == 0:
            self._idle.set()

    def start_draining(self) -> None:
        self.draining = True

    async def wait_idle(self, timeout_s: float) -> bool:
        """True when every request finished within ``timeout_s``."""
        try:
            await asyncio.wait_for(self._idle.wait(), timeout_s)
        except TimeoutError:
            return False
        return True


class RequestIds:
    """Short unique request ids: a per-process random prefix and a counter (cheap on the hot path)."""

    def __init__(self) -> None:
        self._prefix = os.urandom(4).hex()
        self._counter = itertools.count(1)

    def new(self, supplied: str | None = None) -> str:
        if supplied and len(supplied) <= 128 and supplied.isprintable():
            return supplied
        return f"{self._prefix}-{next(self._counter):x}"


@dataclass(slots=True)
class RequestRecord:
    """Mutable facts about one request, filled in while it runs (for metrics and the log line)."""

    request_id: str
    frontend: str
    started_s: float
    model_kind: str = "unknown"
    model: str = ""
    code: str = "ok"
    first_output_s: float | None = None


class Services:
    def __init__(
        self,
        *,
        fleets: FleetSet,
        text: TextGenerator,
        dispatcher: Dispatcher,
        model_info: ModelInfoCache,
        metrics: RouterMetrics,
        settings: FrontendSettings,
        api_keys: ApiKeys | None = None,
        lifecycle: Lifecycle | None = None,
    ) -> None:
        self.fleets = fleets
        self.text = text
        self.dispatcher = dispatcher
        self.model_info = model_info
        self.metrics = metrics
        self.settings = settings
        self.api_keys = api_keys
        self.lifecycle = lifecycle if lifecycle is not None else Lifecycle()
        self.request_ids = RequestIds()

    def resolve(self, model: str, presented_key: str | None) -> Target:
        """The target of ``model``, after the API-key check (when keys are configured; keys name the
        names clients send, aliases of a migration included). During a migration, the side with pods."""
        if self.api_keys is not None:
            self.api_keys.authenticate(presented_key)
        target = self.fleets.registry.resolve(model)
        if self.api_keys is not None:
            self.api_keys.authorize(presented_key, model)
        return self.fleets.serving(target)

    @property
    def trusts_fairness_header(self) -> bool:
        """The router's own front ends take the tenant from a gateway's fairness header (``tenancy.fairnessHeader``)."""
        return self.fleets.routing_config.tenancy.fairness_header

    def tenant(self, presented_key: str | None, fairness_id: str | None = None) -> str:
        """Whose share a request uses: ``fairness_id`` (a gateway's fairness header, passed only where it is
        trusted), else the API key's name (its digest's first 12 hex digits when it has none), else ``default``."""
        if fairness_id:
            return fairness_id
        if self.api_keys is not None and presented_key:
            principal = self.api_keys.authenticate(presented_key)
            return principal.name or f"key-{(principal.owner or '')[:12]}"
        return DEFAULT_TENANT

    def request_class(
        self,
        target: Target,
        presented_key: str | None,
        *,
        fairness_id: str | None = None,
        objective: str | None = None,
        requested: float | None = None,
        batch: bool = False,
    ) -> RequestClass:
        """The tenant and priority band of a request to ``target`` (routing/tenancy.py)."""
        adapter = target.adapter
        return self.dispatcher.admission.tenants.classify(
            self.tenant(presented_key, fairness_id),
            adapter=adapter.served_name if adapter is not None else None,
            objective=objective,
            requested=requested,
            batch=batch,
        )

    def body_limit(self, presented_key: str | None) -> int:
        """The most bytes this request's body may have: ``--max-body-bytes``, or the key's ``maxBodyBytes`` when
        lower. With keys on, the key is checked here, so an unknown one is refused before its body is read."""
        limit = self.settings.max_body_bytes
        if self.api_keys is None:
            return limit
        own = self.api_keys.authenticate(presented_key).max_body_bytes
        return limit if own is None else min(limit, own)

    def check_message_size(self, presented_key: str | None, size_bytes: int) -> None:
        """A message received whole (gRPC) against :meth:`body_limit`."""
        limit = self.body_limit(presented_key)
        if size_bytes > limit:
            raise BodyTooLarge(f"the request has {size_bytes} bytes; this API key's limit is {limit}")

    def visible(self, served_name: str, presented_key: str | None) -> bool:
        if self.api_keys is None:
            return True
        return self.api_keys.authenticate(presented_key).may_use(served_name)

    def track(self, frontend: str, request_id: str) -> _Tracked:
        """Wraps one request (``with services.track(...) as record``): drain accounting,
        ``requests_total``, duration, TTFT, the log line."""
        return _Tracked(self, RequestRecord(request_id, frontend, time.perf_counter()))

    def _observe(self, record: RequestRecord) -> None:
        m = self.metrics
        elapsed_s = time.perf_counter() - record.started_s
        m.requests.labels(record.frontend, record.model_kind, record.code).inc()
        m.request_duration.labels(record.frontend, record.model_kind).observe(elapsed_s)
        if record.first_output_s is not None:
            m.time_to_first_token.labels(record.frontend, record.model_kind).observe(
                record.first_output_s - record.started_s
            )
        if log.isEnabledFor(logging.DEBUG) or record.code not in ("ok", "client_gone"):
            level = logging.DEBUG if record.code == "ok" else logging.INFO
            log.log(
                level,
                "request",
                extra={
                    "ctx": {
                        "request_id": record.request_id,
                        "frontend": record.frontend,
                        "model": record.model,
                        "model_kind": record.model_kind,
                        "code": record.code,
                        "duration_s": round(elapsed_s, 6),
                    }
                },
            )


class _Tracked:
    """The context manager of :meth:`Services.track` (a class: cheaper per request than @contextmanager)."""

    __slots__ = ("record", "services")

    def __init__(self, services: Services, record: RequestRecord) -> None:
        self.services = services
        self.record = record

    def __enter__(self) -> RequestRecord:
        self.services.lifecycle.enter()
        return self.record

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        record = self.record
        if exc is not None:
            if isinstance(exc, RouterError):
                record.code = mapping_for(exc).code_label
            elif isinstance(exc, asyncio.CancelledError | ConnectionError):
                record.code = "client_gone"
            else:
                record.code = "internal"
        services = self.services
        services.lifecycle.exit()
        services._observe(record)


async def read_json_body(request: web.Request, max_body_bytes: int, timeout_s: float) -> Any:
    """The request body as JSON (413 above ``max_body_bytes``, 408 after ``timeout_s``, 400 when not JSON)."""
    body = await read_body(request, max_body_bytes, timeout_s)
    try:
        return jsoncodec.loads(body)
    except (ValueError, UnicodeDecodeError) as exc:
        raise MalformedRequest(f"the request body is not valid JSON: {exc}") from exc


async def read_body(request: web.Request, max_body_bytes: int, timeout_s: float) -> bytes:
    length = request.content_length
    if length is not None and length > max_body_bytes:
        raise BodyTooLarge(f"the request body has {length} bytes; the limit is {max_body_bytes}")
    try:
        async with asyncio.timeout(timeout_s):
            body = await request.read()
    except web.HTTPRequestEntityTooLarge as exc:
        raise BodyTooLarge(f"the request body exceeds the limit of {max_body_bytes} bytes") from exc
    except TimeoutError as exc:
        raise RequestTimeout(f"the request body did not arrive within {timeout_s:g} s") from exc
    if len(body) > max_body_bytes:  # chunked, with no length up front: bound by the server's limit until here
        raise BodyTooLarge(f"the request body exceeds the limit of {max_body_bytes} bytes")
    return body
