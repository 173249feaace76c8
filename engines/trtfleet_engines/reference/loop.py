"""The scheduler thread around :class:`~trtfleet_engines.reference.scheduler.InflightBatcher`.

Triton's ``execute`` thread calls :meth:`EngineLoop.submit` / :meth:`EngineLoop.stop_user_request`; the
loop thread runs steps while there is work and sleeps on a condition otherwise. Everything that talks to
Triton (sending responses, ``is_cancelled``, metric updates: each an IPC round trip to the server) happens
outside the lock and only while there is work or right after it: an idle engine makes no calls at all.
That matters at unload: a metric update in flight while the Python backend tears its queues down blocks
forever and leaves an orphaned stub process behind (seen with Triton 2.51).

Stats are reported after a step (before its responses are sent) when the active / waiting counts
changed, else at most every ``stats_period_s``, and once more when the engine becomes idle.
``is_cancelled`` is asked about every request at most every ``cancellation_period_s``. With
``min_step_s`` a step lasts at least that long (a pretend GPU step time, so tests and benchmarks get
long-lived requests), and ``prefill_s_per_token`` more for each prompt position the step computed (a
pretend prefill cost: positions served from reused KV blocks cost nothing, as on a GPU, so prefix reuse
shows in the first-token time the way it does there). The prefill part passes before the step's responses
go out (a first token exists only once its prompt is computed), the rest after them.

A pod's two copies of an adapter get a GPU pod's cost too: with ``host_to_device_bytes_per_s`` a step that
copies adapters from the host tier to the device tier lasts their bytes over it longer (before its responses,
as the copy precedes the step's compute); with ``network_bytes_per_s`` a request that carries LoRA weights
arrives (is fetched by the executor) only once they crossed the pod's link, one request's weights after the
other's, while requests without weights pass at once (an H100 pod's figures: docs/benchmarks/adapters.md).
Clock and sleep are injected.
"""

from __future__ import annotations

import dataclasses
import logging
import threading
import time
from collections.abc import Callable
from typing import Any, Generic, TypeVar

from trtfleet_engines.reference.scheduler import (
    BatcherStats,
    EngineResponse,
    GenerationRequest,
    InflightBatcher,
)
from trtfleet_engines.reference.settings import CANCELLATION_CHECK_PERIOD_S, STATS_PERIOD_S

logger = logging.getLogger(__name__)

H = TypeVar("H")

UNLOADING_TEXT = "the reference engine is shutting down"
NOTHING_SCHEDULED_WAIT_S = 0.001
"""Pause after a step that could schedule nothing (requests waiting for device pages or token budget)."""


class EngineLoop(Generic[H]):
    """Runs one batcher on a daemon thread; every public method is thread-safe."""

    def __init__(
        self,
        batcher: InflightBatcher[H],
        deliver: Callable[[list[EngineResponse[H]]], None],
        *,
        is_cancelled: Callable[[H], bool] | None = None,
        on_stats: Callable[[BatcherStats], None] | None = None,
        clock: Callable[[], float] = time.monotonic,
        cancellation_period_s: float = CANCELLATION_CHECK_PERIOD_S,
        stats_period_s: float = STATS_PERIOD_S,
        min_step_s: float = 0.0,
        prefill_s_per_token: float = 0.0,
        sleep: Callable[[float], None] = time.sleep,
        host_to_device_bytes_per_s: float = 0.0,
        network_bytes_per_s: float = 0.0,
    ) -> None:
        self._batcher = batcher
        self._deliver = deliver
        self._is_cancelled = is_cancelled
        self._on_stats = on_stats
        self._clock = clock
        self._cancellation_period_s = cancellation_period_s
        self._stats_period_s = stats_period_s
        self._min_step_s = min_step_s
        self._prefill_s_per_token = prefill_s_per_token
        self._sleep = sleep
        self._copy_bytes_per_s = host_to_device_bytes_per_s
        self._network_bytes_per_s = network_bytes_per_s
        self._link_free_s = float("-inf")  # when the pod's pretend link has carried the weights sent so far
        self._cond = threading.Condition()
        self._running = False
        self._thread: threading.Thread | None = None
        self._last_cancel_check = float("-inf")
        self._last_stats = float("-inf")
        self._last_counts: tuple[int, int] | None = None

    def start(self) -> None:
        with self._cond:
            self._running = True
        self._thread = threading.Thread(target=self._run, name="reference-scheduler", daemon=True)
        self._thread.start()

    def stop(self, timeout_s: float = 10.0) -> None:
        """Stop the thread, then fail whatever is still queued or running (if the thread did stop)."""
        with self._cond:
            self._running = False
            self._cond.notify_all()
        if self._thread is not None:
            self._thread.join(timeout_s)
            if self._thread.is_alive():
                logger.error("the scheduler thread did not stop within %.0f s", timeout_s)
                return
        with self._cond:
            leftovers = self._batcher.abort_all(UNLOADING_TEXT)
        self._safe_deliver(leftovers)

    def submit(self, request: GenerationRequest, handle: H) -> int:
        """Queue a request (raises EnqueueRejected / QueueFullError, as the executor's enqueue does)."""
        weights = request.lora.weights if request.lora is not None else None
        if self._network_bytes_per_s > 0 and weights is not None:
            with self._cond:  # the weights cross the link after the ones already on it
                start = max(self._clock(), self._link_free_s)
                self._link_free_s = start + int(weights.nbytes) / self._network_bytes_per_s
                request = dataclasses.replace(request, arrives_at_s=self._link_free_s)
        with self._cond:
            request_id = self._batcher.submit(request, handle)
            self._cond.notify_all()
        return request_id

    def stop_user_request(self, user_id: str) -> int:
        with self._cond:
            count = self._batcher.cancel_user_request(user_id)
            self._cond.notify_all()
        return count

    def stats(self) -> BatcherStats:
        with self._cond:
            return self._batcher.stats()

    def drain_kv_cache_events(self) -> list[dict[str, Any]]:
        """The KV-cache events since the last call (none when the pool keeps no event buffer)."""
        with self._cond:
            events = self._batcher.kv_cache.events
            return events.drain() if events is not None else []

    def _run(self) -> None:
        while True:
            with self._cond:
                while self._running and not self._batcher.has_work():
                    self._cond.wait()
                if not self._running:
                    return
                probe = self._cancellation_probe()
            cancelled = [request_id for request_id, handle in probe if self._ask_cancelled(handle)]
            started = self._clock()
            with self._cond:
                for request_id in cancelled:
                    self._batcher.cancel(request_id)
                computed_before = self._batcher.computed_prompt_tokens
                copied_before = self._batcher.copied_adapter_bytes
                try:
                    responses = self._batcher.step(self._clock())
                except Exception as exc:  # a model bug must fail the requests, not the thread
                    logger.exception("reference engine step failed")
                    responses = self._batcher.abort_all(f"reference engine step failed: {exc}")
                computed = self._batcher.computed_prompt_tokens - computed_before
                copied = self._batcher.copied_adapter_bytes - copied_before
                stats = self._due_stats(idle=not self._batcher.has_work())
                if not responses and self._batcher.stats().scheduled_requests == 0:
                    # nothing could run: do not spin; wait for the next weights to arrive (or a new request)
                    arrival = self._batcher.next_arrival_s()
                    wait_s = NOTHING_SCHEDULED_WAIT_S if arrival is None else arrival - self._clock()
                    self._cond.wait(max(wait_s, NOTHING_SCHEDULED_WAIT_S))
            prefill_s = computed * self._prefill_s_per_token
            if self._copy_bytes_per_s > 0:
                prefill_s += copied / self._copy_bytes_per_s  # the adapters' copies precede the step's compute
            if prefill_s > 0:
                self._sleep_until(started + prefill_s)  # pretend prefill: the step's tokens come out after it
            if stats is not None and self._on_stats is not None:
                self._on_stats(stats)  # before delivering: no metric call may be in flight once a client
            self._safe_deliver(responses)  # has its last response (it may unload the model right away)
            del responses, probe  # hold no response sender while idle: the backend waits for their release
            self._sleep_until(started + self._min_step_s + prefill_s)  # pretend GPU step time, outside the lock

    def _sleep_until(self, until_s: float) -> None:
        remaining = until_s - self._clock()
        if remaining > 0:
            self._sleep(remaining)

    def _cancellation_probe(self) -> list[tuple[int, H]]:
        """The requests to ask ``is_cancelled`` about now (none between check periods)."""
        now = self._clock()
        if self._is_cancelled is None or now - self._last_cancel_check < self._cancellation_period_s:
            return []
        self._last_cancel_check = now
        return self._batcher.handles()

    def _ask_cancelled(self, handle: H) -> bool:
        assert self._is_cancelled is not None
        try:
            return bool(self._is_cancelled(handle))
        except Exception:  # a handle whose client is gone
            logger.debug("is_cancelled failed", exc_info=True)
            return True

    def _due_stats(self, *, idle: bool) -> BatcherStats | None:
        """Stats to report now: counts changed, the period passed, or the engine just became idle."""
        if self._on_stats is None:
            return None
        now = self._clock()
        stats = self._batcher.stats()
        counts = (stats.active_requests, stats.waiting_requests)
        if not idle and counts == self._last_counts and now - self._last_stats < self._stats_period_s:
            return None
        self._last_stats, self._last_counts = now, counts
        return stats

    def _safe_deliver(self, responses: list[EngineResponse[H]]) -> None:
        if not responses:
            return
        try:
            self._deliver(responses)
        except Exception:  # one broken client connection must not stop the engine
            logger.exception("delivering %d responses failed", len(responses))
