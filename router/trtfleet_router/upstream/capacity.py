"""Requests waiting for LoRA cache capacity: one bounded FIFO per base model.

When every candidate pod's LoRA cache is full of adapters that requests still use, the routing core
raises :class:`~trtfleet_router.routing.types.CachesBusy`; TRT-LLM itself would answer "Cache is full".
A slot frees only when a request ends, so the dispatcher holds such a request here instead of answering
503: :meth:`CapacityWaits.wait` parks it (at most ``max_waiting`` per base model, at most ``timeout_s``),
:meth:`CapacityWaits.notify` (called after every ``Fleet.finish``) wakes the first waiter, which routes
again; if it fails again it goes back to the head of the queue, if it succeeds it wakes the next one
(the freed capacity may hold more than one request). Pure asyncio on the event loop thread.

**Interactive first.** Batch lines (:class:`~.waiting.Priority` ``batch``) wait in a band of their own,
woken only when no interactive request waits; they neither count toward ``max_waiting`` nor toward the
drain estimate's queue.

**Fast rejection.** Every request end of a base model also feeds a drain-rate estimate (an exponentially
weighted mean of the time between ends, stretched to the time since the last end when that is longer).
A request that would wait behind ``n`` others is expected to wait ``(n + 1) x`` that time; when that
exceeds what it may wait, it is turned away at once instead of after the whole wait, and every
overload answer carries that estimate as ``Retry-After`` (1 s while no end has been seen yet).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from typing import Final

from trtfleet_router.upstream.waiting import Priority, WaitLine

DRAIN_SMOOTHING: Final = 0.2
RETRY_AFTER_S_UNKNOWN: Final = 1
RETRY_AFTER_S_MAX: Final = 600


class DrainRate:
    """Seconds between request ends per base model (EWMA), on an injected clock."""

    def __init__(self, now: Callable[[], float] = time.monotonic) -> None:
        self._now = now
        self._last_end_s: dict[str, float] = {}
        self._interval_s: dict[str, float] = {}

    def record_end(self, base_model: str) -> None:
        now = self._now()
        last = self._last_end_s.get(base_model)
        self._last_end_s[base_model] = now
        if last is None:
            return
        gap_s = now - last
        mean = self._interval_s.get(base_model)
        self._interval_s[base_model] = gap_s if mean is None else mean + DRAIN_SMOOTHING * (gap_s - mean)

    def seconds_per_end(self, base_model: str) -> float | None:
        """None until two ends were seen."""
        mean = self._interval_s.get(base_model)
        if mean is None:
            return None
        return max(mean, self._now() - self._last_end_s[base_model])

    def wait_s(self, base_model: str, ahead: int) -> float | None:
        """Expected wait of a request behind ``ahead`` others (None: no estimate yet)."""
        per_end = self.seconds_per_end(base_model)
        return None if per_end is None else (ahead + 1) * per_end


class CapacityWaits:
    """A wait line per base model, woken one waiter at a time as its requests end."""

    def __init__(self, max_waiting: int, *, now: Callable[[], float] = time.monotonic) -> None:
        self.max_waiting = max_waiting
        self._lines: dict[str, WaitLine] = {}
        self.drain = DrainRate(now)

    def expected_wait_s(self, base_model: str) -> float | None:
        """How long a new waiter is expected to wait (None: no estimate yet)."""
        return self.drain.wait_s(base_model, self.waiting(base_model))

    def retry_after_s(self, base_model: str) -> int:
        """``Retry-After`` for an overload answer: the expected wait, in whole seconds."""
        wait_s = self.expected_wait_s(base_model)
        if wait_s is None:
            return RETRY_AFTER_S_UNKNOWN
        return min(RETRY_AFTER_S_MAX, max(1, math.ceil(wait_s)))

    def waiting(self, base_model: str, band: Priority = Priority.INTERACTIVE) -> int:
        """Requests of ``band`` waiting for ``base_model``."""
        line = self._lines.get(base_model)
        return line.waiting(band) if line is not None else 0

    def can_wait(self, base_model: str) -> bool:
        return self.waiting(base_model) < self.max_waiting

    async def wait(
        self, base_model: str, timeout_s: float, *, first: bool = False, priority: Priority = Priority.INTERACTIVE
    ) -> bool:
        """Wait until :meth:`notify` wakes this waiter (True) or ``timeout_s`` passes (False).

        ``first``: rejoin at the head (a woken waiter whose new attempt found no room either).
        """
        line = self._lines.get(base_model)
        if line is None:
            line = self._lines[base_model] = WaitLine()
        try:
            return await line.wait(
                timeout_s, band=priority, first=first, on_lost_wake=lambda: self.wake(base_model)
            )
        finally:
            if not line and self._lines.get(base_model) is line:
                del self._lines[base_model]

    def notify(self, base_model: str) -> None:
        """A request of ``base_model`` ended (capacity may have freed): wake the first waiter."""
        self.drain.record_end(base_model)
        self.wake(base_model)

    def wake(self, base_model: str) -> None:
        """Wake the first waiter, interactive before batch (without counting a request end)."""
        line = self._lines.get(base_model)
        if line is not None:
            line.wake()
