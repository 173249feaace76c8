"""The reference engine's in-flight batcher behind asyncio: submit a request, iterate its tokens, cancel it.

:class:`EngineBridge` runs the very same :class:`~trtfleet_engines.reference.scheduler.InflightBatcher` and
:class:`~trtfleet_engines.reference.loop.EngineLoop` the Triton reference model runs, with a
:class:`~trtfleet_engines.reference.serve.adapters.PeftAdapterStore` as its LoRA cache. The loop thread
hands each response to the request's :class:`TokenStream`, which moves it onto the event loop. A client that
goes away cancels its request by its ``user_id`` (the next step retires it and frees its adapter).
Iteration stats go to a bounded queue that ``GET /metrics`` drains, as upstream's ``get_stats_async`` does; each
entry stands for the iterations since the one before, so its ``specDecodingStats`` counts are the drafts of those
iterations (upstream's entries are one iteration each, and readers sum them alike).
"""

from __future__ import annotations

import asyncio
import itertools
import time
from collections import deque
from collections.abc import AsyncIterator
from dataclasses import dataclass, replace
from typing import Any

from trtfleet_engines.reference.loop import EngineLoop
from trtfleet_engines.reference.scheduler import BatcherStats, EngineResponse, GenerationRequest, InflightBatcher

STATS_QUEUE_LENGTH = 1000
"""Iteration-stat entries kept between two ``GET /metrics`` calls."""


class TokenStream:
    """One request's responses, delivered from the loop thread to the event loop."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self._queue: asyncio.Queue[EngineResponse[TokenStream]] = asyncio.Queue()

    def push(self, response: EngineResponse[TokenStream]) -> None:
        """Called on the loop thread."""
        self._loop.call_soon_threadsafe(self._queue.put_nowait, response)

    async def next(self) -> EngineResponse[TokenStream]:
        return await self._queue.get()


@dataclass(frozen=True)
class Submitted:
    user_id: str
    stream: TokenStream


class EngineBridge:
    """Owns the engine thread; every method is called on the event loop."""

    def __init__(
        self,
        batcher: InflightBatcher[TokenStream],
        *,
        min_step_s: float = 0.0,
        prefill_s_per_token: float = 0.0,
        pcie_bytes_per_s: float = 0.0,
    ) -> None:
        self._batcher = batcher
        self._engine = EngineLoop(
            batcher,
            self._deliver,
            on_stats=self._record_stats,
            min_step_s=min_step_s,
            prefill_s_per_token=prefill_s_per_token,
            host_to_device_bytes_per_s=pcie_bytes_per_s,
        )
        self._stats: deque[dict[str, Any]] = deque(maxlen=STATS_QUEUE_LENGTH)
        self._user_ids = itertools.count(1)
        self._spec_seen = (0, 0, 0)
        self.completed_requests = 0
        self.healthy = False

    def start(self) -> None:
        self._engine.start()
        self.healthy = True

    def stop(self) -> None:
        self.healthy = False
        self._engine.stop()

    def submit(self, request: GenerationRequest) -> Submitted:
        """Queue ``request`` (raises the batcher's EnqueueRejected / QueueFullError)."""
        user_id = f"serve-{next(self._user_ids)}"
        stream = TokenStream(asyncio.get_running_loop())
        self._engine.submit(_with_user_id(request, user_id), stream)
        return Submitted(user_id, stream)

    def cancel(self, user_id: str) -> None:
        self._engine.stop_user_request(user_id)

    async def responses(self, submitted: Submitted) -> AsyncIterator[EngineResponse[TokenStream]]:
        """The request's responses up to and including the final one."""
        while True:
            response = await submitted.stream.next()
            yield response
            if response.final:
                self.completed_requests += 1
                return

    def stats(self) -> BatcherStats:
        return self._engine.stats()

    def drain_kv_cache_events(self) -> list[dict[str, Any]]:
        return self._engine.drain_kv_cache_events()

    def drain_iteration_stats(self) -> list[dict[str, Any]]:
        out = list(self._stats)
        self._stats.clear()
        return out

    def _deliver(self, responses: list[EngineResponse[TokenStream]]) -> None:
        for response in responses:
            response.handle.push(response)

    def _record_stats(self, stats: BatcherStats) -> None:
        """Called on the loop thread; deque appends are atomic."""
        entry = iteration_stats(stats, self.completed_requests)
        if stats.speculative:
            seen = (stats.spec_draft_tokens, stats.spec_accepted_tokens, stats.spec_steps_with_drafts)
            drafted, accepted, steps = (now - before for now, before in zip(seen, self._spec_seen, strict=True))
            self._spec_seen = seen
            entry["specDecodingStats"] = {
                "numDraftTokens": drafted,
                "numAcceptedTokens": accepted,
                "numRequestsWithDraftTokens": steps,
                "acceptanceLength": 1.0 + accepted / steps if steps else 1.0,
                "iterLatencyMS": 0.0,
                "draftOverhead": 0.0,
            }
            entry["trtfleetReferenceSpecDecodingByAdapter"] = [
                {"loraId": task_id, "numDraftTokens": d, "numAcceptedTokens": a}
                for task_id, d, a in stats.spec_by_adapter
            ]
        self._stats.append(entry)


def _with_user_id(request: GenerationRequest, user_id: str) -> GenerationRequest:
    return replace(request, user_id=user_id)


def iteration_stats(stats: BatcherStats, completed: int) -> dict[str, Any]:
    """One ``/metrics`` entry in upstream's shape (``tensorrt_llm/executor/iteration_stats``); no GPU here."""
    free = max(stats.kv_max_blocks - stats.kv_used_blocks, 0)
    return {
        "timestamp": time.strftime("%m-%d-%Y %H:%M:%S"),
        "iter": stats.iterations,
        "iterLatencyMS": 0.0,
        "numActiveRequests": stats.active_requests,
        "numQueuedRequests": stats.waiting_requests,
        "numCompletedRequests": completed,
        "maxNumActiveRequests": stats.max_active_requests,
        "gpuMemUsage": 0,
        "cpuMemUsage": 0,
        "pinnedMemUsage": 0,
        "kvCacheStats": {
            "maxNumBlocks": stats.kv_max_blocks,
            "freeNumBlocks": free,
            "usedNumBlocks": stats.kv_used_blocks,
            "tokensPerBlock": stats.kv_tokens_per_block,
            "allocTotalBlocks": stats.kv_alloc_total_blocks,
            "allocNewBlocks": stats.kv_alloc_new_blocks,
            "reusedBlocks": stats.kv_reused_blocks,
            "missedBlocks": stats.kv_missed_blocks,
            "cacheHitRate": stats.kv_cache_hit_rate,
        },
        "inflightBatchingStats": {
            "numScheduledRequests": stats.scheduled_requests,
            "numContextRequests": stats.context_requests,
            "numGenRequests": stats.generation_requests,
            "numPausedRequests": stats.paused_requests,
            "numCtxTokens": stats.context_tokens,
            "microBatchId": 0,
            "avgNumDecodedTokensPerIter": stats.avg_decoded_tokens_per_iter,
        },
    }
