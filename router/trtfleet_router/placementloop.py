"""The placement loop: re-plans each base model's host copies and pushes the due prefetches, off the request path.

For every base model whose routing file turns ``placement`` on, every ``placement.intervalS`` the fleet re-plans
(:meth:`~trtfleet_router.routing.fleet.Fleet.replan`, over the registered adapters) and every
``placement.prefetch.tickS`` it is asked for the prefetches due now
(:meth:`~trtfleet_router.routing.fleet.Fleet.prefetch_due`: paced so they never compete with traffic). Each is
pushed concurrently through the router's prewarm path, a one-token request pinned to its pod that carries the
weights (runtime ``pytorch``: that names the adapter's path, which the pod reads into its host tier), marked as a
prefetch so it is not counted as demand. A push that fails is logged; the pacer is told it ended either way and
the next plan asks for the copy again. Event-loop thread only.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable

from trtfleet_router.errors import RouterError
from trtfleet_router.liveview import FleetSet
from trtfleet_router.routing.fleet import Fleet

log = logging.getLogger(__name__)

Push = Callable[[str, str, str], Awaitable[None]]
"""``(base model, pod, served adapter name)``: push that adapter's weights to that pod as a prefetch; raises the
:class:`~trtfleet_router.errors.RouterError` of a failed push."""


class PlacementLoop:
    def __init__(self, fleets: FleetSet, push: Push, *, clock: Callable[[], float] | None = None) -> None:
        self.fleets = fleets
        self.push = push
        self._clock = clock
        self._planned_at: dict[str, float] = {}
        self._pushes: set[asyncio.Task[None]] = set()
        self.pushed_total = 0
        self.failed_total = 0

    @property
    def enabled(self) -> bool:
        return self.fleets.routing_config.placement.enabled

    def _now(self) -> float:
        return self._clock() if self._clock is not None else asyncio.get_running_loop().time()

    def tick(self) -> int:
        """One pass over every base model: re-plan where due, start the due pushes; how many were started."""
        config = self.fleets.routing_config.placement
        started = 0
        now = self._now()
        for name, fleet in list(self.fleets.fleets.items()):
            if now - self._planned_at.get(name, float("-inf")) >= config.interval_s:
                self._planned_at[name] = now
                fleet.replan([entry.ref for entry in self.fleets.registry.adapters_of(name)])
            served = {entry.ref.task_id: entry.served_name for entry in self.fleets.registry.adapters_of(name)}
            for pod, ref in fleet.prefetch_due():
                task = asyncio.create_task(self._push(name, fleet, pod, served.get(ref.task_id, ref.name)))
                self._pushes.add(task)
                task.add_done_callback(self._pushes.discard)
                started += 1
        return started

    async def _push(self, base_model: str, fleet: Fleet, pod: str, served_name: str) -> None:
        try:
            await self.push(base_model, pod, served_name)
        except RouterError as exc:
            self.failed_total += 1
            log.warning("prefetch failed", extra={"ctx": {"pod": pod, "adapter": served_name, "error": exc.message}})
        else:
            self.pushed_total += 1
            log.debug("prefetched", extra={"ctx": {"pod": pod, "adapter": served_name, "base_model": base_model}})
        finally:
            fleet.prefetch_ended(pod)

    async def run(self) -> None:
        if not self.enabled:
            return
        tick_s = self.fleets.routing_config.placement.prefetch.tick_s
        try:
            while True:
                self.tick()
                await asyncio.sleep(tick_s)
        finally:
            for task in list(self._pushes):
                task.cancel()
            await asyncio.gather(*self._pushes, return_exceptions=True)
