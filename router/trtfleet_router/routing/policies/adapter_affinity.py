"""``adapter-affinity``: route by adapter residency alone, counting requests rather than pricing them.

Kept beside the default ``ttft-cost`` policy for comparison (and for fleets without prefix reuse). Warm first;
cold loads go where every replica would put them. For a request for adapter ``a`` (``load`` = in-flight + fresh
scraped waiting; ``bound`` = least candidate load + ``load_bound_inflight``):

1. **Warm.** The least loaded candidate whose shadow cache holds ``a`` (ties: ``a``'s rendezvous order, so
   replicas agree); pods where ``a`` has settled before pods where its weights are still in transit with an
   earlier request (an id-only request may overtake them). Taken when within ``bound`` and ``a`` is not hot.
2. **Cold.** Otherwise the cold placement both product policies share (``policies/cold_placement.py``:
   ``cold-home``, ``cold-churn``, ``cold-evict``).
3. **Pricing.** Leaving a warm pod (over ``bound``, or ``a`` hot) for that cold pod happens only when the cold
   pod is cheaper in seconds: cold = one load (``AdapterPlacementConfig.load_s``, plus another when it evicts an
   adapter: that adapter's later reload) + ``load x queue_delay_per_inflight_s``; warm =
   ``load x queue_delay_per_inflight_s``.
4. **Hot spread.** ``a`` is hot when its in-flight requests per warm candidate reach
   ``hot_spread_inflight_per_pod`` and none of its loads is in transit; the next pod of its ranking then competes
   on price, one pod at a time, in the same order on every replica.
5. **Fallback.** No warm pod and no cold pod within ``bound``: the least loaded candidate that can store ``a``
   (``cold-over-bound``); none can: :class:`CachesBusy` (the shell waits for a request to end).
6. Base-model requests: least load, ties at random (``base-least-load``).

Reasons: ``warm``, ``warm-over-bound``, ``warm-overloaded``, ``hot-spread``, ``cold-home``, ``cold-churn``,
``cold-evict``, ``cold-over-bound``, ``base-least-load``.
"""

from __future__ import annotations

from collections.abc import Sequence

from pydantic import Field

from trtfleet_router.routing.config import RoutingConfig
from trtfleet_router.routing.framework import Choice, PodView, RoutingContext, least_loaded
from trtfleet_router.routing.hashing import rendezvous_score
from trtfleet_router.routing.policies.cold_placement import (
    AdapterPlacementConfig,
    churn_pods,
    cold_anywhere,
    cold_home,
)
from trtfleet_router.routing.types import AdapterRef, CachesBusy

NAME = "adapter-affinity"
SECTION = "adapter_affinity"


class AdapterAffinityConfig(AdapterPlacementConfig):
    """Parameters of the ``adapter-affinity`` policy."""

    queue_delay_per_inflight_s: float = Field(
        default=0.05,
        gt=0,
        description="Delay one more request ahead on a pod adds to a new one: about a "
        "request's service time (~6 s) over the batch it shares (~128) in in-flight batching.",
    )


class AdapterAffinityPolicy:
    def __init__(self, config: AdapterAffinityConfig, retry_after_s: float) -> None:
        self._config = config
        self._retry_after_s = retry_after_s
        self._churn: frozenset[str] = frozenset()

    @property
    def name(self) -> str:
        return NAME

    @property
    def churn_pods(self) -> frozenset[str]:
        return self._churn

    def pods_changed(self, pod_ids: Sequence[str]) -> None:
        self._churn = churn_pods(self._config, pod_ids)

    def choose(self, ctx: RoutingContext) -> Choice:
        adapter = ctx.request.adapter
        if adapter is None:
            return Choice(least_loaded(ctx), "base-least-load")
        config = self._config
        task_id = adapter.task_id
        bound = min(ctx.loads) + config.load_bound_inflight

        warm, warm_load, warm_count, loading = self._pick_warm(ctx, adapter, bound)
        if warm is not None:
            # one spread at a time: not while weights of this adapter are still in transit
            spread_at = config.hot_spread_inflight_per_pod * warm_count
            hot = not loading and ctx.demand.inflight(task_id) >= spread_at
            within = warm_load <= bound
            if within and not hot:
                return Choice(warm, "warm")
            found = cold_home(ctx, adapter, bound, config, self._churn)
            if found is not None:
                cold, cold_load, _reason = found
                delay_s = config.queue_delay_per_inflight_s
                if self._cold_cost_s(cold, cold_load, adapter) < warm_load * delay_s:
                    return Choice(cold, "warm-overloaded" if not within else "hot-spread")
            return Choice(warm, "warm" if within else "warm-over-bound")

        found = cold_home(ctx, adapter, bound, config, self._churn)
        if found is not None:
            return Choice(found[0], found[2])
        fallback = cold_anywhere(ctx, adapter)
        if fallback is not None:
            return Choice(fallback, "cold-over-bound")
        raise CachesBusy("every candidate pod's LoRA cache is full of busy adapters", self._retry_after_s)

    # -- steps -------------------------------------------------------------------------------------
    @staticmethod
    def _pick_warm(
        ctx: RoutingContext, adapter: AdapterRef, bound: int
    ) -> tuple[PodView | None, int, int, bool]:
        """(warm pod, its load, number of warm candidates, whether any of them is still loading).

        The least loaded candidate where ``a`` has settled, if within ``bound``; else the least
        loaded where its weights are still in transit, if within ``bound``; else the least loaded
        of all. Equal loads go to the pod ranked first for ``a`` (replicas agree on it too).
        """
        task_id = adapter.task_id
        warm_ids = ctx.residency.warm_pods(task_id)
        if not warm_ids:
            return None, 0, 0, False
        excluded = ctx.request.exclude_pods
        by_id = ctx.by_id
        best: list[PodView | None] = [None, None]  # [settled, loading]
        best_load = [0, 0]
        best_score = [-1, -1]  # HRW score of the best, computed only on a tie
        count = 0
        for pod_id in warm_ids:
            pod = by_id[pod_id]
            residency = pod.residency
            if not pod.ready or pod_id in excluded or not residency.is_warm(task_id):
                continue
            count += 1
            kind = 1 if residency.is_loading(task_id) else 0
            load = ctx.load(pod)
            current = best[kind]
            if current is None or load < best_load[kind]:
                best[kind], best_load[kind], best_score[kind] = pod, load, -1
            elif load == best_load[kind]:
                if best_score[kind] < 0:
                    best_score[kind] = rendezvous_score(adapter.name, current.pod_id)
                score = rendezvous_score(adapter.name, pod_id)
                if score > best_score[kind]:
                    best[kind], best_score[kind] = pod, score
        loading = best[1] is not None
        for kind in (0, 1):
            if best[kind] is not None and best_load[kind] <= bound:
                return best[kind], best_load[kind], count, loading
        kind = 0 if best[1] is None or (best[0] is not None and best_load[0] <= best_load[1]) else 1
        return best[kind], best_load[kind], count, loading

    def _cold_cost_s(self, pod: PodView, load: int, adapter: AdapterRef) -> float:
        config = self._config
        transfer_s = config.load_s(adapter)
        residency = pod.residency
        evicts = not residency.holds(adapter.task_id) and residency.would_evict(adapter.pages)
        eviction_s = transfer_s if evicts else 0.0
        return transfer_s + eviction_s + load * config.queue_delay_per_inflight_s


def build(config: RoutingConfig) -> AdapterAffinityPolicy:
    return AdapterAffinityPolicy(config.section(SECTION, AdapterAffinityConfig), config.no_capacity_retry_after_s)
