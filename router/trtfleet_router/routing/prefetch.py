"""Pacing of prefetches: which planned host copies to push now, so that they never compete with traffic.

A prefetch is a one-token request pinned to a pod that carries the adapter's weights (runtime ``tensorrt``)
or names its path (``pytorch``: the pod reads it). It costs the pod's inbound link the weights' bytes and
the pod one batch slot for one step (with the adapter's host-to-device copy). :class:`PrefetchPacer` lets one
go to a pod only when all of these hold:

* the pod is **idle enough**: nothing waits in its queue (scraped, fresh) and its load is at most
  ``busy_load_factor`` x the mean load of the ready pods (a busy pod's next step is someone's first token);
* at most ``max_inflight_per_pod`` prefetches are on their way to it or running there: an interactive request
  queues behind at most that many one-token requests and their weights on the link;
* its **link budget** allows the bytes: a token bucket per pod refilled at ``link_share`` x the pod link's
  bandwidth, at most ``burst_bytes`` deep, so prefetches take a bounded share of the link that cold loads
  also use. A pod with nothing in flight and nothing queued is not limited by the bucket: no request shares
  its link or its steps (a fleet before its traffic, a pod at night).

So the added queueing an interactive request can see from prefetching is bounded by ``max_inflight_per_pod``
x (one adapter's transfer + one step with its host-to-device copy): :func:`added_queueing_bound_s`.

Pure: the caller passes the clock (``now_s``) and the pods' loads; the pacer only counts.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from pydantic import Field

from trtfleet.api.common import ApiModel


class PrefetchConfig(ApiModel):
    """How prefetches are paced (``placement.prefetch`` in the routing file)."""

    link_share: float = Field(
        default=0.25,
        gt=0,
        le=1,
        description="Share of a pod's link bandwidth (ttftCost linkBandwidthBytesPerS) prefetches may use on "
        "average; the rest is for the cold loads of requests.",
    )
    burst_bytes: float = Field(
        default=256e6,
        gt=0,
        description="Most bytes one pod's prefetch budget can save up while idle (a few adapters' worth).",
    )
    max_inflight_per_pod: int = Field(
        default=1, ge=1, description="Prefetches on their way to or running on one pod at once."
    )
    busy_load_factor: float = Field(
        default=1.0,
        ge=0,
        description="A pod whose load (in flight + waiting) exceeds this times the ready pods' mean load gets "
        "no prefetch now; nor does one with requests waiting in its queue.",
    )
    link_bytes_per_s: float = Field(
        default=1.25e9,
        gt=0,
        description="Bandwidth of a pod's inbound link that ``linkShare`` is a share of: the pod network "
        "(10 GbE = 1.25 GB/s per pod, as ttftCost's linkBandwidthBytesPerS; see docs/router-policies.md).",
    )
    tick_s: float = Field(
        default=0.05, gt=0, description="How often the router looks for prefetches to send (seconds)."
    )


@dataclass(frozen=True, slots=True)
class PodIdleness:
    """What the pacer reads about a ready pod now."""

    pod_id: str
    load: int  # foreground requests in flight plus its fresh scraped queue
    waiting: int | None  # scraped queue length while fresh, else None (unknown: not treated as busy)


class PrefetchPacer:
    """Per-pod token buckets and in-flight counts of prefetches (see the module docstring)."""

    __slots__ = ("_bucket", "_config", "_inflight", "_link_bytes_per_s", "_updated_s")

    def __init__(self, config: PrefetchConfig) -> None:
        self._config = config
        self._link_bytes_per_s = config.link_bytes_per_s
        self._bucket: dict[str, float] = {}
        self._updated_s: dict[str, float] = {}
        self._inflight: dict[str, int] = {}

    @property
    def config(self) -> PrefetchConfig:
        return self._config

    def inflight(self, pod_id: str) -> int:
        return self._inflight.get(pod_id, 0)

    def inflight_total(self) -> int:
        return sum(self._inflight.values())

    def _refill(self, pod_id: str, now_s: float) -> float:
        rate = self._config.link_share * self._link_bytes_per_s
        last = self._updated_s.get(pod_id)
        level = self._bucket.get(pod_id, self._config.burst_bytes) if last is not None else self._config.burst_bytes
        if last is not None:
            level = min(self._config.burst_bytes, level + rate * max(0.0, now_s - last))
        self._bucket[pod_id] = level
        self._updated_s[pod_id] = now_s
        return level

    def due(
        self,
        wanted: Iterable[tuple[str, int, int]],
        pods: Mapping[str, PodIdleness],
        now_s: float,
    ) -> list[tuple[str, int]]:
        """Of ``wanted`` (pod, task id, bytes), most wanted first, the prefetches to send now; each one returned
        is counted as started (call :meth:`finished` when it ends). Pods not in ``pods`` (not ready) get none."""
        config = self._config
        mean_load = sum(p.load for p in pods.values()) / len(pods) if pods else 0.0
        limit = config.busy_load_factor * mean_load
        chosen: list[tuple[str, int]] = []
        closed: set[str] = set()
        for pod_id, task_id, size in wanted:
            if pod_id in closed:
                continue
            pod = pods.get(pod_id)
            if (
                pod is None
                or (pod.waiting is not None and pod.waiting > 0)
                or pod.load > limit
                or self._inflight.get(pod_id, 0) >= config.max_inflight_per_pod
            ):
                closed.add(pod_id)
                continue
            level = self._refill(pod_id, now_s)
            idle = pod.load == 0 and not pod.waiting
            if not idle:
                if level < min(size, config.burst_bytes):
                    closed.add(pod_id)  # its budget is spent for now: the less wanted ones wait too
                    continue
                self._bucket[pod_id] = level - size
            self._inflight[pod_id] = self._inflight.get(pod_id, 0) + 1
            chosen.append((pod_id, task_id))
        return chosen

    def finished(self, pod_id: str) -> None:
        """A prefetch to ``pod_id`` that :meth:`due` returned ended (stored, refused, failed or never sent)."""
        left = self._inflight.get(pod_id, 0) - 1
        if left > 0:
            self._inflight[pod_id] = left
        else:
            self._inflight.pop(pod_id, None)

    def forget(self, pod_ids: Iterable[str]) -> None:
        """Pods that left the fleet or restarted: their counts and budgets start over."""
        for pod_id in pod_ids:
            self._inflight.pop(pod_id, None)
            self._bucket.pop(pod_id, None)
            self._updated_s.pop(pod_id, None)


def added_queueing_bound_s(
    config: PrefetchConfig, weights_bytes: int, link_bytes_per_s: float, step_s: float, copy_s: float
) -> float:
    """The most queueing prefetching can add to an interactive request on one pod: ``max_inflight_per_pod``
    prefetches ahead of it, each one adapter's transfer on the link plus one step with its device copy."""
    return config.max_inflight_per_pod * (weights_bytes / link_bytes_per_s + step_s + copy_s)
