"""llm-d's flow control, re-implemented as a tenant order and a saturation test (a baseline for tenancy).

Source: llm-d/llm-d-router at ebab6879 (2026-08-22), ``pkg/epp/flowcontrol`` (the processor's dispatch cycle in
``controller/internal/processor.go``), the ``round-robin-fairness-policy`` (``framework/plugins/flowcontrol/fairness/
roundrobin``), the FCFS ordering policy and the ``utilization-detector`` (``.../saturationdetector/utilization``).
What a dispatch cycle does there, and here:

* bands strictly by priority; a band whose ceiling (1.0, the static usage-limit policy) the pool's saturation
  reaches blocks itself and every band below it (head-of-line);
* inside a band the fairness policy picks a flow (a fairness id): round robin over the flows with a queued request,
  in sorted order from a cursor kept per band, the flow's oldest request first. The unit of fairness is a
  dispatch turn, not tokens; flows have no weights (llm-d's default ``global-strict`` policy is first come, first
  served across flows: :class:`~trtfleet_router.routing.fairqueue.ArrivalOrder`);
* saturation: per endpoint ``max(waiting / queueDepthThreshold, kvCacheUsage / kvCacheUtilThreshold)``, averaged
  over the pool (defaults 5 and 0.8): saturated at 1.0 or more. An endpoint whose metrics are missing or stale
  scores 1.0 (upstream fails closed, ``utilization/detector.go``), so the detector needs every pod's load scraped:
  upstream reads trtllm-serve's ``trtllm_num_requests_waiting`` / ``trtllm_kv_cache_utilization`` gauges
  (``datalayer/extractor/metrics/factories.go``), trtfleet its JSON ``/metrics`` (an idle pod reads as 0 waiting,
  ``upstream/scrape.py``); a missing KV fraction counts as 0, as upstream's unset field does;
* shedding at a band's capacity evicts the lowest priority, newest first (``eviction/ordering/priority_time``).
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping
from typing import Final

from trtfleet_router.routing.fairqueue import Priority
from trtfleet_router.routing.types import PodSnapshot

NAME: Final = "llmd-round-robin"
QUEUE_DEPTH_THRESHOLD_DEFAULT: Final = 5
KV_CACHE_UTIL_THRESHOLD_DEFAULT: Final = 0.8


class RoundRobinOrder:
    """llm-d's round-robin fairness policy: per band, the next flow after the cursor that has a waiting request."""

    __slots__ = ("_cursor",)

    def __init__(self) -> None:
        self._cursor: dict[Priority, str] = {}

    def joined(self, tenant: str, band: Priority, backlogged: Collection[str]) -> None:
        return None

    def pick(self, band: Priority, heads: Mapping[str, int]) -> str:
        flows = sorted(heads)
        cursor = self._cursor.get(band)
        if cursor is not None:
            for flow in flows:
                if flow > cursor:
                    return flow
        return flows[0]

    def admitted(self, tenant: str, band: Priority) -> None:
        self._cursor[band] = tenant

    def victim(self, band: Priority, tails: Mapping[str, int]) -> str:
        return max(tails, key=tails.__getitem__)

    def charge(self, tenant: str, input_tokens: int = 0, output_tokens: int = 0) -> None:
        return None

    def share(self, tenant: str, backlogged: Collection[str]) -> float | None:
        return 1 / len(backlogged) if backlogged else None

    def displaces(self, tenant: str, waiting: int, other: str, other_waiting: int) -> bool:
        return False


def pool_saturation(
    pods: Iterable[tuple[int | None, float | None]],
    *,
    queue_depth_threshold: int = QUEUE_DEPTH_THRESHOLD_DEFAULT,
    kv_cache_util_threshold: float = KV_CACHE_UTIL_THRESHOLD_DEFAULT,
) -> float:
    """The utilization detector's pool saturation over the ready pods' ``(waiting requests, KV-cache fraction)``
    as scraped (None: stale or unknown); 1.0 with no pod (nothing to dispatch to)."""
    scores = []
    for waiting, kv_used in pods:
        if waiting is None:  # stale or never scraped: fail closed
            scores.append(1.0)
            continue
        score = waiting / queue_depth_threshold
        if kv_used is not None:
            score = max(score, kv_used / kv_cache_util_threshold)
        scores.append(score)
    return sum(scores) / len(scores) if scores else 1.0


def scraped_load(pods: Iterable[PodSnapshot]) -> list[tuple[int | None, float | None]]:
    """What the detector reads of each ready pod."""
    return [(pod.waiting_requests, pod.kv_cache_used_fraction) for pod in pods if pod.ready]
