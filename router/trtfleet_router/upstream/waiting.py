"""The one way a request waits in the router: parked in a :class:`WaitLine` until woken, shed, or its time is up.

A line is a :class:`~trtfleet_router.routing.fairqueue.FairQueue` of parked waiters: a wake-up goes to the most
important :class:`Priority` band that has a waiter and, inside it, to the oldest waiter of the tenant the line's
tenant order picks (trtfleet's: the fewest weighted tokens served, ``routing/vtc.py``). Both places where requests
wait use it: for capacity (:mod:`.capacity`: a saturated fleet, or LoRA caches full of busy adapters; woken as
requests end) and for a ready pod (:mod:`.hold`, woken as pods turn ready). Pure asyncio on the event loop.

A waiter woken but cancelled before it resumed has taken a wake-up nobody used: ``on_lost_wake`` passes it on.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Collection
from enum import Enum

from trtfleet_router.routing.fairqueue import BANDS, ArrivalOrder, Eligible, Entry, FairQueue, Priority, TenantOrder
from trtfleet_router.routing.tenancy import DEFAULT_TENANT

__all__ = ["BANDS", "Priority", "Wake", "WaitLine"]


class Wake(Enum):
    """How a wait ended; true only for :attr:`WOKEN`."""

    WOKEN = "woken"
    TIMED_OUT = "timed_out"
    SHED = "shed"
    """Pushed out of the line by a more important request (see :meth:`WaitLine.shed`)."""

    def __bool__(self) -> bool:
        return self is Wake.WOKEN


class WaitLine:
    __slots__ = ("_queue",)

    def __init__(self, order: TenantOrder | None = None) -> None:
        self._queue: FairQueue[asyncio.Future[bool]] = FairQueue(order if order is not None else ArrivalOrder())

    @property
    def queue(self) -> FairQueue[asyncio.Future[bool]]:
        return self._queue

    def waiting(self, band: Priority | None = None) -> int:
        """Waiters in ``band`` (None: in every band)."""
        return self._queue.waiting(band)

    def waiting_from(self, band: Priority) -> int:
        """Waiters a newcomer of ``band`` would wait behind: its band's and those of more important bands."""
        return self._queue.waiting_from(band)

    def tenants(self, band: Priority) -> Collection[str]:
        return self._queue.tenants(band)

    def __bool__(self) -> bool:
        return bool(self._queue)

    def is_first(self, entry: Entry[asyncio.Future[bool]]) -> bool:
        return self._queue.peek() is entry

    async def wait(
        self,
        timeout_s: float,
        *,
        band: Priority = Priority.INTERACTIVE,
        tenant: str = DEFAULT_TENANT,
        first: bool = False,
        tick_s: float | None = None,
        on_tick: Callable[[], None] | None = None,
        on_lost_wake: Callable[[], None] | None = None,
    ) -> Wake:
        """Wait until :meth:`wake` picks this waiter, :meth:`shed` pushes it out, or ``timeout_s`` passes.

        ``first``: join at the head of the tenant's queue (a woken waiter whose new attempt found no room either).
        ``on_tick``: called every ``tick_s`` while this waiter heads the line (a re-check of what may wake it).
        """
        if timeout_s <= 0:
            return Wake.TIMED_OUT
        loop = asyncio.get_running_loop()
        future: asyncio.Future[bool] = loop.create_future()
        queue = self._queue
        entry = queue.push(future, band, tenant, first=first)
        until_s = loop.time() + timeout_s
        try:
            while not future.done():
                left_s = until_s - loop.time()
                if left_s <= 0:
                    break
                step_s = left_s if tick_s is None else min(left_s, tick_s)
                await asyncio.wait((future,), timeout=step_s)
                if not future.done() and on_tick is not None and self.is_first(entry):
                    on_tick()
        except asyncio.CancelledError:
            if future.done() and not future.cancelled() and future.result() and on_lost_wake is not None:
                on_lost_wake()
            raise
        finally:
            if not future.done():
                future.cancel()
                queue.remove(entry)
        if future.cancelled():
            return Wake.TIMED_OUT
        return Wake.WOKEN if future.result() else Wake.SHED

    def wake(self, count: int = 1, eligible: Eligible | None = None) -> int:
        """Wake up to ``count`` waiters, in the line's order (``eligible``: only those it accepts); returns how
        many."""
        woken = 0
        queue = self._queue
        while woken < count:
            entry = queue.pop(eligible)
            if entry is None:
                break
            if not entry.item.done():
                entry.item.set_result(True)
                woken += 1
        return woken

    def shed(self, below: Priority | None = None) -> tuple[str, Priority] | None:
        """Push out the waiter shed first (the newest of the most-over-share tenant in the least important band, only
        below ``below`` when given; never a batch line); its ``(tenant, band)``, or None when there is none."""
        return self._push_out(self._queue.victim(below))

    def make_room(self, band: Priority, tenant: str) -> tuple[str, Priority] | None:
        """For a newcomer of ``band`` and ``tenant`` in a full line: push out a less important band's waiter shed
        first, else, in its band, the newest of a tenant the order puts after the newcomer; None: no such waiter."""
        return self._push_out(self._queue.displaceable(band, tenant))

    def _push_out(self, entry: Entry[asyncio.Future[bool]] | None) -> tuple[str, Priority] | None:
        if entry is None:
            return None
        self._queue.remove(entry)
        if not entry.item.done():
            entry.item.set_result(False)
        return entry.tenant, entry.band
