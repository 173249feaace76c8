"""The client side of :mod:`bench.router_overhead` and :mod:`bench.peer_overhead`: one request of each kind
(HTTP unary or SSE, gRPC ``ModelStreamInfer``) timed as (time to the first text, total), the sequential
latency pair with the direct and router sides interleaved, and a closed-loop throughput."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import aiohttp
from trtfleet_router.upstream.protocol import SamplingParams, UpstreamModelInfo, build_text_request, read_text

from bench.native_loadgen import percentile

PROMPT = "hello world, how are you"
MAX_TOKENS = 32


# -- one request of each kind: returns (ttft_s, total_s) --------------------------------------------------

Call = Callable[[], Awaitable[tuple[float, float]]]


def http_call(session: aiohttp.ClientSession, url: str, body: dict[str, Any], stream: bool) -> Call:
    payload = json.dumps(body).encode()
    headers = {"Content-Type": "application/json"}

    async def call() -> tuple[float, float]:
        started = time.perf_counter()
        first = 0.0
        async with session.post(url, data=payload, headers=headers) as response:
            if response.status != 200:
                raise RuntimeError(f"{url}: {response.status} {await response.text()}")
            if not stream:
                await response.read()
                total = time.perf_counter() - started
                return total, total
            async for line in response.content:
                if not first and line.startswith(b"data:") and b"[DONE]" not in line:
                    first = time.perf_counter() - started
        return first, time.perf_counter() - started

    return call


def grpc_call(stub: Any, model: str, task_id: int | None, stream: bool) -> Call:
    info = UpstreamModelInfo(name=model)

    async def call() -> tuple[float, float]:
        request = build_text_request(
            info, PROMPT, SamplingParams(max_tokens=MAX_TOKENS), stream=stream, task_id=task_id, request_id="b"
        )
        request.parameters["triton_enable_empty_final_response"].bool_param = True
        started = time.perf_counter()
        first = 0.0
        rpc = stub.ModelStreamInfer()
        await rpc.write(request)
        await rpc.done_writing()
        async for message in rpc:
            if message.error_message:
                raise RuntimeError(message.error_message)
            response = message.infer_response
            if not first and response.outputs and read_text(response).text:
                first = time.perf_counter() - started
            if response.parameters["triton_final_response"].bool_param:
                break
        return first, time.perf_counter() - started

    return call


@dataclass
class Latency:
    p50_ms: float
    p99_ms: float
    ttft_p50_ms: float
    ttft_p99_ms: float


def _summary(samples: list[tuple[float, float]]) -> Latency:
    ttfts, totals = [s[0] for s in samples], [s[1] for s in samples]
    return Latency(percentile(totals, 0.5), percentile(totals, 0.99), percentile(ttfts, 0.5), percentile(ttfts, 0.99))


async def latency_pair(direct: Call, routed: Call, requests: int) -> tuple[Latency, Latency]:
    """``requests`` sequential calls of each side, interleaved (direct, router, router, direct, ...) so
    that both sides see the same machine: a load spike on this shared box lands on both."""
    for _ in range(20):
        await direct()
        await routed()
    direct_samples, routed_samples = [], []
    for index in range(requests):
        first, second = (direct, routed) if index % 2 == 0 else (routed, direct)
        a, b = await first(), await second()
        direct_samples.append(a if first is direct else b)
        routed_samples.append(b if first is direct else a)
    return _summary(direct_samples), _summary(routed_samples)


async def throughput(call: Call, concurrency: int, duration_s: float) -> float:
    done = 0
    deadline = time.perf_counter() + duration_s

    async def worker() -> None:
        nonlocal done
        while time.perf_counter() < deadline:
            await call()
            done += 1

    started = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(concurrency)))
    return done / (time.perf_counter() - started)
