"""One attempt of a request on one pod: which transport carries it, and the stream timeouts around it.

* **transport**: a warm text request (no weights) goes over Triton HTTP when the pod's HTTP port is known
  (:mod:`.http_transport`), everything else over gRPC ``ModelStreamInfer``, as its own call for client
  streams and multiplexed on shared streams for unary requests (:mod:`.transport`, ``--upstream-calls``);
* **timeouts**: a pod that sends no first answer within the first-token timeout (plus ``max_tokens``
  inter-token timeouts when the answer comes in one piece), or no next answer within the inter-token
  timeout, has *stalled*: the call is cancelled and the attempt fails as ``stalled``;
* **ejection**: when outlier detection ejects a pod, the attempts there still waiting for their first
  answer end at once (their timers are moved to now), so the dispatcher retries them elsewhere.

Failures leave as :class:`~.failures.UpstreamCallFailed` (the transports' own error type, passed through).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator

from tritonclient.grpc import service_pb2

from trtfleet_router.fleets import PodEndpoint
from trtfleet_router.metrics import RouterMetrics
from trtfleet_router.routing.config import StreamTimeouts
from trtfleet_router.upstream.call import UpstreamCall, UpstreamCalls
from trtfleet_router.upstream.failures import UpstreamCallFailed
from trtfleet_router.upstream.http_transport import HttpTransport
from trtfleet_router.upstream.pool import ChannelPool
from trtfleet_router.upstream.protocol import (
    FailureKind,
    UpstreamFailure,
    classify_upstream_error,
    has_outputs,
    request_stream_final_flag,
)
from trtfleet_router.upstream.transport import (
    STREAMS_PER_POD_DEFAULT,
    MultiplexedTransport,
    PerCallTransport,
)


class Attempts:
    """The transports, and the first-answer waits of the attempts in flight (per base model and pod)."""

    def __init__(
        self,
        pool: ChannelPool,
        metrics: RouterMetrics,
        *,
        calls: UpstreamCalls = UpstreamCalls.AUTO,
        streams_per_pod: int = STREAMS_PER_POD_DEFAULT,
        warm_over_http: bool = True,
    ) -> None:
        self.metrics = metrics
        self.calls = calls
        self.per_call = PerCallTransport(pool)
        self.multiplexed = MultiplexedTransport(pool, streams_per_pod)
        self.http = HttpTransport()
        self.warm_over_http = warm_over_http
        self._first_answer_waits: dict[tuple[str, str], set[asyncio.Timeout]] = {}  # (base, pod) -> timers

    def end_first_answer_waits(self, base_name: str, pod: str) -> None:
        """The pod was ejected: attempts there still waiting for a first answer stall now."""
        now = asyncio.get_running_loop().time()
        for timer in self._first_answer_waits.pop((base_name, pod), set()):
            if not timer.expired():
                timer.reschedule(now)

    def exchange(
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

    async def run(
        self,
        endpoint: PodEndpoint,
        request: service_pb2.ModelInferRequest | None,
        call: UpstreamCall,
        timeouts: StreamTimeouts,
    ) -> AsyncGenerator[service_pb2.ModelInferResponse, None]:
        """One attempt on one pod; yields responses with outputs (with the caller's request id back),
        raises UpstreamCallFailed. A pod silent for longer than the first-token timeout (plus
        ``max_tokens`` inter-token timeouts when the answer comes in one piece) or, once it answered, the
        inter-token timeout has *stalled* (the call is cancelled)."""
        exchange = self.exchange(endpoint, request, call)
        wait_s = timeouts.first_token_s
        if not call.client_streaming:
            wait_s += call.max_tokens * timeouts.inter_token_s
        answered = False
        waiting = self._first_answer_waits.setdefault((call.target.base.name, endpoint.pod_id), set())
        try:
            while True:
                try:
                    async with asyncio.timeout(wait_s) as timer:
                        if answered:
                            message = await anext(exchange)
                        else:
                            waiting.add(timer)  # an ejection of the pod ends the wait at once
                            try:
                                message = await anext(exchange)
                            finally:
                                waiting.discard(timer)
                except StopAsyncIteration:
                    return
                except TimeoutError as exc:
                    which = "next answer" if answered else "first answer (or the pod was ejected)"
                    message_text = f"pod {endpoint.pod_id} stalled: no {which} within {wait_s:g} s"
                    raise UpstreamCallFailed(UpstreamFailure(FailureKind.STALLED, message_text)) from exc
                if message.error_message:
                    raise UpstreamCallFailed(classify_upstream_error(message.error_message))
                answered = True
                wait_s = timeouts.inter_token_s
                response = message.infer_response
                if has_outputs(response):
                    response.id = call.client_id
                    yield response
        finally:
            await exchange.aclose()

    def retain(self, addresses: set[str]) -> None:
        """Forget shared streams to pods discovery no longer lists."""
        self.multiplexed.retain(addresses)

    async def close(self) -> None:
        await self.multiplexed.close()
        await self.http.close()
