"""Adapters active per base model in a sliding window: how many, and the LoRA cache pages they need.

The operator's autoscaler sizes a fleet so that the pages the adapters in use need fit in the pods' LoRA
caches (``spec.autoscaling.adapterWorkingSet``); the router, which sees every request, keeps the window:
per adapter the arrival times of its requests in the window, and per base model the adapter requests in
flight. The pages reported are demand-weighted (:func:`trtfleet.autoscaling.working_set_pages`): the
expected pages of the distinct adapters among the requests in flight, drawn by the window's mix, so a
long tail of adapters seen once a minute does not count every one of them whole. Arrival times are on an
injected clock; expired ones go when the window is read. Event-loop thread only.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field

from trtfleet.autoscaling import working_set_pages


@dataclass(frozen=True, slots=True)
class ActiveAdapters:
    count: int
    """Distinct adapters with a request in the window."""
    pages: int
    """Demand-weighted LoRA cache pages (see the module docstring)."""


@dataclass(slots=True)
class _Seen:
    pages: int
    arrivals: deque[float] = field(default_factory=deque)


class AdapterActivity:
    def __init__(self, window_s: float, *, now: Callable[[], float] = time.monotonic) -> None:
        self.window_s = window_s
        self._now = now
        self._seen: dict[str, dict[str, _Seen]] = {}  # base -> adapter -> pages and arrivals in the window
        self._in_flight: dict[str, int] = {}

    def record(self, base_model: str, adapter: str, pages: int) -> None:
        """A request for ``adapter`` arrived (and is in flight until :meth:`finished`)."""
        seen = self._seen.setdefault(base_model, {}).setdefault(adapter, _Seen(pages))
        seen.pages = pages
        seen.arrivals.append(self._now())
        self._in_flight[base_model] = self._in_flight.get(base_model, 0) + 1

    def finished(self, base_model: str) -> None:
        """A request :meth:`record` counted ended (answered or failed)."""
        self._in_flight[base_model] = max(0, self._in_flight.get(base_model, 0) - 1)

    def in_flight(self, base_model: str) -> int:
        return self._in_flight.get(base_model, 0)

    def active(self, base_model: str) -> ActiveAdapters:
        seen = self._seen.get(base_model)
        if not seen:
            return ActiveAdapters(0, 0)
        horizon = self._now() - self.window_s
        for adapter, entry in list(seen.items()):
            while entry.arrivals and entry.arrivals[0] < horizon:
                entry.arrivals.popleft()
            if not entry.arrivals:
                del seen[adapter]
        demand = [(len(entry.arrivals), entry.pages) for entry in seen.values()]
        return ActiveAdapters(len(seen), working_set_pages(demand, self.in_flight(base_model)))

    def requests(self, base_model: str) -> dict[str, int]:
        """Requests per adapter of ``base_model`` in the window."""
        self.active(base_model)  # drops expired arrivals
        return {adapter: len(entry.arrivals) for adapter, entry in self._seen.get(base_model, {}).items()}

    def hottest(self, base_model: str, limit: int) -> list[str]:
        """Up to ``limit`` adapters of ``base_model`` with the most requests in the window, most first."""
        self.active(base_model)  # drops expired arrivals
        seen = self._seen.get(base_model, {})
        ranked = sorted(seen, key=lambda adapter: (-len(seen[adapter].arrivals), adapter))
        return ranked[:limit]

    def base_models(self) -> list[str]:
        return sorted(self._seen)


def warm_demand(resident: Iterable[int], served_of: Mapping[int, str], requests: Mapping[str, int]) -> int:
    """What a pod's warm set is worth: the window's requests for the adapters it holds (pure). The pod
    with the least is the one to remove on a scale-down (``trtfleet_router_pod_warm_demand``, which the
    operator turns into ``controller.kubernetes.io/pod-deletion-cost``)."""
    return sum(requests.get(served_of.get(task_id, ""), 0) for task_id in resident)
