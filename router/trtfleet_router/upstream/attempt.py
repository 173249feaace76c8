"""One attempt of a request on one pod: which transport carries it, and the stream timeouts around it.

* **transport**: a warm text request (no weights) goes over Triton HTTP when the pod's HTTP port is known
  (:mod:`.http_transport`), everything else over gRPC ``ModelStreamInfer``, as its own call for client
  streams and multiplexed on shared streams for unary requests (:mod:`.transport`, ``--upstream-calls``);
* **timeouts**: a pod that sends no first answer within the first-token timeout (plus ``max_tokens``
  inter-token timeouts when the answer comes in one piece), or no next answer within the inter-token
  timeout, has *stalled*: the wait is cancelled (which cancels the call) and the attempt fails as
  ``stalled``. Only time spent waiting for the pod counts, never time the consumer spends with an answer;
* **ejection**: when outlier detection ejects a pod, the attempts there still waiting for their first
  answer stall at once, so the dispatcher retries them elsewhere.

The waits are watched by :class:`StallWatch`: an attempt registers its wait (a deadline on the loop clock)
around each read, and one timer per router sweeps the registered waits every ``SWEEP_S``. That costs a
set insert and removal per answer (well under a microsecond) where an ``asyncio.timeout`` per answer costs
a timer handle each (about 5 us on the project's machine); timeouts fire up to ``SWEEP_S`` late.

Failures leave as :class:`~.failures.UpstreamCallFailed` (the transports' own error type, passed through).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator
from typing import Any, Final

from tritonclient.grpc import service_pb2

from trtfleet_router.fleets import PodEndpoint
from trtfleet_router.metrics import RouterMetrics
from trtfleet_router.routing.config import StreamTimeouts
from trtfleet_router.upstream.call import UpstreamCall, UpstreamCalls
from trtfleet_router.upstream.failures import UpstreamCallFailed
from trtfleet_router.upstream.http_transport import HttpTransport
from trtfleet_router.upstream.openai_upstream import OpenAITransport
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

SWEEP_S: Final = 0.1


class _Wait:
    """One attempt's wait for its pod's next answer (reused across its answers)."""

    __slots__ = ("deadline_s", "first", "pod", "stalled", "task")

    def __init__(self, task: asyncio.Task[Any], pod: tuple[str, str]) -> None:
        self.task = task
        self.pod = pod  # (base model, pod id)
        self.deadline_s = 0.0
        self.first = True
        self.stalled = False


class StallWatch:
    """The waits of the attempts in flight; cancels those past their deadline, or on an ejected pod."""

    def __init__(self) -> None:
        self._waits: set[_Wait] = set()
        self._sweep_handle: asyncio.TimerHandle | None = None

    def start(self, wait: _Wait, timeout_s: float) -> None:
        loop = asyncio.get_running_loop()
        wait.deadline_s = loop.time() + timeout_s
        self._waits.add(wait)
        if self._sweep_handle is None:
            self._sweep_handle = loop.call_later(SWEEP_S, self._sweep)

    def done(self, wait: _Wait) -> None:
        self._waits.discard(wait)

    def _sweep(self) -> None:
        now = asyncio.get_running_loop().time()
        for wait in [w for w in self._waits if w.deadline_s <= now]:
            self._stall(wait)
        self._sweep_handle = asyncio.get_running_loop().call_later(SWEEP_S, self._sweep) if self._waits else None

    def stall_first_waits(self, pod: tuple[str, str]) -> None:
        for wait in [w for w in self._waits if w.first and w.pod == pod]:
            self._stall(wait)

    def _stall(self, wait: _Wait) -> None:
        """Only a registered wait is stalled: its task is then suspended in the read it guards."""
        self._waits.discard(wait)
        wait.stalled = True
        wait.task.cancel()

    def close(self) -> None:
        if self._sweep_handle is not None:
            self._sweep_handle.cancel()
            self._sweep_handle = None


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
        self.openai = OpenAITransport()
        self.warm_over_http = warm_over_http
        self.watch = StallWatch()

    def end_first_answer_waits(self, base_name: str, pod: str) -> None:
        """The pod was ejected: attempts there still waiting for a first answer stall now."""
        self.watch.stall_first_waits((base_name, pod))

    def exchange(
        self, endpoint: PodEndpoint, request: service_pb2.ModelInferRequest | None, call: UpstreamCall
    ) -> AsyncGenerator[service_pb2.ModelStreamInferResponse, None]:
        """The transport for this attempt: HTTP for a warm text request (``request`` is None: the call's
        own, no weights) when the pod has an HTTP port, else gRPC (per call or multiplexed, see
        :class:`UpstreamCalls`); trtllm-serve's OpenAI API for a ``pytorch`` base model."""
        if call.openai_body is not None:
            self.metrics.upstream_attempts.labels("openai").inc()
            address = endpoint.http_address or endpoint.address
            return self.openai.exchange(
                address, call.openai_path, call.openai_body, call.deadline_s, stream=call.client_streaming
            )
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
        task = asyncio.current_task()
        assert task is not None
        wait = _Wait(task, (call.target.base.name, endpoint.pod_id))
        watch = self.watch
        try:
            while True:
                watch.start(wait, wait_s)
                try:
                    message = await anext(exchange)
                except StopAsyncIteration:
                    return
                except asyncio.CancelledError:
                    if wait.stalled and task.uncancel() == 0:  # our cancellation, and no other pending
                        which = "first answer (or the pod was ejected)" if wait.first else "next answer"
                        text = f"pod {endpoint.pod_id} stalled: no {which} within {wait_s:g} s"
                        raise UpstreamCallFailed(UpstreamFailure(FailureKind.STALLED, text)) from None
                    raise
                finally:
                    watch.done(wait)
                if message.error_message:
                    raise UpstreamCallFailed(classify_upstream_error(message.error_message))
                wait.first = False
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
        self.watch.close()
        await self.per_call.close()
        await self.multiplexed.close()
        await self.http.close()
        await self.openai.close()
