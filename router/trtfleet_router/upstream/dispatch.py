"""Sends one request to a pod of its base model: route, attach weights, stream, recover, retry.

One :class:`UpstreamCall` is a ``ModelInferRequest`` for the base model's upstream model with
``lora_task_id`` already set for an adapter (text requests also carry the same request as Triton
generate JSON). :meth:`Dispatcher.stream` yields the pod's responses:

* the fleet's :class:`~trtfleet_router.routing.types.Decision` picks the pod; when it says cold, the
  adapter's pre-serialised weights go along as raw ``lora_weights``/``lora_config`` tensors (gRPC);
  when it says *loading* (warm, but the weights are still in transit with an earlier request), the
  weights go along too: TRT-LLM ignores weights for an id it holds, so the cost is one transfer of the
  (already cached) weights, while an id-only request could overtake them and miss, and waiting for the
  earlier request's admission would cost its transfer + queue + prefill (and fail with it);
* the first response confirms the ticket (``Fleet.confirm``: the pod admitted the request and stored
  the weights it carried, so later requests go id-only);
* **waiting for capacity**: when every pod's LoRA cache is full of busy adapters (``CachesBusy``: the
  engine would say "Cache is full"), the request waits in a bounded FIFO per base model
  (:mod:`.capacity`, ``capacityWaitS`` / ``capacityQueueMax``, capped by its deadline) and routes again
  each time a request of that base model ends; 503 only after that;
* **transport** per attempt: a warm text request goes over Triton HTTP when the pod's HTTP port is
  known (:mod:`.http_transport`), everything else over gRPC ``ModelStreamInfer``, as its own call
  for client streams and multiplexed on shared streams for unary requests (:mod:`.transport`);
* **miss recovery**: a ``LoRA task N not found in cache`` answer before anything was yielded ->
  ``finish(MISS)`` and the same request *with* weights to the same pod, once, invisibly;
* **back-pressure**: a full LoRA cache or queue -> ``finish(CACHE_FULL | FAILED)``, next pod
  (``exclude_pods``) up to ``max_attempts``, then :class:`~trtfleet_router.errors.Overloaded` (429);
* **pod failure** (refused or broken connection) before the first response -> ``finish(FAILED)``, the
  pod is suspended until a health probe answers (:meth:`~trtfleet_router.fleets.FleetSet.suspend`),
  next pod, then :class:`~trtfleet_router.errors.Unavailable` (503);
* a failure after the first response was yielded is never retried (the client already has part of
  the answer): :class:`~trtfleet_router.errors.StreamInterrupted`.

Cancellation (the consumer closes the generator or its task is cancelled, e.g. the client went
away) cancels an own gRPC call or closes the HTTP connection, which makes Triton cancel the request;
a request multiplexed on a shared stream is only abandoned (see :mod:`.transport`).
"""

from __future__ import annotations

import logging
import time
from collections.abc import AsyncGenerator, Callable, Mapping
from dataclasses import dataclass, replace
from enum import StrEnum
from typing import Any, Final

from tritonclient.grpc import service_pb2

from trtfleet_router.errors import (
    NoCapacityAvailable,
    Overloaded,
    RouterError,
    StreamInterrupted,
    Unavailable,
    UpstreamFailed,
    UpstreamRejected,
    UpstreamTimeout,
)
from trtfleet_router.fleets import FleetSet, PodEndpoint
from trtfleet_router.metrics import RouterMetrics
from trtfleet_router.models_registry import Target
from trtfleet_router.routing.fleet import Fleet
from trtfleet_router.routing.types import (
    AdapterTooLarge,
    CachesBusy,
    Decision,
    NoCapacity,
    Outcome,
    RouteRequest,
    UnknownPod,
)
from trtfleet_router.upstream.capacity import CapacityWaits
from trtfleet_router.upstream.http_transport import AnswerReader, HttpTransport
from trtfleet_router.upstream.modelinfo import ModelInfoCache
from trtfleet_router.upstream.pool import ChannelPool
from trtfleet_router.upstream.protocol import (
    FailureKind,
    UpstreamFailure,
    classify_upstream_error,
    has_outputs,
    request_stream_final_flag,
    with_weights,
)
from trtfleet_router.upstream.transport import (
    STREAMS_PER_POD_DEFAULT,
    MultiplexedTransport,
    PerCallTransport,
    TransportError,
)
from trtfleet_router.weights import ArtifactRef, WeightStore

log = logging.getLogger(__name__)

MAX_ATTEMPTS_DEFAULT: Final = 3
MISS_RECOVERY_REASON: Final = "miss-recovery"

_OUTCOMES: Final = {
    FailureKind.MISS: Outcome.MISS,
    FailureKind.CACHE_FULL: Outcome.CACHE_FULL,
}


@dataclass(slots=True)
class UpstreamCall:
    """One request for the dispatcher. ``request`` may be ``None`` when ``build_request`` makes it on
    first use: a warm text request that travels as ``http_body`` never needs the gRPC message."""

    request_id: str
    target: Target
    request: service_pb2.ModelInferRequest | None  # for target.base.upstream_model, lora_task_id set
    prompt_tokens: int
    max_tokens: int
    deadline_s: float  # on time.monotonic()
    client_streaming: bool = False  # the client receives the answer as a stream (see UpstreamCalls.AUTO)
    pinned_decision: Decision | None = None  # prewarming: this pod, with weights, no retry elsewhere
    http_body: Mapping[str, Any] | None = None  # the same request as Triton generate JSON (warm attempts)
    build_request: Callable[[], service_pb2.ModelInferRequest] | None = None
    upstream_model: str = ""  # the model the request is for (taken from ``request`` when empty)
    http_stream: bool = False  # http_body goes to generate_stream (SSE) instead of generate
    http_answer: AnswerReader | None = None  # reads the pod's generate JSON (default: text_output only)

    def grpc_request(self) -> service_pb2.ModelInferRequest:
        """The gRPC request, built on first use."""
        if self.request is None:
            if self.build_request is None:
                raise ValueError("an UpstreamCall needs a request or a build_request")
            self.request = self.build_request()
        return self.request

    @property
    def model_name(self) -> str:
        return self.upstream_model or self.grpc_request().model_name

    @property
    def client_id(self) -> str:
        """The id the client sent (gRPC/tensor calls) or the router's request id (text calls)."""
        return self.request.id if self.request is not None else self.request_id


class UpstreamCalls(StrEnum):
    """How attempts travel (see :mod:`~trtfleet_router.upstream.transport`)."""

    AUTO = "auto"  # client streams: a call each (cancellable); unary requests: multiplexed
    PER_REQUEST = "per-request"
    MULTIPLEXED = "multiplexed"


class UpstreamCallFailed(Exception):
    """Internal: one attempt failed (carries the classified failure; ``transport``: the call or stream
    itself broke, not an error answer of the model)."""

    def __init__(self, failure: UpstreamFailure, *, transport: bool = False) -> None:
        super().__init__(failure.message)
        self.failure = failure
        self.transport = transport


class Dispatcher:
    def __init__(
        self,
        fleets: FleetSet,
        pool: ChannelPool,
        weights: WeightStore,
        model_info: ModelInfoCache,
        metrics: RouterMetrics,
        *,
        max_attempts: int = MAX_ATTEMPTS_DEFAULT,
        calls: UpstreamCalls = UpstreamCalls.AUTO,
        streams_per_pod: int = STREAMS_PER_POD_DEFAULT,
        warm_over_http: bool = True,
    ) -> None:
        self.fleets = fleets
        self.pool = pool
        self.weights = weights
        self.model_info = model_info
        self.metrics = metrics
        self.max_attempts = max_attempts
        self.calls = calls
        self.per_call = PerCallTransport(pool)
        self.multiplexed = MultiplexedTransport(pool, streams_per_pod)
        self.http = HttpTransport()
        self.warm_over_http = warm_over_http
        self.capacity_waits = CapacityWaits(fleets.routing_config.capacity_queue_max)

    async def stream(self, call: UpstreamCall) -> AsyncGenerator[service_pb2.ModelInferResponse, None]:
        """Responses of the pod that serves ``call`` (see the module docstring for retries)."""
        target = call.target
        base_name = target.base.name
        fleet = self.fleets.fleet(base_name)
        adapter = target.adapter
        route = RouteRequest(
            base_name,
            adapter.ref if adapter is not None else None,
            call.prompt_tokens,
            call.max_tokens,
            call.request_id,
        )
        attempts = 0
        miss_recovered = False
        forced: Decision | None = call.pinned_decision
        max_attempts = 1 if call.pinned_decision is not None else self.max_attempts
        last: UpstreamFailure | None = None
        adapter_label = self.metrics.adapter_label(adapter.served_name if adapter else None)
        while True:
            decision = forced if forced is not None else await self._route(fleet, route, last, call.deadline_s)
            forced = None
            endpoint = self.fleets.endpoint(base_name, decision.pod)
            try:
                if endpoint is None:
                    raise UnknownPod(decision.pod)
                ticket = fleet.start(decision, route)
            except UnknownPod:
                if call.pinned_decision is not None:
                    raise NoCapacityAvailable(f"pod {decision.pod} left the fleet") from None
                route = replace(route, exclude_pods=route.exclude_pods | {decision.pod})
                continue
            attempts += 1
            self.metrics.inflight_requests.labels(decision.pod).inc()
            outcome = Outcome.FAILED
            yielded = False
            try:
                request = None  # the call's own request (built only if it travels over gRPC)
                if (decision.send_weights or decision.loading) and adapter is not None:
                    weights = await self.weights.get(ArtifactRef(adapter.artifact_uri, adapter.sha256))
                    info = await self.model_info.info(target.base)
                    request = with_weights(call.grpc_request(), info, weights)
                    if decision.send_weights:
                        self.metrics.adapter_loads.labels(adapter_label).inc()
                    self.metrics.weight_bytes_sent.inc(weights.nbytes)
                async for response in self._attempt(endpoint, request, call):
                    if not yielded:
                        yielded = True
                        fleet.confirm(ticket)
                    outcome = Outcome.OK
                    yield response
                outcome = Outcome.OK
                if adapter is not None and not decision.send_weights:
                    self.metrics.adapter_cache_hits.labels(adapter_label).inc()
                log.debug(
                    "upstream done",
                    extra={
                        "ctx": {
                            "request_id": call.request_id,
                            "pod": decision.pod,
                            "adapter": adapter_label,
                            "warm": decision.warm,
                            "reason": decision.reason,
                            "attempts": attempts,
                        }
                    },
                )
                return
            except UpstreamCallFailed as exc:
                failure = exc.failure
                outcome = _OUTCOMES.get(failure.kind, Outcome.FAILED)
                self._log_failure(call, decision, failure, yielded)
                if exc.transport:
                    self.fleets.suspend(base_name, decision.pod)
                if yielded:
                    raise StreamInterrupted(
                        f"the stream from pod {decision.pod} broke after it started: {failure.message}"
                    ) from exc
                if failure.kind is FailureKind.MISS and adapter is not None:
                    self.metrics.adapter_cache_misses.labels(adapter_label).inc()
                    if not miss_recovered and not decision.send_weights:
                        miss_recovered = True
                        self.metrics.upstream_retries.labels("miss").inc()
                        forced = Decision(decision.pod, True, False, decision.policy, MISS_RECOVERY_REASON)
                        continue
                last = failure
                if failure.retry_elsewhere and attempts < max_attempts:
                    self.metrics.upstream_retries.labels(failure.kind.value).inc()
                    route = replace(route, exclude_pods=route.exclude_pods | {decision.pod})
                    continue
                raise _final_error(failure, decision.pod) from exc
            finally:
                self.metrics.inflight_requests.labels(decision.pod).dec()
                fleet.finish(ticket, outcome)
                self.capacity_waits.notify(base_name)

    async def _route(
        self, fleet: Fleet, route: RouteRequest, last: UpstreamFailure | None, deadline_s: float
    ) -> Decision:
        """The fleet's decision; while every cache is full of busy adapters, wait for capacity (see
        :mod:`.capacity`) until ``capacityWaitS`` or the deadline, then the client-facing error."""
        waits = self.capacity_waits
        base = route.model
        woken = False
        wait_until_s = time.monotonic() + self.fleets.routing_config.capacity_wait_s
        while True:
            try:
                decision = self._route_once(fleet, route)
            except CachesBusy as exc:
                if not woken and not waits.can_wait(base):
                    self.metrics.capacity_waits.labels(base, "queue_full").inc()
                    raise _no_capacity_error(exc, last) from exc
                waiting = self.metrics.capacity_waiting.labels(base)
                waiting.inc()
                try:
                    woken = await waits.wait(base, min(wait_until_s, deadline_s) - time.monotonic(), first=woken)
                finally:
                    waiting.dec()
                if woken:
                    continue
                self.metrics.capacity_waits.labels(base, "timed_out").inc()
                raise _no_capacity_error(exc, last) from exc
            except NoCapacity as exc:
                raise _no_capacity_error(exc, last) from exc
            if woken:
                self.metrics.capacity_waits.labels(base, "routed").inc()
                waits.notify(base)  # the freed capacity may hold the next waiter too
            return decision

    def _route_once(self, fleet: Fleet, route: RouteRequest) -> Decision:
        started = time.perf_counter()
        try:
            return fleet.route(route)
        except AdapterTooLarge as exc:
            raise RouterError(str(exc), code="adapter_too_large") from exc
        finally:
            self.metrics.routing_decision.observe(time.perf_counter() - started)

    def _exchange(
        self, endpoint: PodEndpoint, request: service_pb2.ModelInferRequest | None, call: UpstreamCall
    ) -> AsyncGenerator[service_pb2.ModelStreamInferResponse, None]:
        """The transport for this attempt: HTTP for a warm text request (``request`` is None: the call's
        own, no weights) when the pod has an HTTP port, else gRPC (per call or multiplexed, see
        :class:`UpstreamCalls`)."""
        body = call.http_body
        if body is not None and request is None and endpoint.http_address and self.warm_over_http:
            self.metrics.upstream_attempts.labels("http").inc()
            return self.http.exchange(
                endpoint.http_address,
                call.model_name,
                body,
                call.deadline_s,
                stream=call.http_stream,
                reader=call.http_answer,
            )
        if request is None:
            request = call.grpc_request()
        request_stream_final_flag(request)
        multiplexed = self.calls is UpstreamCalls.MULTIPLEXED or (
            self.calls is UpstreamCalls.AUTO and not call.client_streaming
        )
        transport = self.multiplexed if multiplexed else self.per_call
        self.metrics.upstream_attempts.labels("grpc_shared" if multiplexed else "grpc_call").inc()
        return transport.exchange(endpoint.address, request, call.deadline_s)

    async def _attempt(
        self, endpoint: PodEndpoint, request: service_pb2.ModelInferRequest | None, call: UpstreamCall
    ) -> AsyncGenerator[service_pb2.ModelInferResponse, None]:
        """One attempt on one pod; yields responses with outputs (with the caller's request id back),
        raises UpstreamCallFailed."""
        try:
            async for message in self._exchange(endpoint, request, call):
                if message.error_message:
                    raise UpstreamCallFailed(classify_upstream_error(message.error_message))
                response = message.infer_response
                if has_outputs(response):
                    response.id = call.client_id
                    yield response
        except TransportError as exc:
            broken = exc.failure.kind is FailureKind.POD_FAILED
            raise UpstreamCallFailed(exc.failure, transport=broken) from exc

    def retain(self, addresses: set[str]) -> None:
        """Forget shared streams to pods discovery no longer lists."""
        self.multiplexed.retain(addresses)

    async def close(self) -> None:
        await self.multiplexed.close()
        await self.http.close()

    @staticmethod
    def _log_failure(call: UpstreamCall, decision: Decision, failure: UpstreamFailure, yielded: bool) -> None:
        log.warning(
            "upstream attempt failed",
            extra={
                "ctx": {
                    "request_id": call.request_id,
                    "pod": decision.pod,
                    "warm": decision.warm,
                    "adapter": call.target.adapter.served_name if call.target.adapter else None,
                    "kind": failure.kind.value,
                    "after_first_response": yielded,
                    "error": failure.message[:500],
                }
            },
        )


def _no_capacity_error(exc: NoCapacity, last: UpstreamFailure | None) -> RouterError:
    """The client-facing error when the fleet has no pod for the request (after any wait)."""
    retry_after_s = max(1, round(exc.retry_after_s))
    if last is not None and last.kind in (FailureKind.CACHE_FULL, FailureKind.QUEUE_FULL):
        return Overloaded(f"every pod tried is busy ({last.message}); retry later", retry_after_s=retry_after_s)
    if last is not None:
        return Unavailable(f"no pod could serve the request; last error: {last.message}", retry_after_s=retry_after_s)
    return NoCapacityAvailable(str(exc), retry_after_s=retry_after_s)


def _final_error(failure: UpstreamFailure, pod: str) -> RouterError:
    """The client-facing error once no retry is left (the one translation of upstream failures)."""
    kind = failure.kind
    if kind in (FailureKind.CACHE_FULL, FailureKind.QUEUE_FULL):
        return Overloaded(f"the serving pods are busy: {failure.message}")
    if kind is FailureKind.POD_FAILED:
        return Unavailable(f"pod {pod} failed: {failure.message}")
    if kind is FailureKind.INVALID:
        return UpstreamRejected(f"the engine rejected the request: {failure.message}")
    if kind is FailureKind.TIMEOUT:
        return UpstreamTimeout(f"no answer from pod {pod} before the deadline")
    if kind is FailureKind.MISS:
        return UpstreamFailed(f"pod {pod} did not accept the adapter's weights: {failure.message}")
    return UpstreamFailed(f"pod {pod} failed: {failure.message}")
