"""One attempt of a request on one pod: which transport carries it, and the stream timeouts around it.

* **transport**: the first of the :class:`~.transport.Transport` s that carries the attempt, in this order:
  trtllm-serve's OpenAI API (runtime ``pytorch``), Triton HTTP generate (a warm request to a pod whose HTTP
  port is known), gRPC multiplexed on shared streams (unary requests), a gRPC call of its own (``--upstream-calls``
  chooses between the two gRPC ones);
* **timeouts**: a pod that sends no first answer within the first-token timeout (plus ``max_tokens``
  inter-token timeouts when the answer comes in one piece), or no next answer within the inter-token
  timeout, has *stalled*: the wait is cancelled (which cancels the call) and the attempt fails as
  ``stalled``. Only time spent waiting for the pod counts, never time the consumer spends with an answer;
* **ejection**: when outlier detection ejects a pod, the attempts there still waiting for their first
  answer stall at once, so the dispatcher retries them elsewhere.

The waits are watched by :class:`StallWatch`: an attempt registers its wait (a deadline on the loop clock)
around each read, and one timer per router sweeps the registered waits every ``SWEEP_S``: a set insert and
removal per answer instead of a timer handle each; timeouts fire up to ``SWEEP_S`` late.

An :class:`AttemptStream` is read with :meth:`~AttemptStream.next` (a coroutine, not a generator, so a token
passes through no more generator frames than the transport's own). Failures leave as
:class:`~.failures.UpstreamCallFailed`.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator
from typing import Any, Final

from tritonclient.grpc import service_pb2

from trtfleet_router.metrics import RouterMetrics
from trtfleet_router.routing.config import StreamTimeouts
from trtfleet_router.upstream.failures import UpstreamCallFailed
from trtfleet_router.upstream.grpc_transport import (
    STREAMS_PER_POD_DEFAULT,
    MultiplexedTransport,
    PerCallTransport,
    UpstreamCalls,
)
from trtfleet_router.upstream.http_transport import HttpTransport
from trtfleet_router.upstream.openai_transport import OpenAITransport
from trtfleet_router.upstream.pool import ChannelPool
from trtfleet_router.upstream.protocol import (
    FailureKind,
    UpstreamFailure,
    classify_upstream_error,
    has_outputs,
)
from trtfleet_router.upstream.transport import Attempt, Transport

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


class AttemptStream:
    """The answers of one attempt (with outputs), read one by one under the stream timeouts."""

    __slots__ = ("_exchange", "_first_s", "_inter_s", "_pod", "_wait", "_watch", "client_id")

    def __init__(
        self,
        exchange: AsyncGenerator[service_pb2.ModelStreamInferResponse, None],
        watch: StallWatch,
        pod: tuple[str, str],
        first_answer_s: float,
        inter_token_s: float,
        client_id: str,
    ) -> None:
        self._exchange = exchange
        self._watch = watch
        self._pod = pod
        self._first_s = first_answer_s
        self._inter_s = inter_token_s
        self.client_id = client_id
        self._wait: _Wait | None = None

    async def next(self) -> service_pb2.ModelInferResponse | None:
        """The next response with outputs (the client's id on it); None when the pod's answer ended.
        Raises :class:`UpstreamCallFailed` (stalled, or the pod's error)."""
        task = asyncio.current_task()
        assert task is not None
        wait, watch = self._wait, self._watch
        if wait is None:
            wait = self._wait = _Wait(task, self._pod)
        else:
            wait.task = task  # the reader's task: a stall cancels the read it guards
        while True:
            wait_s = self._first_s if wait.first else self._inter_s
            watch.start(wait, wait_s)
            try:
                message = await anext(self._exchange)
            except StopAsyncIteration:
                return None
            except asyncio.CancelledError:
                if wait.stalled and wait.task.uncancel() == 0:  # our cancellation, and no other pending
                    which = "first answer (or the pod was ejected)" if wait.first else "next answer"
                    text = f"pod {self._pod[1]} stalled: no {which} within {wait_s:g} s"
                    raise UpstreamCallFailed(UpstreamFailure(FailureKind.STALLED, text)) from None
                raise
            finally:
                watch.done(wait)
            if message.error_message:
                raise UpstreamCallFailed(classify_upstream_error(message.error_message))
            wait.first = False
            response = message.infer_response
            if has_outputs(response):
                response.id = self.client_id  # the client's (or none), never a transport's own
                return response

    async def close(self) -> None:
        """End the transport's exchange (a cancellation for the pod when its answer had not ended)."""
        await self._exchange.aclose()


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
        self.multiplexed = MultiplexedTransport(pool, streams_per_pod, calls)
        self.openai = OpenAITransport()
        self.transports: tuple[Transport, ...] = (
            self.openai,
            HttpTransport(enabled=warm_over_http),
            self.multiplexed,
            PerCallTransport(pool),
        )
        self.watch = StallWatch()

    def end_first_answer_waits(self, base_name: str, pod: str) -> None:
        """The pod was ejected: attempts there still waiting for a first answer stall now."""
        self.watch.stall_first_waits((base_name, pod))

    def transport_for(self, attempt: Attempt) -> Transport:
        for transport in self.transports:
            if transport.carries(attempt):
                return transport
        raise TypeError(f"no transport carries a {type(attempt.payload).__name__}")

    def open(
        self, attempt: Attempt, base_model: str, timeouts: StreamTimeouts, max_tokens: int, client_id: str
    ) -> AttemptStream:
        """Start ``attempt`` on the transport that carries it. A pod silent for longer than the first-token
        timeout (plus ``max_tokens`` inter-token timeouts when the answer comes in one piece) or, once it
        answered, the inter-token timeout has *stalled* (the call is cancelled)."""
        transport = self.transport_for(attempt)
        self.metrics.upstream_attempts.labels(transport.label).inc()
        first_s = timeouts.first_token_s
        if not attempt.client_streaming:
            first_s += max_tokens * timeouts.inter_token_s
        pod = (base_model, attempt.endpoint.pod_id)
        return AttemptStream(transport.exchange(attempt), self.watch, pod, first_s, timeouts.inter_token_s, client_id)

    def retain(self, addresses: set[str]) -> None:
        """Forget shared streams to pods discovery no longer lists."""
        self.multiplexed.retain(addresses)

    async def close(self) -> None:
        self.watch.close()
        for transport in self.transports:
            await transport.close()
