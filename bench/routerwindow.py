"""What the router process itself spent over a window of a bench case: its CPU and its event loop's lag.

``router_cores``: CPU seconds (user + system) of the router process per second of the window, from ``/proc``.
``loop_lag_p50_ms`` / ``loop_lag_p99_ms``: quantiles of the samples the router's probe took in the window
(``trtfleet_router_event_loop_lag_seconds``, ``router/trtfleet_router/loopmetrics.py``): the difference of the
histogram's cumulative buckets at the window's two ends, interpolated linearly inside a bucket as Prometheus'
``histogram_quantile`` does (so a quantile is only as fine as the buckets: 1, 2.5, 5, 10, 25 ms ...).
"""

from __future__ import annotations

import math
import time
from collections.abc import Mapping, Sequence
from typing import Any, Final

from bench.native_loadgen import cpu_s
from trtfleet.demand import prometheus_samples

LOOP_LAG: Final = "trtfleet_router_event_loop_lag_seconds"


def cumulative_buckets(
    text: str, name: str = LOOP_LAG, match: Mapping[str, str] | None = None
) -> list[tuple[float, float]]:
    """(upper bound, cumulative count) of histogram ``name``'s buckets, summed over the label sets that have every
    label of ``match`` (all of them without it), by bound."""
    counts: dict[float, float] = {}
    for sample, labels, value in prometheus_samples(text):
        if sample == f"{name}_bucket" and all(labels.get(key) == want for key, want in (match or {}).items()):
            bound = float(labels["le"])
            counts[bound] = counts.get(bound, 0.0) + value
    return sorted(counts.items())


def window_quantile(before: Sequence[tuple[float, float]], after: Sequence[tuple[float, float]], q: float) -> float:
    """The ``q`` quantile (0-1) of the samples added between two readings of one histogram (NaN with none); a
    quantile in the +Inf bucket is the highest finite bound."""
    earlier = dict(before)
    added = [(bound, count - earlier.get(bound, 0.0)) for bound, count in after]
    total = added[-1][1] if added else 0.0
    if total <= 0:
        return math.nan
    rank, lower, below = q * total, 0.0, 0.0
    for bound, count in added:
        if count >= rank:
            if math.isinf(bound):
                return lower
            return lower + (bound - lower) * (rank - below) / (count - below) if count > below else bound
        lower, below = bound, count
    return lower


class RouterWindow:
    """Opened at a window's start (``fleet``: a started :class:`bench.realfleet.RealFleet`); :meth:`summary`
    at its end."""

    def __init__(self, fleet: Any) -> None:
        self.fleet = fleet
        self.pid = fleet.router_pid()
        self.began, self.cpu_before = time.monotonic(), cpu_s(self.pid)
        self.lag_before = cumulative_buckets(fleet.router_metrics())

    def summary(self) -> dict[str, float]:
        took_s = time.monotonic() - self.began
        lag = cumulative_buckets(self.fleet.router_metrics())
        return {
            "router_cores": round((cpu_s(self.pid) - self.cpu_before) / took_s, 2),
            "loop_lag_p50_ms": round(window_quantile(self.lag_before, lag, 0.50) * 1000, 2),
            "loop_lag_p99_ms": round(window_quantile(self.lag_before, lag, 0.99) * 1000, 2),
        }
