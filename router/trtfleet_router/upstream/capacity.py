"""Requests waiting for LoRA cache capacity: one bounded FIFO per base model.

When every candidate pod's LoRA cache is full of adapters that requests still use, the routing core
raises :class:`~trtfleet_router.routing.types.CachesBusy`; TRT-LLM itself would answer "Cache is full".
A slot frees only when a request ends, so the dispatcher holds such a request here instead of answering
503: :meth:`CapacityWaits.wait` parks it (at most ``max_waiting`` per base model, at most ``timeout_s``),
:meth:`CapacityWaits.notify` (called after every ``Fleet.finish``) wakes the first waiter, which routes
again; if it fails again it goes back to the head of the queue, if it succeeds it wakes the next one
(the freed capacity may hold more than one request). Pure asyncio on the event loop thread.
"""

from __future__ import annotations

import asyncio
from collections import deque


class CapacityWaits:
    """FIFO waiters per base model, woken one at a time as requests end."""

    def __init__(self, max_waiting: int) -> None:
        self.max_waiting = max_waiting
        self._queues: dict[str, deque[asyncio.Future[None]]] = {}

    def waiting(self, base_model: str) -> int:
        queue = self._queues.get(base_model)
        return len(queue) if queue is not None else 0

    def can_wait(self, base_model: str) -> bool:
        return self.waiting(base_model) < self.max_waiting

    async def wait(self, base_model: str, timeout_s: float, *, first: bool = False) -> bool:
        """Wait until :meth:`notify` wakes this waiter (True) or ``timeout_s`` passes (False).

        ``first``: rejoin at the head (a woken waiter whose new attempt found no room either).
        """
        if timeout_s <= 0:
            return False
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        queue = self._queues.setdefault(base_model, deque())
        if first:
            queue.appendleft(future)
        else:
            queue.append(future)
        try:
            await asyncio.wait_for(asyncio.shield(future), timeout_s)
        except TimeoutError:
            pass
        except asyncio.CancelledError:
            if future.done() and not future.cancelled():
                self.notify(base_model)  # woken but gone: hand the wake-up on
            raise
        finally:
            woken = future.done() and not future.cancelled()
            if not woken:
                future.cancel()
                try:
                    queue.remove(future)
                except ValueError:
                    pass
            if not queue and self._queues.get(base_model) is queue:
                del self._queues[base_model]
        return woken

    def notify(self, base_model: str) -> None:
        """A request of ``base_model`` ended (capacity may have freed): wake the first waiter."""
        queue = self._queues.get(base_model)
        while queue:
            future = queue.popleft()
            if not future.done():
                future.set_result(None)
                return
