"""Whether a batch line may use the fleet now: batch work goes only into free capacity.

A pod has ``pod_slots`` slots for concurrent requests (batch and interactive alike, interactive
first); its load is the router's in-flight count on it plus its scraped queue while fresh (the load
every routing policy compares, :mod:`trtfleet_router.routing.load`). The fleet of a model has free
capacity while some ready pod's load is below its slots. The runner's minimum rate still admits a
line now and then when there is none, so a batch on a saturated fleet progresses.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Final

from trtfleet_router.errors import RouterError
from trtfleet_router.fleets import FleetSet

POD_SLOTS_DEFAULT: Final = 4


def free_slots(pod_loads: Iterable[int], pod_slots: int) -> int:
    """Slots left over the ready pods' loads (pure)."""
    return sum(max(0, pod_slots - load) for load in pod_loads)


class FleetCapacity:
    def __init__(self, fleets: FleetSet, pod_slots: int = POD_SLOTS_DEFAULT) -> None:
        if pod_slots < 1:
            raise ValueError("batch pod slots must be at least 1")
        self.fleets = fleets
        self.pod_slots = pod_slots

    def has_free_capacity(self, model: str) -> bool:
        try:
            target = self.fleets.serving(self.fleets.registry.resolve(model))
        except RouterError:
            return True  # the line runs and gets its error answer (unknown model, ...)
        fleet = self.fleets.fleets.get(target.base.name)
        if fleet is None:
            return True
        snapshot = fleet.snapshot()
        loads = (p.inflight + (p.waiting_requests or 0) for p in snapshot.pods if p.ready)
        return free_slots(loads, self.pod_slots) > 0
