"""The stall watch of one attempt (an AttemptStream over a scripted pod; no network): only time spent waiting
for the pod counts, a silent pod stalls the attempt, an ejection ends first-answer waits at once."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncGenerator
from types import SimpleNamespace
from typing import Any

import pytest
from tritonclient.grpc import service_pb2
from trtfleet_router.metrics import RouterMetrics
from trtfleet_router.routing.config import StreamTimeouts
from trtfleet_router.upstream.attempt import SWEEP_S, Attempts, AttemptStream
from trtfleet_router.upstream.failures import UpstreamCallFailed
from trtfleet_router.upstream.pool import ChannelPool
from trtfleet_router.upstream.protocol import FailureKind
from trtfleet_router.upstream.transport import Attempt

TIMEOUTS = StreamTimeouts(first_token_s=0.3, inter_token_s=0.3)
ENDPOINT: Any = SimpleNamespace(pod_id="p0", address="unused:1", http_address=None)
ATTEMPT = Attempt(payload=SimpleNamespace(), endpoint=ENDPOINT, deadline_s=1e12, client_streaming=True)  # type: ignore[arg-type]


def _answer() -> service_pb2.ModelStreamInferResponse:
    message = service_pb2.ModelStreamInferResponse()
    message.infer_response.outputs.add(name="text_output", datatype="BYTES", shape=[1, 1])
    return message


class _ScriptedPod:
    """A transport whose exchange is a scripted pod's answers."""

    label = "scripted"

    def __init__(self, pod: Any) -> None:
        self.pod = pod

    def carries(self, attempt: Attempt) -> bool:
        return True

    def exchange(self, attempt: Attempt) -> AsyncGenerator[service_pb2.ModelStreamInferResponse, None]:
        return self.pod()  # type: ignore[no-any-return]

    async def close(self) -> None:
        pass


def _attempts(pod: Any) -> Attempts:
    attempts = Attempts(ChannelPool(), RouterMetrics())
    attempts.transports = (_ScriptedPod(pod),)
    return attempts


def _open(attempts: Attempts, timeouts: StreamTimeouts) -> AttemptStream:
    return attempts.open(ATTEMPT, "tiny", timeouts, max_tokens=8, client_id="c1")


async def _next(stream: AttemptStream) -> service_pb2.ModelInferResponse:
    response = await stream.next()
    assert response is not None and response.id == "c1"  # the client's id back on every answer
    return response


async def _answers_then_silence(count: int) -> AsyncGenerator[service_pb2.ModelStreamInferResponse, None]:
    for _ in range(count):
        yield _answer()
    await asyncio.Event().wait()  # a frozen pod: nothing more, ever
    yield _answer()


def test_time_the_consumer_holds_an_answer_does_not_count() -> None:
    async def scenario() -> tuple[FailureKind, float]:
        attempts = _attempts(lambda: _answers_then_silence(2))
        run = _open(attempts, TIMEOUTS)
        await _next(run)
        await asyncio.sleep(3 * TIMEOUTS.inter_token_s)  # a slow client: longer than the inter-token timeout
        await _next(run)  # the pod had answered at once: no stall
        waited_from = time.monotonic()
        with pytest.raises(UpstreamCallFailed) as info:
            await run.next()
        waited_s = time.monotonic() - waited_from
        await attempts.close()
        return info.value.failure.kind, waited_s

    kind, waited_s = asyncio.run(scenario())
    assert kind is FailureKind.STALLED
    assert TIMEOUTS.inter_token_s <= waited_s  # never before its timeout (late by up to a sweep)


def test_an_ejection_ends_first_answer_waits_only() -> None:
    async def scenario() -> tuple[FailureKind, bool]:
        attempts = _attempts(lambda: _answers_then_silence(0))
        slow = StreamTimeouts(first_token_s=60.0, inter_token_s=60.0)
        waiting = asyncio.ensure_future(_open(attempts, slow).next())
        streaming_run = _attempts(lambda: _answers_then_silence(1))
        streaming_run.watch = attempts.watch  # the same watch: one router
        streaming = _open(streaming_run, slow)
        await _next(streaming)
        next_answer = asyncio.ensure_future(streaming.next())
        for _ in range(10):
            await asyncio.sleep(0)  # both reads are registered
        attempts.end_first_answer_waits("tiny", "p0")
        with pytest.raises(UpstreamCallFailed) as info:
            await waiting
        await asyncio.sleep(2 * SWEEP_S)
        still_streaming = not next_answer.done()  # a stream that had answered is not a first-answer wait
        next_answer.cancel()
        await attempts.close()
        return info.value.failure.kind, still_streaming

    kind, still_streaming = asyncio.run(scenario())
    assert kind is FailureKind.STALLED and still_streaming
