"""Whether a batch line may use the fleet now: batch work goes only into free capacity.

A pod has ``pod_slots`` slots for concurrent requests (batch and interactive alike, interactive
first); its load is the router's in-flight count on it plus its scraped queue while fresh (the load
every routing policy compares, :mod:`trtfleet_router.routing.load`). The fleet of a model has free
capacity while some ready pod's load is below its slots (not counting the pods a reserve keeps for interactive
requests while they come, ``routing/reserve.py``). The runner's minimum rate still admits a
line now and then when there is none, so a batch on a saturated fleet progresses. The dispatcher
applies the same slots per pod when it admits a line (:mod:`trtfleet_router.upstream.admission`).

Interactive pressure (what the runner's window backs off on): interactive requests of the model's base
waiting in the router's capacity queue, a ready pod with a non-empty engine queue, or an interactive
first answer slower than the dispatcher's target since the runner last looked.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Final

from trtfleet_router.errors import RouterError
from trtfleet_router.liveview import FleetSet
from trtfleet_router.routing.types import FleetSnapshot, PodSnapshot
from trtfleet_router.upstream.admission import InteractiveSignal
from trtfleet_router.upstream.capacity import CapacityWaits

POD_SLOTS_DEFAULT: Final = 4


def free_slots(pod_loads: Iterable[int], pod_slots: int) -> int:
    """Slots left over the ready pods' loads (pure)."""
    return sum(max(0, pod_slots - load) for load in pod_loads)


def pressure(*, interactive_waiting: int, pod_queues: Iterable[int | None], slow_answer: bool) -> bool:
    """Whether interactive traffic is under pressure (pure): see the module docstring."""
    return interactive_waiting > 0 or slow_answer or any((queued or 0) > 0 for queued in pod_queues)


class FleetCapacity:
    def __init__(
        self,
        fleets: FleetSet,
        pod_slots: int = POD_SLOTS_DEFAULT,
        waits: CapacityWaits | None = None,
        signal: InteractiveSignal | None = None,
        reserve_pods: int = 0,
    ) -> None:
        if pod_slots < 1:
            raise ValueError("batch pod slots must be at least 1")
        self.fleets = fleets
        self.pod_slots = pod_slots
        self.waits = waits
        self.signal = signal
        self.reserve_pods = reserve_pods

    def _snapshot(self, model: str) -> tuple[str, FleetSnapshot] | None:
        """The base model serving ``model`` and its fleet (None for an unknown model or base: its line
        runs and gets its error)."""
        try:
            target = self.fleets.serving(self.fleets.registry.resolve(model))
        except RouterError:
            return None
        fleet = self.fleets.fleets.get(target.base.name)
        return None if fleet is None else (target.base.name, fleet.snapshot())

    def _batch_pods(self, model: str) -> list[PodSnapshot] | None:
        """The ready pods a batch line of ``model`` may start on now: not those the reserve keeps for
        interactive requests (``routing/reserve.py``). None for an unknown model or base."""
        found = self._snapshot(model)
        if found is None:
            return None
        base, snapshot = found
        fleet = self.fleets.fleets.get(base)
        reserved = fleet.reserved_now(self.reserve_pods) if fleet is not None and self.reserve_pods else frozenset()
        return [p for p in snapshot.pods if p.ready and p.pod_id not in reserved]

    def has_free_capacity(self, model: str) -> bool:
        pods = self._batch_pods(model)
        if pods is None:
            return True
        return free_slots((p.inflight + (p.waiting_requests or 0) for p in pods), self.pod_slots) > 0

    def lanes(self, model: str) -> int:
        """The ready pods a batch line of ``model`` may use: the runner runs that many adapters' lines at once, and
        the batch lane keeps each on the pods that hold it (``routing/batchplace.py``)."""
        pods = self._batch_pods(model)
        return 1 if pods is None else max(1, len(pods))

    def interactive_pressure(self, model: str, since_s: float) -> bool:
        found = self._snapshot(model)
        if found is None:
            return False
        base, snapshot = found
        return pressure(
            interactive_waiting=self.waits.waiting(base) if self.waits is not None else 0,
            pod_queues=(p.waiting_requests for p in snapshot.pods if p.ready),
            slow_answer=self.signal is not None and self.signal.slow_since(base, since_s),
        )
