"""Adapters active per base model in a sliding window: how many, and the LoRA cache pages they need.

The operator's autoscaler sizes a fleet so that the pages the adapters in use need fit in the pods' LoRA
caches (``spec.autoscaling.adapterWorkingSet``); the router, which sees every request, keeps the window:
per adapter the arrival times of its requests in the window, and per base model the adapter requests in
flight. The pages reported are demand-weighted (:func:`trtfleet.autoscaling.working_set_pages`): the
expected pages of the distinct adapters among the requests in flight, drawn by the window's mix, so a
long tail of adapters seen once a minute does not count every one of them whole. The window is the routing
core's :class:`~trtfleet_router.routing.load.ActivityWindow` (one-second buckets) over this replica's requests,
on an injected clock. Event-loop thread only.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass

from trtfleet.autoscaling import working_set_pages
from trtfleet_router.routing.load import ActivityWindow


@dataclass(frozen=True, slots=True)
class ActiveAdapters:
    count: int
    """Distinct adapters with a request in the window."""
    pages: int
    """Demand-weighted LoRA cache pages (see the module docstring)."""


class AdapterActivity:
    def __init__(self, window_s: float, *, now: Callable[[], float] = time.monotonic) -> None:
        self.window_s = window_s
        self._now = now
        self._windows: dict[str, ActivityWindow[str]] = {}  # base -> adapter -> requests in the window
        self._pages: dict[str, dict[str, int]] = {}  # base -> adapter -> its pages, as last seen
        self._in_flight: dict[str, int] = {}

    def record(self, base_model: str, adapter: str, pages: int) -> None:
        """A request for ``adapter`` arrived (and is in flight until :meth:`finished`)."""
        window = self._windows.get(base_model)
        if window is None:
            window = self._windows[base_model] = ActivityWindow(max(1, math.ceil(self.window_s)))
        window.record(adapter, self._now())
        self._pages.setdefault(base_model, {})[adapter] = pages
        self._in_flight[base_model] = self._in_flight.get(base_model, 0) + 1

    def finished(self, base_model: str) -> None:
        """A request :meth:`record` counted ended (answered or failed)."""
        self._in_flight[base_model] = max(0, self._in_flight.get(base_model, 0) - 1)

    def in_flight(self, base_model: str) -> int:
        return self._in_flight.get(base_model, 0)

    def requests(self, base_model: str) -> dict[str, int]:
        """Requests per adapter of ``base_model`` in the window."""
        window = self._windows.get(base_model)
        if window is None:
            return {}
        counts = window.counts(self._now())
        pages = self._pages[base_model]
        for gone in [adapter for adapter in pages if adapter not in counts]:
            del pages[gone]
        return counts

    def active(self, base_model: str) -> ActiveAdapters:
        requests = self.requests(base_model)
        if not requests:
            return ActiveAdapters(0, 0)
        pages = self._pages[base_model]
        demand = [(count, pages[adapter]) for adapter, count in requests.items()]
        return ActiveAdapters(len(requests), working_set_pages(demand, self.in_flight(base_model)))

    def hottest(self, base_model: str, limit: int) -> list[str]:
        """Up to ``limit`` adapters of ``base_model`` with the most requests in the window, most first."""
        requests = self.requests(base_model)
        return sorted(requests, key=lambda adapter: (-requests[adapter], adapter))[:limit]

    def base_models(self) -> list[str]:
        return sorted(self._windows)


def warm_demand(resident: Iterable[int], served_of: Mapping[int, str], requests: Mapping[str, int]) -> int:
    """What a pod's warm set is worth: the window's requests for the adapters it holds (pure). The pod
    with the least is the one to remove on a scale-down (``trtfleet_router_pod_warm_demand``, which the
    operator turns into ``controller.kubernetes.io/pod-deletion-cost``)."""
    return sum(requests.get(served_of.get(task_id, ""), 0) for task_id in resident)
