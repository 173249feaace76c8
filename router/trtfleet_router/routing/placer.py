"""The fleet's placement state: demand forecast, current plan and prefetch pacing for one base model.

:class:`~trtfleet_router.routing.fleet.Fleet` owns one :class:`Placer` and feeds it every request that is
demand (prefetches and other prewarms are not). A background loop in the shell asks the fleet to re-plan every
``placement.intervalS`` and for due prefetches every ``placement.prefetch.tickS``, pushes them
(``Fleet.prewarm_decision``), and the fleet tells the pacer when each ends. Routing policies read the current
plan through ``RoutingContext.placement``.

The copies a plan wants and the pods do not hold are queued once per plan, per pod, most wanted first; each
look for due prefetches offers every ready pod the head of its queue, dropping the copies that became resident
meanwhile (a request loaded them): O(pods) per look. No I/O, no clock: times are the fleet's ``now``.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Mapping, Sequence

from trtfleet_router.routing.forecast import DemandForecast
from trtfleet_router.routing.placement import (
    EMPTY_PLAN,
    AdapterWant,
    PlacementConfig,
    PlacementPlan,
    PodTiers,
    missing_copies,
    plan_placement,
)
from trtfleet_router.routing.prefetch import PodIdleness, PrefetchPacer
from trtfleet_router.routing.types import AdapterRef

Holds = Callable[[str, int], bool]
"""``(pod, task id)``: whether the pod's shadow holds the adapter (or its weights are on their way)."""


class Placer:
    """Forecast, plan, prefetch queue and pacer of one fleet (see the module docstring)."""

    __slots__ = ("_adapters", "_config", "_queue", "_rates", "forecast", "pacer", "plan", "planned_at_s")

    def __init__(self, config: PlacementConfig) -> None:
        self._config = config
        self.forecast = DemandForecast(config.forecast)
        self.pacer = PrefetchPacer(config.prefetch)
        self.plan: PlacementPlan = EMPTY_PLAN
        self.planned_at_s = float("-inf")
        self._adapters: dict[int, AdapterRef] = {}
        self._rates: dict[int, float] = {}
        self._queue: dict[str, deque[int]] = {}  # pod -> task ids of missing planned copies, most wanted first

    @property
    def config(self) -> PlacementConfig:
        return self._config

    @property
    def enabled(self) -> bool:
        return self._config.enabled

    def record(self, task_id: int, now_s: float) -> None:
        """A request for ``task_id`` (demand) started."""
        self.forecast.record(task_id, now_s)

    def replan(
        self,
        adapters: Sequence[AdapterRef],
        pods: Sequence[PodTiers],
        rank: Callable[[str], Sequence[str]],
        holds: Holds,
        now_s: float,
    ) -> PlacementPlan:
        """A new plan for the registered ``adapters`` over the ready ``pods`` from the forecast as of ``now_s``."""
        self._adapters = {adapter.task_id: adapter for adapter in adapters}
        self.forecast.retain(self._adapters)
        self._rates = self.forecast.rates(self._adapters, now_s)
        wants = [AdapterWant(a.name, a.task_id, a.pages, self._rates[a.task_id]) for a in adapters]
        self.plan = plan_placement(wants, pods, self._config, rank, previous=self.plan, holds=holds)
        self.planned_at_s = now_s
        queue: dict[str, deque[int]] = {}
        for pod_id, task_id in missing_copies(self.plan, holds, self._rates):
            queue.setdefault(pod_id, deque()).append(task_id)
        self._queue = queue
        return self.plan

    def pending(self) -> int:
        """Planned copies not pushed yet (some may have become resident since the plan)."""
        return sum(len(tasks) for tasks in self._queue.values())

    def due(self, holds: Holds, pods: Mapping[str, PodIdleness], now_s: float) -> list[tuple[str, AdapterRef]]:
        """The planned copies to push now (pod, adapter), each counted as started in the pacer: per ready pod
        its most wanted missing copy, if the pacer lets it go."""
        adapters = self._adapters
        wanted: list[tuple[str, int, int]] = []
        for pod_id in pods:
            tasks = self._queue.get(pod_id)
            while tasks:
                task_id = tasks[0]
                adapter = adapters.get(task_id)
                if adapter is not None and not holds(pod_id, task_id):
                    wanted.append((pod_id, task_id, adapter.weights_bytes))
                    break
                tasks.popleft()  # unregistered since, or resident now (a request loaded it)
        chosen = self.pacer.due(wanted, pods, now_s)
        for pod_id, _task_id in chosen:
            self._queue[pod_id].popleft()
        return [(pod_id, adapters[task_id]) for pod_id, task_id in chosen]

    def rate(self, task_id: int) -> float:
        """The forecast rate of ``task_id`` at the last plan (requests/s)."""
        return self._rates.get(task_id, 0.0)
