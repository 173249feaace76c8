"""The one way a request waits in the router: parked in a :class:`WaitLine` until woken, or until its time is up.

A line has a queue per :class:`Priority` band: a wake-up goes to the first waiter of the most important band
that has one. Both places where requests wait use it: for LoRA cache capacity (:mod:`.capacity`, woken as
requests end) and for a ready pod (:mod:`.hold`, woken as pods turn ready). Pure asyncio on the event loop.

A waiter woken but cancelled before it resumed has taken a wake-up nobody used: ``on_lost_wake`` passes it on.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Callable
from enum import StrEnum


class Priority(StrEnum):
    """Bands, most important first: a client's request, then a line of the batch runner."""

    INTERACTIVE = "interactive"
    BATCH = "batch"


BANDS = tuple(Priority)


class WaitLine:
    __slots__ = ("_queues",)

    def __init__(self) -> None:
        self._queues: dict[Priority, deque[asyncio.Future[None]]] = {}

    def waiting(self, band: Priority | None = None) -> int:
        """Waiters in ``band`` (None: in every band)."""
        if band is not None:
            queue = self._queues.get(band)
            return len(queue) if queue is not None else 0
        return sum(len(queue) for queue in self._queues.values())

    def __bool__(self) -> bool:
        return any(self._queues.values())

    def is_first(self, future: asyncio.Future[None]) -> bool:
        for band in BANDS:
            queue = self._queues.get(band)
            if queue:
                return queue[0] is future
        return False

    async def wait(
        self,
        timeout_s: float,
        *,
        band: Priority = Priority.INTERACTIVE,
        first: bool = False,
        tick_s: float | None = None,
        on_tick: Callable[[], None] | None = None,
        on_lost_wake: Callable[[], None] | None = None,
    ) -> bool:
        """Wait until :meth:`wake` picks this waiter (True) or ``timeout_s`` passes (False).

        ``first``: join at the head of the band (a woken waiter whose new attempt found no room either).
        ``on_tick``: called every ``tick_s`` while this waiter heads the line (a re-check of what may wake it).
        """
        if timeout_s <= 0:
            return False
        loop = asyncio.get_running_loop()
        future: asyncio.Future[None] = loop.create_future()
        queue = self._queues.setdefault(band, deque())
        if first:
            queue.appendleft(future)
        else:
            queue.append(future)
        until_s = loop.time() + timeout_s
        try:
            while not future.done():
                left_s = until_s - loop.time()
                if left_s <= 0:
                    break
                step_s = left_s if tick_s is None else min(left_s, tick_s)
                await asyncio.wait((future,), timeout=step_s)
                if not future.done() and on_tick is not None and self.is_first(future):
                    on_tick()
        except asyncio.CancelledError:
            if future.done() and not future.cancelled() and on_lost_wake is not None:
                on_lost_wake()
            raise
        finally:
            if not future.done():
                future.cancel()
            if future.cancelled():
                try:
                    queue.remove(future)
                except ValueError:
                    pass
                if not queue and self._queues.get(band) is queue:
                    del self._queues[band]
        return not future.cancelled()

    def wake(self, count: int = 1) -> int:
        """Wake up to ``count`` waiters, the most important band first, oldest first; returns how many."""
        woken = 0
        for band in BANDS:
            queue = self._queues.get(band)
            while queue and woken < count:
                future = queue.popleft()
                if not future.done():
                    future.set_result(None)
                    woken += 1
            if queue is not None and not queue:
                del self._queues[band]
            if woken >= count:
                break
        return woken
