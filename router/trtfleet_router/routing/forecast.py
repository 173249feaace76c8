"""Per-adapter demand forecast from recency, frequency and the diurnal shape; O(1) per request.

For each adapter (task id) the forecast keeps three signals:

* **recent**: requests decayed with ``recent_half_life_s`` (a minute): what is hot now;
* **steady**: requests decayed with ``steady_half_life_s`` (an hour): what is used often;
* **seasonal**: for each of ``season_bins`` slices of ``period_s`` (a day), the rate seen in that slice,
  smoothed over periods (the newest period weighs ``season_weight``): what is hot at this hour.

A count decayed with half-life ``h`` estimates a steady rate ``r`` as ``count x ln 2 / h``. :meth:`rate` predicts
the rate ``horizon_s`` ahead as the largest of the recent rate, the steady rate and, once the adapter has been
seen for a whole period, the seasonal rate of the slice the horizon falls in. Placement keeps an adapter's host
copies while any of the three wants it, so an adapter that is hot now, used often, or about to rise with its
usual hour is held; the largest, not a blend, because a host copy that is not needed costs memory the plan
sized for, while one that is missing costs a transfer on a request's path.

Memory: two arrays of ``season_bins`` floats and four floats per adapter ever seen; :meth:`retain` drops the
adapters that are no longer registered. Time is the caller's clock (``now_s``), never read here.
"""

from __future__ import annotations

import math
from array import array
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from pydantic import Field

from trtfleet.api.common import ApiModel


class ForecastConfig(ApiModel):
    """How the placement's demand forecast weighs recency, frequency and the time of day."""

    recent_half_life_s: float = Field(
        default=60.0, gt=0, description="Half-life of the recent-request count: how fast a new hot adapter shows."
    )
    steady_half_life_s: float = Field(
        default=3600.0,
        gt=0,
        description="Half-life of the steady-request count: how long an often-used adapter keeps its copies "
        "through a lull.",
    )
    period_s: float = Field(
        default=86_400.0, gt=0, description="Length of the demand cycle the seasonal profile learns (a day)."
    )
    season_bins: int = Field(default=24, ge=1, le=1440, description="Slices of the period (24: hourly).")
    season_weight: float = Field(
        default=0.3,
        gt=0,
        le=1,
        description="Weight of the newest period in the seasonal profile (the rest is the older periods').",
    )
    horizon_s: float = Field(
        default=600.0,
        ge=0,
        description="How far ahead the seasonal part looks: an adapter that usually rises within this long is "
        "prefetched before it does.",
    )


@dataclass(slots=True)
class _Entry:
    recent: float
    recent_at_s: float
    steady: float
    steady_at_s: float
    first_s: float
    period: int  # index of the period ``current`` counts
    current: array[float]  # requests per slice in the current period
    profile: array[float]  # smoothed requests per second per slice, over past periods


class DemandForecast:
    """Recency, frequency and seasonal signals per task id (see the module docstring)."""

    __slots__ = ("_config", "_entries", "_recent_decay", "_slice_s", "_steady_decay")

    def __init__(self, config: ForecastConfig) -> None:
        self._config = config
        self._recent_decay = math.log(2) / config.recent_half_life_s
        self._steady_decay = math.log(2) / config.steady_half_life_s
        self._slice_s = config.period_s / config.season_bins
        self._entries: dict[int, _Entry] = {}

    @property
    def config(self) -> ForecastConfig:
        return self._config

    def __len__(self) -> int:
        return len(self._entries)

    def _slice(self, t_s: float) -> tuple[int, int]:
        """(period index, slice index) of time ``t_s``."""
        period = math.floor(t_s / self._config.period_s)
        offset = t_s - period * self._config.period_s
        return period, min(self._config.season_bins - 1, int(offset / self._slice_s))

    def record(self, task_id: int, now_s: float) -> None:
        """One request for ``task_id`` started at ``now_s`` (demand, not a prefetch)."""
        period, index = self._slice(now_s)
        entry = self._entries.get(task_id)
        if entry is None:
            bins = self._config.season_bins
            entry = self._entries[task_id] = _Entry(
                0.0, now_s, 0.0, now_s, now_s, period, array("d", bytes(8 * bins)), array("d", bytes(8 * bins))
            )
        elif entry.period != period:
            self._fold(entry, period)
        entry.recent = entry.recent * math.exp(-self._recent_decay * max(0.0, now_s - entry.recent_at_s)) + 1.0
        entry.recent_at_s = now_s
        entry.steady = entry.steady * math.exp(-self._steady_decay * max(0.0, now_s - entry.steady_at_s)) + 1.0
        entry.steady_at_s = now_s
        entry.current[index] += 1.0

    def _fold(self, entry: _Entry, period: int) -> None:
        """Close the periods since ``entry.period``: the finished one's slices join the profile, empty ones
        decay it."""
        weight = self._config.season_weight
        elapsed = period - entry.period
        keep = (1.0 - weight) ** (elapsed - 1) if elapsed > 0 else 1.0
        profile, current = entry.profile, entry.current
        for index in range(len(profile)):
            profile[index] = ((1.0 - weight) * profile[index] + weight * current[index] / self._slice_s) * keep
            current[index] = 0.0
        entry.period = period

    def recent_rate(self, task_id: int, now_s: float) -> float:
        """Requests per second over about the last ``recent_half_life_s``."""
        entry = self._entries.get(task_id)
        if entry is None:
            return 0.0
        count = entry.recent * math.exp(-self._recent_decay * max(0.0, now_s - entry.recent_at_s))
        return count * self._recent_decay

    def steady_rate(self, task_id: int, now_s: float) -> float:
        """Requests per second over about the last ``steady_half_life_s``."""
        entry = self._entries.get(task_id)
        if entry is None:
            return 0.0
        # the count ramps up over its first half-lives: divide by what a steady rate would have reached since the
        # adapter was first seen (at least one recent half-life, so one early request is not a high rate)
        seen_s = max(now_s - entry.first_s, self._config.recent_half_life_s)
        reached = 1.0 - math.exp(-self._steady_decay * seen_s)
        count = entry.steady * math.exp(-self._steady_decay * max(0.0, now_s - entry.steady_at_s))
        return count * self._steady_decay / reached

    def seasonal_rate(self, task_id: int, at_s: float) -> float | None:
        """The profile's rate for the slice ``at_s`` falls in; None until a whole period has been seen."""
        entry = self._entries.get(task_id)
        if entry is None or at_s - entry.first_s < self._config.period_s:
            return None
        period, index = self._slice(at_s)
        weight = self._config.season_weight
        value = entry.profile[index]
        if period > entry.period:  # periods not folded yet: fold this slice only, without mutating
            elapsed = period - entry.period
            value = ((1.0 - weight) * value + weight * entry.current[index] / self._slice_s) * (
                (1.0 - weight) ** (elapsed - 1)
            )
        return value

    def rate(self, task_id: int, now_s: float) -> float:
        """The predicted rate (requests/s): the largest of recent, steady and seasonal ``horizon_s`` ahead."""
        predicted = max(self.recent_rate(task_id, now_s), self.steady_rate(task_id, now_s))
        seasonal = self.seasonal_rate(task_id, now_s + self._config.horizon_s)
        return predicted if seasonal is None else max(predicted, seasonal)

    def rates(self, task_ids: Iterable[int], now_s: float) -> dict[int, float]:
        """:meth:`rate` of each of ``task_ids`` (0 for those never seen)."""
        return {task_id: self.rate(task_id, now_s) for task_id in task_ids}

    def retain(self, known: Mapping[int, object] | Iterable[int]) -> int:
        """Forget the adapters not in ``known`` (no longer registered); how many were dropped."""
        keep = set(known)
        gone = [task_id for task_id in self._entries if task_id not in keep]
        for task_id in gone:
            del self._entries[task_id]
        return len(gone)
