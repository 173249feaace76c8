"""One HTTP request through a gateway, as the picker sees it: pick its pod, then keep the books until it ends.

The phases of one ``ext_proc`` stream (:mod:`.envoy`):

1. **request**: headers, then the body in chunks, buffered to its end. Then the request is interpreted
   (:mod:`.request`: the call the router would dispatch and the pod's wire form) and decided the way the router
   decides its own (:class:`~trtfleet_router.upstream.admission.Admission`: the same policies and fleet view, waits
   for capacity and holds for a ready pod included); a cold pod on the ``tensorrtllm`` runtime first gets the
   adapter pushed (:mod:`.coldloads`). The answer: the destination (and, with ``fallbacks``, the next pods the
   fleet would pick), the rewritten path and body. Anything the router would refuse is answered at once with its
   error body and status (400, 401/403, 404, 429, 503 with ``Retry-After``).
2. **response**: the status and the served endpoint (a gateway that used a fallback says which), then the body
   streamed back chunk by chunk, the model names rewritten to the client's. The first chunk of a 200 is the
   request's first answer (the pod admitted it and stored its weights: the lease is confirmed); the output tokens the
   body carries are charged to the request's tenant as they pass (:mod:`.metering`); the end of the body
   ends the lease with its outcome (an error answer classified as the router classifies its own: a LoRA miss marks
   the adapter cold, a broken pod counts toward its ejection).

A stream that ends before its answer did (the client went away, the gateway gave up) ends the lease without
blaming the pod: as answered once the pod's first chunk came, as failed before.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import time
from collections.abc import Iterable
from typing import Any, Final

import grpc
from envoy.service.ext_proc.v3 import external_processor_pb2 as ext_proc

from trtfleet_router.epp import envoy
from trtfleet_router.epp.coldloads import ColdLoads
from trtfleet_router.epp.metering import ChunkMeter
from trtfleet_router.epp.request import GatewayRequest, interpret, is_models_list, request_path
from trtfleet_router.errors import (
    BodyTooLarge,
    NoCapacityAvailable,
    RouterError,
    http_headers_for,
    mapping_for,
    openai_error_body,
    triton_error_body,
)
from trtfleet_router.liveview import PodEndpoint
from trtfleet_router.routing.types import Decision, Outcome, RouteRequest, RoutingError, UnknownPod
from trtfleet_router.server.auth import presented_key
from trtfleet_router.server.common import RequestRecord, Services
from trtfleet_router.server.openai_http import model_cards
from trtfleet_router.upstream.admission import Lease
from trtfleet_router.upstream.dispatch import Dispatcher
from trtfleet_router.upstream.http_transport import answer_failure
from trtfleet_router.upstream.openai_upstream import classify_answer
from trtfleet_router.upstream.protocol import FailureKind, UpstreamFailure, error_text
from trtfleet_router.upstream.tenantbooks import OutputMeter
from trtfleet_router.upstream.waiting import Priority

log = logging.getLogger(__name__)

FRONTEND: Final = "epp"
ERROR_TEXT_BYTES: Final = 4096
"""Of an error answer, this much is kept to classify it."""
GATEWAY_FAILURE_TEXTS: Final = ("upstream connect error", "no healthy upstream", "upstream reset")
"""Envoy's own answers when it could not reach the pod: the pod's failure, not the request's."""
SSE_DONE: Final = b"data: [DONE]"
"""An OpenAI stream's last event: the client has its whole answer."""
MAX_PICKS: Final = 4
"""Pods a request may be decided to before it is refused (a pod that left the fleet, a failed cold push)."""


@dataclasses.dataclass(frozen=True)
class PickerSettings:
    fallbacks: int = 0
    """Endpoints after the first in ``x-gateway-destination-endpoint``, for gateways that walk the list on a retry
    (GIE protocol v0.4+); plain Envoy's ``ORIGINAL_DST`` cluster takes one endpoint only, so 0 by default."""


class Exchange:
    """The picker's side of one ``ext_proc`` stream."""

    def __init__(
        self, services: Services, dispatcher: Dispatcher, cold_loads: ColdLoads, settings: PickerSettings, context: Any
    ) -> None:
        self.services = services
        self.dispatcher = dispatcher
        self.cold_loads = cold_loads
        self.settings = settings
        self.context = context
        self.request: GatewayRequest | None = None
        self.lease: Lease | None = None
        self.decision: Decision | None = None
        self.demand = False
        self.status = 0
        self.answered = False
        self.cold = False  # the pod was cold for the adapter: a load (pushed first, or read from lora_path)
        self.complete = False  # the client has the whole answer (its end, or an OpenAI stream's [DONE])
        self.cut = False  # the stream ended in the middle of the answer
        self.body_left: int | None = None  # bytes of the answer still to come, where its content-length says
        self.error_body = b""
        self.openai = True  # error bodies in OpenAI's shape (else Triton's)
        self.meter = ChunkMeter()
        self.output: OutputMeter | None = None

    async def run(self) -> None:
        message = await self.context.read()
        if message is grpc.aio.EOF or message.WhichOneof("request") != "request_headers":
            return
        headers = envoy.header_map(message.request_headers.headers)
        self.openai = not request_path(headers).startswith("/v2/")
        services = self.services
        request_id = services.request_ids.new(headers.get("x-request-id"))
        cancelled: asyncio.CancelledError | None = None
        try:
            with services.track(FRONTEND, request_id) as record:
                try:
                    await self._serve(message, headers, record)
                    if not self.complete and (self.cut or self.context.cancelled()):  # the read saw the end
                        record.code = "client_gone"
                except asyncio.CancelledError as exc:
                    if not self.complete:
                        raise
                    cancelled = exc  # the gateway closed the stream after the whole answer: a request served
                finally:
                    self._stream_ended()
                    if self.demand and self.request is not None:
                        self.dispatcher.admission.demand_ended(self.request.call)
        except RouterError as exc:  # refused before it started (the router is draining)
            await self.context.write(self._refusal(exc))
        if cancelled is not None:
            raise cancelled

    async def _serve(self, first: ext_proc.ProcessingRequest, headers: dict[str, str], record: RequestRecord) -> None:
        subset = envoy.subset_hint(first.metadata_context)
        body = b""
        headers_only = first.request_headers.end_of_stream
        try:
            if not headers_only:
                read = await self._read_body(self.services.body_limit(presented_key(headers)))
                if read is None:
                    return
                body = read
            answer = await self._pick(headers, body, subset, record, headers_only=headers_only)
        except RouterError as exc:
            record.code = mapping_for(exc).code_label
            self.complete = True
            await self.context.write(self._refusal(exc))
            return
        self.complete = answer[0].WhichOneof("response") == "immediate_response"
        for response in answer:
            await self.context.write(response)
        if self.complete:
            return
        await self._follow(record)

    async def _read_body(self, limit_bytes: int) -> bytes | None:
        """The request body, to its end (None: the stream ended first); 413 past ``limit_bytes`` (the router's
        ``--max-body-bytes``, or the API key's own limit)."""
        chunks: list[bytes] = []
        size = 0
        while True:
            message = await self.context.read()
            if message is grpc.aio.EOF:
                return None
            kind = message.WhichOneof("request")
            if kind == "request_body":
                size += len(message.request_body.body)
                if size > limit_bytes:
                    raise BodyTooLarge(f"the request body exceeds the limit of {limit_bytes} bytes")
                chunks.append(message.request_body.body)
                if message.request_body.end_of_stream:
                    return b"".join(chunks)
            elif kind == "request_trailers":
                return b"".join(chunks)

    # -- request ---------------------------------------------------------------------------------------
    async def _pick(
        self,
        headers: dict[str, str],
        body: bytes,
        subset: frozenset[str] | None,
        record: RequestRecord,
        *,
        headers_only: bool,
    ) -> list[ext_proc.ProcessingResponse]:
        """The answer to the request phase: where the request goes and what it carries, or an immediate answer."""
        services = self.services
        if is_models_list(headers):
            cards = model_cards(services, presented_key(headers), int(time.time()))
            return [envoy.immediate(200, {"object": "list", "data": cards})]
        request = await interpret(services, headers, body, record)
        if request is None:  # not an inference call: any ready pod of the gateway's set, unchanged
            answer = [envoy.route_to([self._any_pod(subset)])]
            return answer + envoy.request_body(body) if not headers_only else answer
        self.request = request
        call = request.call
        admission = self.dispatcher.admission
        if call.output_metered:
            self.output = admission.tenants.meter(call)
        route = admission.route_request(call)
        if subset is not None:
            route = self._within(route, subset)
        admission.demand_started(call)
        self.demand = True
        lease = await self._lease(request, route)
        self.lease = lease
        endpoints = [_destination(lease.endpoint, request) or ""]
        endpoints += self._fallbacks(request, dataclasses.replace(route, exclude_pods=route.exclude_pods | {lease.pod}))
        return [envoy.route_to(endpoints, {":path": request.path}), *envoy.request_body(request.body)]

    async def _lease(self, request: GatewayRequest, route: RouteRequest) -> Lease:
        """Decide (waiting as the router's requests wait), push a cold adapter where weights cannot travel with the
        request, and start the request in the fleet's books."""
        call = request.call
        admission = self.dispatcher.admission
        fleet = self.services.fleets.fleet(call.target.base.name)
        adapter = call.target.adapter
        metrics = self.services.metrics
        label = metrics.adapter_label(adapter.served_name if adapter is not None else None)
        for _ in range(MAX_PICKS):
            self.cold = False
            decision = await admission.decide(fleet, route, call.priority, None, call.deadline_s, call=call)
            endpoint = self.services.fleets.endpoint(route.model, decision.pod)
            if endpoint is None or _destination(endpoint, request) is None:
                route = dataclasses.replace(route, exclude_pods=route.exclude_pods | {decision.pod})
                continue
            if adapter is not None and (decision.send_weights or decision.loading):
                if request.weights_travel:
                    try:
                        await self.cold_loads.ensure(decision.pod, adapter.served_name)
                    except RouterError as exc:
                        log.info("cold push failed", extra={"ctx": {"pod": decision.pod, "error": exc.message}})
                        route = dataclasses.replace(route, exclude_pods=route.exclude_pods | {decision.pod})
                        continue
                    decision = dataclasses.replace(decision, send_weights=False, warm=True, loading=False)
                    self.cold = True  # the push counted its load
                elif decision.send_weights:
                    self.cold = True
                    metrics.adapter_loads.labels(label).inc()  # the pod reads it from lora_path
            try:
                lease = admission.lease(fleet, decision, route)
            except UnknownPod:
                route = dataclasses.replace(route, exclude_pods=route.exclude_pods | {decision.pod})
                continue
            self.decision = decision
            return lease
        raise NoCapacityAvailable(f"no pod of base model {route.model!r} took the request; retry later")

    def _within(self, route: RouteRequest, subset: frozenset[str]) -> RouteRequest:
        """``route`` with the pods outside the gateway's subset hint excluded (none left: 503, as the protocol asks)."""
        pods = self.services.fleets.pods.get(route.model, {})
        outside = {pod for pod, endpoint in pods.items() if (endpoint.http_address or endpoint.address) not in subset}
        if not subset or len(outside) == len(pods):
            raise NoCapacityAvailable("none of the endpoints the gateway allows serves this model", retry_after_s=1)
        return dataclasses.replace(route, exclude_pods=route.exclude_pods | outside)

    def _fallbacks(self, request: GatewayRequest, route: RouteRequest) -> list[str]:
        """The next pods the fleet would pick, for a gateway that retries down the list; on the tensorrtllm runtime
        only pods where the adapter is warm (a cold one would answer a miss)."""
        found: list[str] = []
        fleet = self.services.fleets.fleet(route.model)
        for _ in range(self.settings.fallbacks):
            try:
                decision = fleet.route(route)
            except RoutingError:
                break
            route = dataclasses.replace(route, exclude_pods=route.exclude_pods | {decision.pod})
            endpoint = self.services.fleets.endpoint(route.model, decision.pod)
            destination = _destination(endpoint, request) if endpoint is not None else None
            if destination is None or (request.weights_travel and (decision.send_weights or decision.loading)):
                continue
            found.append(destination)
        return found

    def _any_pod(self, subset: frozenset[str] | None) -> str:
        endpoints: Iterable[PodEndpoint] = (endpoint for _base, endpoint in self.services.fleets.all_endpoints())
        for endpoint in endpoints:
            address = endpoint.http_address or endpoint.address
            if endpoint.ready and (subset is None or address in subset):
                return address
        raise NoCapacityAvailable("no ready pod behind the gateway's pool", retry_after_s=1)

    # -- response --------------------------------------------------------------------------------------
    async def _follow(self, record: RequestRecord) -> None:
        """Answer the response phases, keeping the lease's books, until the stream ends. A gateway that closes the
        stream once it has its destination (NGINX Gateway Fabric's client does) follows no response: its request
        counts as handed over and answered, the lease ends there."""
        context = self.context
        followed = False
        while True:
            message = await context.read()
            if message is grpc.aio.EOF:
                if not followed and not context.cancelled():  # a gateway that sends no response phases
                    self.answered = self.complete = True
                elif not self.complete:  # the answer stopped part-way: its client left (or was cut off)
                    self.cut = True
                return
            kind = message.WhichOneof("request")
            followed = followed or kind != "request_trailers"
            if kind == "response_headers":
                self._response_headers(message)
                await context.write(envoy.RESPONSE_HEADERS_UNCHANGED)
            elif kind == "response_body":
                chunk, end = message.response_body.body, message.response_body.end_of_stream
                self._response_chunk(chunk, record)
                if end or self.complete:  # booked before the last bytes go back: the client cannot be ahead
                    self._response_end()
                if self.request is not None:
                    chunk = self.request.client_names(chunk)
                await context.write(envoy.response_body(chunk, end))
            elif kind == "response_trailers":
                self._response_end()
                await context.write(envoy.RESPONSE_TRAILERS_UNCHANGED)
            elif kind == "request_trailers":
                await context.write(envoy.REQUEST_TRAILERS_UNCHANGED)

    def _response_headers(self, message: ext_proc.ProcessingRequest) -> None:
        headers = envoy.header_map(message.response_headers.headers)
        try:
            self.status = int(headers.get(":status", "0"))
        except ValueError:
            self.status = 0
        length = headers.get("content-length", "")
        self.body_left = int(length) if length.isdigit() else None
        served = envoy.served_endpoint(message.metadata_context, headers)
        lease = self.lease
        if lease is not None and served is not None and served != _destination(lease.endpoint, self.request):
            # the gateway went down the fallback list: the first pod failed, another one answers
            self._end(Outcome.FAILED, blame=True)
            self._lease_served(served)
        if message.response_headers.end_of_stream:  # an answer without a body ends here
            self._response_end()

    def _lease_served(self, address: str) -> None:
        request = self.request
        if request is None:
            return
        base = request.call.target.base.name
        pods = self.services.fleets.pods.get(base, {})
        pod = next((pod for pod, endpoint in pods.items() if _destination(endpoint, request) == address), None)
        if pod is None:
            return
        fleet = self.services.fleets.fleet(base)
        adapter = request.call.target.adapter
        warm = adapter is None or fleet.is_warm(pod, adapter.task_id)
        decision = Decision(pod, not warm, warm, fleet.policy_name, "gateway-fallback")
        self.cold = not warm
        try:
            self.lease = self.dispatcher.admission.lease(fleet, decision, self.dispatcher.admission.route_request(
                request.call))
        except UnknownPod:
            self.lease = None
        self.decision = decision

    def _response_chunk(self, chunk: bytes, record: RequestRecord) -> None:
        """Book one chunk of the answer; ``complete`` once it is whole: its content-length reached (a gateway may
        close the stream before the empty end-of-stream chunk) or an OpenAI stream's ``[DONE]``."""
        if self.body_left is not None:
            self.body_left -= len(chunk)
            if self.body_left <= 0:
                self.complete = True
        if self.status == 200 and chunk.rstrip().endswith(SSE_DONE):
            self.complete = True
        if self.status != 200:
            if len(self.error_body) < ERROR_TEXT_BYTES:
                self.error_body += chunk[: ERROR_TEXT_BYTES - len(self.error_body)]
            return
        if self.output is not None:  # its tenant pays for the output as it streams
            self.output.add(self.meter.feed(chunk))
        if self.answered or not chunk:
            return
        self.answered = True
        record.first_output_s = time.perf_counter()
        lease = self.lease
        if lease is not None:
            lease.answered()
            request = self.request
            if request is not None and request.call.priority is not Priority.BATCH:
                waited_s = time.perf_counter() - record.started_s
                self.dispatcher.admission.interactive.first_answer(lease.base_model, waited_s)

    def _response_end(self) -> None:
        self.complete = True
        if self.status == 200:
            self._end(Outcome.OK, blame=False)
            return
        failure = self._failure()
        outcome = {FailureKind.MISS: Outcome.MISS, FailureKind.CACHE_FULL: Outcome.CACHE_FULL}.get(
            failure.kind, Outcome.FAILED
        )
        self._end(outcome, blame=failure.blames_pod, reason=failure.kind.value)

    def _failure(self) -> UpstreamFailure:
        """The error answer, classified as the router classifies its own."""
        text = error_text(self.error_body) if self.error_body else f"HTTP {self.status}"
        if any(marker in text for marker in GATEWAY_FAILURE_TEXTS):
            return UpstreamFailure(FailureKind.POD_FAILED, text)
        if self.openai:
            return classify_answer(self.status, text)
        return answer_failure(self.status, text)

    def _stream_ended(self) -> None:
        """The stream ended before the answer's end reached the picker: the client went away (a client that has
        read an OpenAI stream's ``[DONE]`` may close before the body's last empty chunk). Once the pod answered,
        the request did its work there; before that, it failed, and the pod is not to blame."""
        self._end(Outcome.OK if self.answered else Outcome.FAILED, blame=False)

    def _end(self, outcome: Outcome, *, blame: bool, reason: str = FailureKind.POD_FAILED.value) -> None:
        """End the lease (once) with ``outcome``; ``blame``: the pod failed (outlier detection)."""
        lease, self.lease = self.lease, None
        if lease is None:
            return
        request, decision = self.request, self.decision
        adapter = request.call.target.adapter if request is not None else None
        if adapter is not None:
            metrics = self.services.metrics
            label = metrics.adapter_label(adapter.served_name)
            if outcome is Outcome.MISS:
                metrics.adapter_cache_misses.labels(label).inc()
            elif outcome is Outcome.OK and decision is not None and not self.cold:
                metrics.adapter_cache_hits.labels(label).inc()
        lease.end(outcome)
        if blame:
            self.dispatcher.blame(lease.base_model, lease.pod, reason)

    def _refusal(self, error: RouterError) -> ext_proc.ProcessingResponse:
        body = openai_error_body(error) if self.openai else triton_error_body(error)
        return envoy.immediate(mapping_for(error).http_status, body, http_headers_for(error))


def _destination(endpoint: PodEndpoint, request: GatewayRequest | None) -> str | None:
    """Where the gateway sends ``request`` on this pod: its HTTP port (trtllm-serve's is its only port; a Triton pod
    without a known HTTP port cannot be reached through a gateway)."""
    if endpoint.http_address:
        return endpoint.http_address
    if request is not None and request.call.payload.openai_json() is not None:
        return endpoint.address
    return None
