"""Requests waiting for capacity: one bounded :class:`~.waiting.WaitLine` per base model.

Two reasons to wait here, both freed only when a request ends: the base model's fleet is saturated (the
``tenancy.saturation`` test of :mod:`.admission`), or every candidate pod's LoRA cache is full of adapters that
requests still use (the routing core raises :class:`~trtfleet_router.routing.types.CachesBusy`; TRT-LLM itself
would answer "Cache is full"). The dispatcher parks such a request (:meth:`CapacityWaits.wait`, at most
``max_waiting`` per base model, at most ``timeout_s``) instead of answering at once; :meth:`CapacityWaits.notify`
(called after every ``Fleet.finish``) wakes the next waiter in band and tenant order, which routes again; if it
fails again it goes back to the head of its tenant's queue, if it succeeds it wakes the next one (the freed
capacity may hold more than one request). Pure asyncio on the event loop thread.

**Bands.** Waiters of a more important band go first; batch lines (:class:`~.waiting.Priority` ``batch``) are woken
only when no client request waits, and neither count toward ``max_waiting`` nor are ever shed.

**Fast rejection.** Every request end of a base model also feeds a drain-rate estimate (an exponentially
weighted mean of the time between ends, stretched to the time since the last end when that is longer).
A request that would wait behind ``n`` others (the more important bands' and, in its own, those its tenant's
share lets go first) is expected to wait ``(n + 1) x`` that time; when that exceeds what it may wait, it is
turned away at once instead of after the whole wait, and every overload answer carries that estimate as
``Retry-After`` (1 s while no end has been seen yet).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from typing import Final

from trtfleet_router.routing.fairqueue import Eligible, TenantOrder
from trtfleet_router.routing.tenancy import DEFAULT_TENANT
from trtfleet_router.upstream.waiting import Priority, WaitLine, Wake

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

    def __init__(
        self,
        max_waiting: int,
        *,
        orders: Callable[[str], TenantOrder] | None = None,
        now: Callable[[], float] = time.monotonic,
    ) -> None:
        self.max_waiting = max_waiting
        self._orders = orders
        self._lines: dict[str, WaitLine] = {}
        self._woken: dict[str, int] = {}
        self.drain = DrainRate(now)

    def line(self, base_model: str) -> WaitLine | None:
        return self._lines.get(base_model)

    def expected_wait_s(self, base_model: str, band: Priority = Priority.INTERACTIVE) -> float | None:
        """How long a new waiter of ``band`` is expected to wait (None: no estimate yet)."""
        line = self._lines.get(base_model)
        ahead = line.waiting_from(band) if line is not None else 0
        return self.drain.wait_s(base_model, ahead)

    def retry_after_s(self, base_model: str, band: Priority = Priority.INTERACTIVE) -> int:
        """``Retry-After`` for an overload answer: the expected wait of ``band``, in whole seconds."""
        wait_s = self.expected_wait_s(base_model, band)
        if wait_s is None:
            return RETRY_AFTER_S_UNKNOWN
        return min(RETRY_AFTER_S_MAX, max(1, math.ceil(wait_s)))

    def waiting(self, base_model: str, band: Priority | None = None) -> int:
        """Requests of ``band`` waiting for ``base_model`` (None: the clients', every band but batch)."""
        line = self._lines.get(base_model)
        if line is None:
            return 0
        return line.waiting(band) if band is not None else line.waiting() - line.waiting(Priority.BATCH)

    def woken(self, base_model: str) -> int:
        """Waiters woken and not yet resumed: about to start, so the saturation test counts them as started."""
        return self._woken.get(base_model, 0)

    def can_wait(self, base_model: str) -> bool:
        return self.waiting(base_model) < self.max_waiting

    async def wait(
        self,
        base_model: str,
        timeout_s: float,
        *,
        first: bool = False,
        priority: Priority = Priority.INTERACTIVE,
        tenant: str = DEFAULT_TENANT,
        tick_s: float | None = None,
        on_tick: Callable[[], None] | None = None,
    ) -> Wake:
        """Wait until :meth:`notify` wakes this waiter, a more important request sheds it, or ``timeout_s`` passes.

        ``first``: rejoin at the head (a woken waiter whose new attempt found no room either).
        """
        line = self._lines.get(base_model)
        if line is None:
            order = self._orders(base_model) if self._orders is not None else None
            line = self._lines[base_model] = WaitLine(order)

        def lost_wake() -> None:
            self._resumed(base_model)
            self.wake(base_model)

        try:
            outcome = await line.wait(
                timeout_s, band=priority, tenant=tenant, first=first, tick_s=tick_s, on_tick=on_tick,
                on_lost_wake=lost_wake,
            )
            if outcome is Wake.WOKEN:
                self._resumed(base_model)
            return outcome
        finally:
            if not line and self._lines.get(base_model) is line:
                del self._lines[base_model]

    def notify(self, base_model: str) -> None:
        """A request of ``base_model`` ended (capacity may have freed): wake the first waiter."""
        self.drain.record_end(base_model)
        self.wake(base_model)

    def wake(self, base_model: str, count: int = 1, eligible: Eligible | None = None) -> None:
        """Wake the next ``count`` waiters in the line's order (without counting a request end; ``eligible``: only
        those it accepts)."""
        line = self._lines.get(base_model)
        if line is not None:
            woken = line.wake(count, eligible)
            if woken:
                self._woken[base_model] = self._woken.get(base_model, 0) + woken

    def make_room(self, base_model: str, band: Priority, tenant: str) -> tuple[str, Priority] | None:
        """In a full line, push out the waiter a newcomer of ``band`` and ``tenant`` goes before (see
        :meth:`.waiting.WaitLine.make_room`); its ``(tenant, band)``, or None when there is none."""
        line = self._lines.get(base_model)
        return line.make_room(band, tenant) if line is not None else None

    def _resumed(self, base_model: str) -> None:
        left = self._woken.get(base_model, 0) - 1
        if left > 0:
            self._woken[base_model] = left
        else:
            self._woken.pop(base_model, None)
