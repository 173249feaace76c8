"""The event loop's metrics: metrics updated on its thread only, and how late it runs what is due.

* :class:`LoopCounter`, :class:`LoopGauge`, :class:`LoopHistogram`: plain numbers without ``prometheus_client``'s
  per-update lock and checks (about 1 us per update), read by a :class:`LoopCollector` at scrape time
  (:mod:`trtfleet_router.metrics` says which metrics these are and why).
* :class:`LoopLagProbe`: every request's handler, relayed token and routing decision waits for the loop, so a busy
  loop (a batch relayed beside interactive requests, a long callback, a starved CPU) delays them all by the same
  amount. The probe asks the loop to wake it every :data:`LAG_INTERVAL_S` and records how much later than asked it
  woke (``trtfleet_router_event_loop_lag_seconds``). Samples come at regular times, not with requests, so the
  histogram is the wait a callback arriving at a random moment would see. An idle loop wakes a timer up to a
  millisecond past its time (epoll waits in whole milliseconds): lags below the first bucket are that floor.
"""

from __future__ import annotations

import asyncio
import bisect
import math
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator
from typing import Final, Generic, Protocol, TypeVar

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.registry import Collector


class _Value:
    __slots__ = ("value",)

    def __init__(self) -> None:
        self.value = 0.0

    def inc(self, amount: float = 1.0) -> None:
        self.value += amount

    def dec(self, amount: float = 1.0) -> None:
        self.value -= amount

    def set(self, value: float) -> None:
        self.value = value


class _Buckets:
    __slots__ = ("bounds", "counts", "sum")

    def __init__(self, bounds: tuple[float, ...]) -> None:
        self.bounds = bounds
        self.counts = [0] * (len(bounds) + 1)  # the last one: above every bound (+Inf)
        self.sum = 0.0

    def observe(self, value: float) -> None:
        self.counts[bisect.bisect_left(self.bounds, value)] += 1  # first bucket with value <= bound
        self.sum += value


C = TypeVar("C", _Value, _Buckets)


class _LoopMetric(ABC, Generic[C]):
    """A metric family with ``labelnames``; ``labels(*values)`` returns its child for those values."""

    def __init__(self, name: str, documentation: str, labelnames: tuple[str, ...]) -> None:
        self.name = name
        self.documentation = documentation
        self.labelnames = labelnames
        self._children: dict[tuple[str, ...], C] = {}

    @abstractmethod
    def _new_child(self) -> C: ...

    @abstractmethod
    def family(self) -> Metric: ...

    def remove(self, *values: str) -> None:
        """Drop the child of ``values`` (a pod that is gone), if any."""
        self._children.pop(values, None)

    def labels(self, *values: str) -> C:
        child = self._children.get(values)
        if child is None:
            if len(values) != len(self.labelnames):
                raise ValueError(f"{self.name} takes labels {self.labelnames}, got {values}")
            child = self._children[values] = self._new_child()
        return child


class LoopCounter(_LoopMetric[_Value]):
    def _new_child(self) -> _Value:
        return _Value()

    def inc(self, amount: float = 1.0) -> None:
        self.labels().value += amount

    def family(self) -> Metric:
        family = CounterMetricFamily(self.name, self.documentation, labels=self.labelnames)
        for values, child in self._children.items():
            family.add_metric(values, child.value)
        return family


class LoopGauge(_LoopMetric[_Value]):
    def _new_child(self) -> _Value:
        return _Value()

    def family(self) -> Metric:
        family = GaugeMetricFamily(self.name, self.documentation, labels=self.labelnames)
        for values, child in self._children.items():
            family.add_metric(values, child.value)
        return family


class LoopHistogram(_LoopMetric[_Buckets]):
    def __init__(self, name: str, documentation: str, labelnames: tuple[str, ...], buckets: tuple[float, ...]) -> None:
        super().__init__(name, documentation, labelnames)
        if list(buckets) != sorted(set(buckets)) or any(math.isinf(b) for b in buckets):
            raise ValueError(f"{name}: buckets must be increasing finite bounds")
        self.bounds = buckets

    def _new_child(self) -> _Buckets:
        return _Buckets(self.bounds)

    def observe(self, value: float) -> None:
        self.labels().observe(value)

    def family(self) -> Metric:
        family = HistogramMetricFamily(self.name, self.documentation, labels=self.labelnames)
        names = [*(_bound_text(b) for b in self.bounds), "+Inf"]
        for values, child in self._children.items():
            cumulative, buckets = 0, []
            for name, count in zip(names, child.counts, strict=True):
                cumulative += count
                buckets.append((name, float(cumulative)))
            family.add_metric(values, buckets, child.sum)
        return family


def _bound_text(bound: float) -> str:
    return repr(float(bound))  # as prometheus_client writes ``le`` (0.005 -> "0.005", 1 -> "1.0")


class LoopCollector(Collector):
    def __init__(self) -> None:
        self.metrics: list[LoopCounter | LoopGauge | LoopHistogram] = []
        self.extra: list[Callable[[], Iterator[Metric]]] = []
        """Families computed at scrape time (the adapter activity window)."""

    def collect(self) -> Iterator[Metric]:
        for metric in self.metrics:
            yield metric.family()
        for families in self.extra:
            yield from families()


LAG_INTERVAL_S: Final = 0.02
"""50 samples a second: a two-minute window holds 6,000, enough for a p99; each costs a timer and a wake-up."""
LAG_BUCKETS_S: Final = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5)


class Observer(Protocol):
    def observe(self, value: float) -> None: ...


def lag_s(asked_at: float, interval_s: float, woke_at: float) -> float:
    """How late a wake-up asked for ``interval_s`` past ``asked_at`` came (pure; never negative)."""
    return max(0.0, woke_at - asked_at - interval_s)


class LoopLagProbe:
    def __init__(self, histogram: Observer, interval_s: float = LAG_INTERVAL_S) -> None:
        if interval_s <= 0:
            raise ValueError(f"loop lag interval must be positive, got {interval_s}")
        self.histogram = histogram
        self.interval_s = interval_s

    async def run(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            asked_at = loop.time()
            await asyncio.sleep(self.interval_s)
            self.histogram.observe(lag_s(asked_at, self.interval_s, loop.time()))
