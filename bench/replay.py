"""The client of the real runs: one streamed completion timed (TTFT, end to end, chunks), a trace replayed
open loop against one router or several, and the samples summed up with the router's counters."""

from __future__ import annotations

import asyncio
import json
import math
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from bench.simstats import percentile
from bench.traces import TraceRequest, prompt_text


@dataclass(slots=True)
class Sample:
    """What the client saw of one request (``key``: its index in the trace)."""

    key: int
    status: int = 0
    ttft_s: float | None = None
    e2e_s: float | None = None
    output_tokens: int = 0  # usage.completion_tokens as the router reports it
    chunks: int = 0  # streamed chunks with text (one per engine step that produced text)
    error: str | None = None


async def stream_one(session: Any, url: str, key: int, request: TraceRequest, timeout_s: float,
                     prompt: str | None = None, headers: Mapping[str, str] | None = None) -> Sample:
    """``request`` as one streamed ``/v1/completions`` call to ``url`` (``prompt``: its text, else
    :func:`bench.traces.prompt_text`; ``headers``: more request headers); a failure is recorded in the sample, never
    raised."""
    import aiohttp

    sample = Sample(key)
    body = {
        "model": request.adapter, "prompt": prompt if prompt is not None else prompt_text(request.request_id,
                                                                                          request.prompt_tokens),
        "max_tokens": request.max_tokens, "temperature": 0, "stream": True,
        "stream_options": {"include_usage": True},
    }
    began = time.perf_counter()
    try:
        async with session.post(url, json=body, headers=headers,
                                timeout=aiohttp.ClientTimeout(total=timeout_s)) as response:
            sample.status = response.status
            if response.status != 200:
                sample.error = f"http {response.status}"
                await response.read()
                return sample
            async for raw in response.content:
                line = raw.decode().strip()
                if not line.startswith("data:"):
                    continue
                payload = line[5:].strip()
                if payload == "[DONE]":
                    break
                chunk = json.loads(payload)
                if "error" in chunk:
                    sample.error = "stream error"
                    break
                if any(c.get("text") for c in chunk.get("choices") or []):
                    sample.chunks += 1
                    if sample.ttft_s is None:
                        sample.ttft_s = time.perf_counter() - began
                if chunk.get("usage"):
                    sample.output_tokens = int(chunk["usage"].get("completion_tokens") or 0)
    except (TimeoutError, aiohttp.ClientError) as exc:
        sample.error = type(exc).__name__
        return sample
    if sample.error is None:
        sample.e2e_s = time.perf_counter() - began
        if sample.ttft_s is None:  # an empty answer: the first token was the end
            sample.ttft_s = sample.e2e_s
    return sample


async def replay(base_url: str, trace: Sequence[TraceRequest], timeout_s: float = 120.0,
                 prompts: Sequence[str] | None = None) -> list[Sample]:
    """Send every request at its ``t_s`` (open loop) and wait for all answers (``prompts``: their texts,
    else :func:`bench.traces.prompt_text`)."""
    return await replay_spread([base_url], [0] * len(trace), trace, timeout_s, prompts)


async def replay_spread(base_urls: Sequence[str], replica_of: Sequence[int], trace: Sequence[TraceRequest],
                        timeout_s: float = 120.0, prompts: Sequence[str] | None = None,
                        headers: Sequence[Mapping[str, str]] | None = None) -> list[Sample]:
    """:func:`replay`, request ``i`` sent to router ``base_urls[replica_of[i]]`` (router replicas), with
    ``headers[i]`` when given."""
    import aiohttp

    if len(replica_of) != len(trace):
        raise ValueError(f"{len(replica_of)} replica choices for {len(trace)} requests")
    urls = [f"{base_url}/v1/completions" for base_url in base_urls]
    connector = aiohttp.TCPConnector(limit=0)
    async with aiohttp.ClientSession(connector=connector) as session:
        loop = asyncio.get_running_loop()
        start = loop.time()
        tasks = []
        for key, request in enumerate(trace):
            delay = start + request.t_s - loop.time()
            if delay > 0:
                await asyncio.sleep(delay)
            prompt = prompts[key] if prompts is not None else None
            url = urls[replica_of[key]]
            extra = headers[key] if headers is not None else None
            tasks.append(asyncio.create_task(stream_one(session, url, key, request, timeout_s, prompt, extra)))
        return list(await asyncio.gather(*tasks))


def summarize_samples(policy: str, samples: Sequence[Sample], counters: dict[str, float],
                      duration_s: float) -> dict[str, Any]:
    served = [s for s in samples if s.error is None and s.e2e_s is not None]
    ttft = [s.ttft_s for s in served if s.ttft_s is not None]
    e2e = [s.e2e_s for s in served if s.e2e_s is not None]
    requests = len(samples)
    errors = requests - len(served)
    hits = counters["hits"]
    # Pod insertions: attempts that carried weights, less those the pod refused as "cache full" (the
    # weights were not stored). An attempt whose weights reached a pod already holding the adapter still
    # counts (the pod ignores them), so this errs high and the effective hit rate errs low.
    loads = counters["cold_starts"] - counters["cache_full"]
    return {
        "policy": policy, "requests": requests,
        "hit_rate": hits / requests, "effective_hit_rate": 1.0 - (loads + errors) / requests,
        "loads": int(loads), "weight_sends": int(counters["cold_starts"]), "misses": int(counters["misses"]),
        "cache_full": int(counters["cache_full"]), "weights_kb": counters["weight_bytes"] / 1e3,
        "ttft_p50_ms": percentile(ttft, 50) * 1e3, "ttft_p99_ms": percentile(ttft, 99) * 1e3,
        "e2e_p50_ms": percentile(e2e, 50) * 1e3, "e2e_p99_ms": percentile(e2e, 99) * 1e3,
        "output_tokens_per_s": sum(s.chunks for s in served) / duration_s if duration_s else math.nan,
        "usage_tokens_per_s": sum(s.output_tokens for s in served) / duration_s if duration_s else math.nan,
        "errors": errors,
    }
