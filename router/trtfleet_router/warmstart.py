"""Warm scale-up: a pod that turns ready gets its base model's hottest adapters before or with its first
traffic, so a scale-up causes no storm of cold loads.

Discovery tells :meth:`WarmStarts.pods_changed`; :meth:`WarmStarts.run` then compares each base model's
ready pods with those it saw before and, for the new ones, asks the fleet for a plan
(:func:`~trtfleet_router.routing.fleetreport.warm_start_plan`: the adapters with the most requests in the
activity window, as many as the pod's device pages hold) and pushes each pair through the router's
prewarm (a one-token request pinned to the pod, carrying the weights; not demand). The pods present when
a base model is first seen are not new: at router start there is no demand to warm them with. Event-loop
thread only.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable

from trtfleet_router.activity import AdapterActivity, warm_demand
from trtfleet_router.liveview import FleetSet

log = logging.getLogger(__name__)

WARM_START_ADAPTERS_MAX = 256
"""At most this many of the hottest adapters are considered per new pod (its device pages bound it too)."""

Prewarm = Callable[[str, str, str], Awaitable[None]]
"""``(base model, pod, served adapter name)``: push that adapter's weights to that pod."""


class WarmStarts:
    def __init__(self, fleets: FleetSet, activity: AdapterActivity, prewarm: Prewarm) -> None:
        self.fleets = fleets
        self.activity = activity
        self.prewarm = prewarm
        self._seen: dict[str, set[str]] = {}
        self._changed = asyncio.Event()
        fleets.pod_listeners.append(self.pods_changed)

    def pods_changed(self, base_models: set[str] | None = None) -> None:
        self._changed.set()

    def new_ready(self, base_model: str, ready: set[str]) -> list[str]:
        """The pods of ``ready`` not ready at the last look (none the first time a base model is seen)."""
        seen = self._seen.get(base_model)
        self._seen[base_model] = set(ready)
        return [] if seen is None else sorted(ready - seen)

    async def warm_new_pods(self) -> int:
        """One pass over every base model; the prewarms pushed."""
        pushed = 0
        for name, fleet in list(self.fleets.fleets.items()):
            ready = {pod for pod, endpoint in self.fleets.pods.get(name, {}).items() if endpoint.ready}
            new = self.new_ready(name, ready - self.fleets.ejected(name))
            if not new:
                continue
            adapters = {a.served_name: a for a in self.fleets.registry.adapters_of(name)}
            hottest = [adapters[served] for served in self.activity.hottest(name, WARM_START_ADAPTERS_MAX)
                       if served in adapters]
            plan = fleet.warm_start_plan(new, [a.ref for a in hottest])
            by_ref = {a.ref.name: a.served_name for a in hottest}
            for pod, ref in plan:
                await self.prewarm(name, pod, by_ref[ref.name])
                pushed += 1
            if plan:
                log.info("warm start", extra={"ctx": {"base_model": name, "pods": new, "adapters": len(plan)}})
        return pushed

    def pod_warm_demand(self) -> list[tuple[str, str, int]]:
        """``(base model, pod, warm demand)`` of every pod (see :func:`~trtfleet_router.activity.warm_demand`)."""
        rows: list[tuple[str, str, int]] = []
        for name, fleet in list(self.fleets.fleets.items()):
            served_of = {a.ref.task_id: a.served_name for a in self.fleets.registry.adapters_of(name)}
            requests = self.activity.requests(name)
            for pod in fleet.snapshot().pods:
                rows.append((name, pod.pod_id, warm_demand(pod.resident_task_ids, served_of, requests)))
        return rows

    async def run(self) -> None:
        while True:
            await self._changed.wait()
            self._changed.clear()
            await self.warm_new_pods()
