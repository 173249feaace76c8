"""Load signals: the router's own in-flight counts plus scraped pod metrics that go stale.

* In-flight (exact, instant): requests this router started on the pod and has not finished, plus
  those of the other router replicas as their events tell (``remote_inflight``, milliseconds old).
* Scraped (from the pod's ``nv_trt_llm_request_metrics`` / KV-cache block metrics, seconds old):
  requests waiting in the pod's queue (from every router replica) and the KV-cache fraction in use.
  A snapshot older than ``metrics_stale_after_s`` is *unknown*, never a stale number.

The load every policy compares is ``inflight + waiting`` (waiting only while fresh): the pod's
queue beyond its running batch is what a new request would sit behind. An interactive request is compared
without this router's batch lines in flight (``background``): the dispatcher admits batch lines only
below each pod's batch slots, which keeps the engine's remaining slots for interactive requests, so a
batch line does not delay one; counting them sent interactive requests away from the pods that held their
adapters warm (more than twice the cold loads with a batch running, docs/benchmarks/batch.md). Other replicas'
batch lines (``remote_background``, from the class their events carry) are left out the same way: each replica
bounds its own by the batch slots.

Per adapter, :class:`AdapterDemand` keeps the router-wide in-flight count (for hot-adapter
spreading) and an exponentially decayed request count (rare vs popular adapters). Both are O(1)
per request; memory is one entry per adapter seen.
"""

from __future__ import annotations

import math
from collections.abc import Hashable
from typing import Generic, TypeVar

from trtfleet_router.routing.types import PodMetrics

K = TypeVar("K", bound=Hashable)


class PodLoad:
    """Load of one pod."""

    __slots__ = (
        "background",
        "background_tasks",
        "fresh_until_s",
        "inflight",
        "metrics",
        "observed_at_s",
        "remote_background",
        "remote_inflight",
    )

    def __init__(self) -> None:
        self.inflight = 0
        self.background = 0  # of ``inflight``: batch lines (see the module docstring)
        self.background_tasks: dict[int | None, int] = {}  # those batch lines per adapter task id (None: base)
        self.remote_inflight = 0  # other router replicas' requests in flight here (their events)
        self.remote_background = 0  # of ``remote_inflight``: their batch lines
        self.metrics: PodMetrics | None = None
        self.observed_at_s = -math.inf
        self.fresh_until_s = -math.inf

    def observe(self, metrics: PodMetrics, now_s: float, stale_after_s: float) -> None:
        self.metrics = metrics
        self.observed_at_s = now_s
        self.fresh_until_s = now_s + stale_after_s

    def fresh_metrics(self, now_s: float) -> PodMetrics | None:
        return self.metrics if now_s <= self.fresh_until_s else None

    def waiting(self, now_s: float) -> int | None:
        """Requests waiting in the pod's queue, or None when unknown (never scraped or stale)."""
        metrics = self.metrics
        if metrics is None or now_s > self.fresh_until_s:
            return None
        return metrics.waiting_requests

    def kv_used(self, now_s: float) -> float | None:
        metrics = self.metrics
        if metrics is None or now_s > self.fresh_until_s:
            return None
        return metrics.kv_cache_used_fraction

    def load(self, now_s: float) -> int:
        """Requests in flight (every replica's) plus the scraped queue while it is fresh."""
        metrics = self.metrics
        if metrics is not None and now_s <= self.fresh_until_s:
            return self.inflight + self.remote_inflight + metrics.waiting_requests
        return self.inflight + self.remote_inflight

    def batch_started(self, task_id: int | None) -> None:
        """A batch line of adapter ``task_id`` (None: the base model) is in flight here (with ``inflight``)."""
        self.background += 1
        self.background_tasks[task_id] = self.background_tasks.get(task_id, 0) + 1

    def batch_finished(self, task_id: int | None) -> None:
        self.background -= 1
        left = self.background_tasks[task_id] - 1
        if left:
            self.background_tasks[task_id] = left
        else:
            del self.background_tasks[task_id]

    def foreground(self, now_s: float) -> int:
        """:meth:`load` without any replica's batch lines: what an interactive request is compared by."""
        metrics = self.metrics  # load() inlined: every route reads it for every candidate
        waiting = metrics.waiting_requests if metrics is not None and now_s <= self.fresh_until_s else 0
        return self.inflight + self.remote_inflight + waiting - self.background - self.remote_background


class AdapterDemand:
    """Router-wide per-adapter in-flight counts and decayed request counts."""

    __slots__ = ("_decay_per_s", "_inflight", "_recent")

    def __init__(self, half_life_s: float) -> None:
        if half_life_s <= 0:
            raise ValueError("demand half-life must be positive")
        self._decay_per_s = math.log(2) / half_life_s
        self._inflight: dict[int, int] = {}
        self._recent: dict[int, tuple[float, float]] = {}  # task id -> (decayed count, at_s)

    def inflight(self, task_id: int) -> int:
        return self._inflight.get(task_id, 0)

    def recent_requests(self, task_id: int, now_s: float) -> float:
        """Requests for the adapter, each weighted by ``2 ** -(age / half_life)``."""
        entry = self._recent.get(task_id)
        if entry is None:
            return 0.0
        count, at_s = entry
        return count * math.exp(-self._decay_per_s * max(0.0, now_s - at_s))

    def started(self, task_id: int, now_s: float) -> None:
        self._inflight[task_id] = self._inflight.get(task_id, 0) + 1
        self._recent[task_id] = (self.recent_requests(task_id, now_s) + 1.0, now_s)

    def finished(self, task_id: int) -> None:
        left = self._inflight.get(task_id, 0) - 1
        if left > 0:
            self._inflight[task_id] = left
        else:
            self._inflight.pop(task_id, None)

    def total_inflight(self) -> int:
        return sum(self._inflight.values())


class ActivityWindow(Generic[K]):
    """Requests started per key over the last ``window_s``, in one-second buckets, O(1) per request. The
    one window of the router: the fleet's counts every replica's requests per task id (the demand the autoscaler
    reads), :class:`~trtfleet_router.activity.AdapterActivity` this replica's per adapter name."""

    __slots__ = ("_buckets", "window_s")

    def __init__(self, window_s: int) -> None:
        if window_s < 1:
            raise ValueError("the activity window must be at least 1 s")
        self.window_s = window_s
        self._buckets: dict[int, dict[K, int]] = {}  # whole second -> key -> requests

    def record(self, key: K, now_s: float) -> None:
        second = int(now_s)
        bucket = self._buckets.get(second)
        if bucket is None:
            bucket = self._buckets[second] = {}
            oldest = second - self.window_s
            for old in [s for s in self._buckets if s <= oldest]:
                del self._buckets[old]
        bucket[key] = bucket.get(key, 0) + 1

    def counts(self, now_s: float) -> dict[K, int]:
        """Requests per key started in the last ``window_s``."""
        since = int(now_s) - self.window_s
        total: dict[K, int] = {}
        for second, bucket in self._buckets.items():
            if second > since:
                for key, n in bucket.items():
                    total[key] = total.get(key, 0) + n
        return total
