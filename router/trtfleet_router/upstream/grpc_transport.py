"""Attempts over gRPC ``ModelStreamInfer``: a call of their own, or multiplexed on shared streams.

Both carry any payload with a gRPC form (:class:`~.transport.Attempt`; the only wire that carries LoRA
weights), yield the pod's ``ModelStreamInferResponse`` messages for one request until its final response
(every attempt asks for ``triton_enable_empty_final_response``) and raise
:class:`~.failures.UpstreamCallFailed` (a classified failure) when the call or stream fails.

* :class:`PerCallTransport`: one ``ModelStreamInfer`` call per request. Cancelling the consumer
  cancels the call, and Triton cancels the request in the engine. About 3x the client-side CPU of
  multiplexing under grpc.aio (each call is a new HTTP/2 stream plus several completion-queue hops).
  A call whose final response arrived is left to end with the server's status (``SETTLE_S`` at most,
  in the background) rather than cancelled: on Triton 2.51 a cancellation that meets the end of a
  stream can leave the server holding the model, which then never unloads (``stop`` of a worker
  waits out its exit timeout); the race is fixed in triton-inference-server/server@42811e0.
* :class:`MultiplexedTransport`: ``streams_per_pod`` long-lived ``ModelStreamInfer`` calls per pod,
  requests tagged with router-unique ids and answers routed back by ``id`` (Triton puts the request id
  on every response, errors included). A consumer that goes away stops listening but cannot cancel
  its request (a shared stream has no per-request cancel; the BLS/ensemble models take no ``stop``),
  so the engine finishes it. A broken stream fails every request on it (as ``pod_failed``: retried
  elsewhere when nothing was sent to the client yet) and is reopened by the next request.

Per-call carries client streams (where clients hang up mid-generation) and multiplexing unary requests,
unless :class:`UpstreamCalls` (``--upstream-calls``) says otherwise; warm requests may skip gRPC altogether
(:mod:`.http_transport`).
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import time
from collections.abc import AsyncGenerator
from enum import StrEnum
from typing import Final

import grpc
from tritonclient.grpc import service_pb2

from trtfleet_router.upstream.failures import UpstreamCallFailed, failure_of, translated
from trtfleet_router.upstream.pool import ChannelPool
from trtfleet_router.upstream.protocol import FailureKind, UpstreamFailure, is_final
from trtfleet_router.upstream.transport import Attempt

log = logging.getLogger(__name__)


class UpstreamCalls(StrEnum):
    """Which gRPC transport carries an attempt."""

    AUTO = "auto"  # client streams: a call each (cancellable); unary requests: multiplexed
    PER_REQUEST = "per-request"
    MULTIPLEXED = "multiplexed"


STREAMS_PER_POD_DEFAULT: Final = 4
SETTLE_S: Final = 2.0
"""How long a finished call (or a shared stream closed at shutdown) may take to end with the server's own
status before it is cancelled."""


def _timeout_s(deadline_s: float) -> float:
    timeout_s = deadline_s - time.monotonic()
    if timeout_s <= 0:
        raise UpstreamCallFailed(UpstreamFailure(FailureKind.TIMEOUT, "the request deadline passed"))
    return timeout_s


async def _settle(call: grpc.aio.Call, cancel_after_s: float) -> None:
    """Let ``call`` end with the server's status; cancel it if that takes longer than ``cancel_after_s``."""
    try:
        async with asyncio.timeout(cancel_after_s):
            await call.code()
    except TimeoutError:
        call.cancel()


class PerCallTransport:
    label = "grpc_call"

    def __init__(self, pool: ChannelPool) -> None:
        self.pool = pool
        self._settling: set[asyncio.Task[None]] = set()

    def carries(self, attempt: Attempt) -> bool:
        return attempt.payload.infer_request() is not None

    async def exchange(self, attempt: Attempt) -> AsyncGenerator[service_pb2.ModelStreamInferResponse, None]:
        address = attempt.endpoint.address
        request = attempt.infer_request()
        call = self.pool.stub(address).ModelStreamInfer(timeout=_timeout_s(attempt.deadline_s))
        finished = False  # the request's final response (or its error) arrived
        try:
            with translated(address):
                await call.write(request)
                await call.done_writing()
                while True:
                    message = await call.read()
                    if message is grpc.aio.EOF:
                        return
                    finished = bool(message.error_message) or is_final(message.infer_response)  # before consumers
                    yield message
                    if finished:
                        return
        finally:
            if not call.done():
                if finished:  # nothing left to stop: let the server end the call (see the module docstring)
                    task = asyncio.get_running_loop().create_task(_settle(call, SETTLE_S))
                    self._settling.add(task)
                    task.add_done_callback(self._settling.discard)
                else:  # the consumer went away mid-request: cancelling makes Triton cancel it in the engine
                    call.cancel()

    async def close(self) -> None:
        """Wait for the calls that are still settling (each at most ``SETTLE_S``)."""
        if self._settling:
            await asyncio.gather(*self._settling, return_exceptions=True)


_BROKEN: Final = object()


class _SharedStream:
    """One long-lived ModelStreamInfer call and the requests waiting on it."""

    def __init__(self, pool: ChannelPool, address: str) -> None:
        self.address = address
        self.outgoing: asyncio.Queue[service_pb2.ModelInferRequest | None] = asyncio.Queue()
        self.waiting: dict[str, asyncio.Queue[object]] = {}
        self.failure: UpstreamFailure | None = None
        self.call = pool.stub(address).ModelStreamInfer(self._requests())
        self.reader = asyncio.create_task(self._read(), name=f"upstream-stream {address}")

    async def _requests(self) -> AsyncGenerator[service_pb2.ModelInferRequest, None]:
        while (request := await self.outgoing.get()) is not None:
            yield request

    async def _read(self) -> None:
        try:
            async for message in self.call:
                queue = self.waiting.get(message.infer_response.id)
                if queue is not None:
                    queue.put_nowait(message)
                elif message.error_message:
                    log.warning(
                        "upstream error for no waiting request",
                        extra={"ctx": {"pod": self.address, "error": message.error_message[:300]}},
                    )
            failure = UpstreamFailure(FailureKind.POD_FAILED, f"pod {self.address} closed the stream")
        except grpc.aio.AioRpcError as exc:
            failure = failure_of(exc, self.address)
            if failure.kind is not FailureKind.POD_FAILED:
                failure = UpstreamFailure(FailureKind.POD_FAILED, failure.message)
        except asyncio.CancelledError:
            failure = UpstreamFailure(FailureKind.POD_FAILED, "the stream was closed")
        self.failure = failure
        for queue in self.waiting.values():
            queue.put_nowait(_BROKEN)

    def close(self, *, settle_s: float = 0.0) -> asyncio.Task[None]:
        """End the stream: the request iterator ends (a half-close), then the call is cancelled at once, or
        after ``settle_s`` if the server has not ended it by then (a clean end avoids Triton 2.51's
        cancellation race, see the module docstring)."""
        self.outgoing.put_nowait(None)  # ends the request iterator grpc consumes
        if settle_s <= 0:
            self.call.cancel()
            self.reader.cancel()
            return self.reader
        return asyncio.get_running_loop().create_task(self._settle(settle_s))

    async def _settle(self, settle_s: float) -> None:
        try:
            async with asyncio.timeout(settle_s):
                await asyncio.shield(self.reader)
        except TimeoutError:
            self.call.cancel()
            self.reader.cancel()


class MultiplexedTransport:
    label = "grpc_shared"

    def __init__(
        self,
        pool: ChannelPool,
        streams_per_pod: int = STREAMS_PER_POD_DEFAULT,
        calls: UpstreamCalls = UpstreamCalls.AUTO,
    ) -> None:
        self.pool = pool
        self.streams_per_pod = streams_per_pod
        self.calls = calls
        self._streams: dict[str, list[_SharedStream | None]] = {}
        self._turn = itertools.count()
        self._ids = itertools.count(1)

    def carries(self, attempt: Attempt) -> bool:
        if self.calls is UpstreamCalls.PER_REQUEST or (self.calls is UpstreamCalls.AUTO and attempt.client_streaming):
            return False
        return attempt.payload.infer_request() is not None

    def _stream(self, address: str) -> _SharedStream:
        slots = self._streams.get(address)
        if slots is None:
            slots = self._streams[address] = [None] * self.streams_per_pod
        index = next(self._turn) % self.streams_per_pod
        stream = slots[index]
        if stream is None or stream.failure is not None:
            stream = slots[index] = _SharedStream(self.pool, address)
        return stream

    async def exchange(self, attempt: Attempt) -> AsyncGenerator[service_pb2.ModelStreamInferResponse, None]:
        address = attempt.endpoint.address
        request = attempt.infer_request()
        loop_deadline_s = asyncio.get_running_loop().time() + _timeout_s(attempt.deadline_s)
        stream = self._stream(address)
        request_id = f"t{next(self._ids):x}"
        request.id = request_id
        queue: asyncio.Queue[object] = asyncio.Queue()
        stream.waiting[request_id] = queue
        try:
            stream.outgoing.put_nowait(request)
            while True:
                if queue.empty():
                    try:
                        async with asyncio.timeout_at(loop_deadline_s):
                            message = await queue.get()
                    except TimeoutError as exc:
                        raise UpstreamCallFailed(failure_of(exc, address)) from exc
                else:
                    message = queue.get_nowait()
                if message is _BROKEN:
                    assert stream.failure is not None
                    raise UpstreamCallFailed(stream.failure)
                assert isinstance(message, service_pb2.ModelStreamInferResponse)
                done = bool(message.error_message) or is_final(message.infer_response)  # before consumers touch it
                yield message
                if done:
                    return
        finally:
            stream.waiting.pop(request_id, None)

    def retain(self, addresses: set[str], *, settle_s: float = 0.0) -> list[asyncio.Task[None]]:
        """Close the streams to pods not in ``addresses``; returns the tasks that end them."""
        closing = []
        for address in [a for a in self._streams if a not in addresses]:
            for stream in self._streams.pop(address):
                if stream is not None:
                    closing.append(stream.close(settle_s=settle_s))
        return closing

    async def close(self) -> None:
        """Half-close every stream (the router drained its requests first) and let the pods end them."""
        await asyncio.gather(*self.retain(set(), settle_s=SETTLE_S), return_exceptions=True)
