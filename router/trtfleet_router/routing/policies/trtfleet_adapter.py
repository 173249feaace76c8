"""``trtfleet-adapter``: adapter residency only (the default before prefix pricing; kept for comparison).

Warm first; cold loads go where every replica would put them. The default ``trtfleet`` policy
(``policies/trtfleet.py``) reuses these steps and prices every candidate in seconds instead.

A procedure rather than a weighted sum. For a request for adapter ``a`` (``load`` = in-flight +
fresh scraped waiting; ``bound`` = least candidate load + ``load_bound_inflight``;
``demand(x)`` = decayed recent requests for ``x``):

1. **Warm.** The least loaded candidate whose shadow cache holds ``a`` (ties: the one ranked
   first by step 2's hash, so replicas agree); pods where ``a`` has settled before pods where its
   weights are still in transit with an earlier request (an id-only request may overtake them). Taken
   when its load is within ``bound`` and ``a`` is not hot.
2. **Cold home (deterministic).** Otherwise pods are tried in ``a``'s rendezvous (HRW) order,
   BLAKE2b-64 of ``name NUL pod id``, so replicas without shared state agree. Skipped: pods that
   are not candidates, are warm, are over ``bound``, are in a cache-full back-off, or whose cache
   cannot store ``a`` even by evicting every idle adapter (never a cold load where it could only
   fail). Of the first ``home_pods`` remaining, the first whose LRU victims all have
   ``demand < max(rare_recent_requests, demand(a))`` takes it (``cold-home``): a cold load never
   pushes out a more popular adapter.
3. **Long tail (``cold-churn``).** If the home pods refuse, ``a`` is rarer than what they hold: it
   goes to the first pod of its ranking among the *churn pods*, a fixed HRW-chosen share
   (``churn_pod_fraction``) of the fleet. TRT-LLM evicts plain LRU among idle adapters; where rare
   adapters go is the only lever, so they churn a few pods' caches and leave the warm working
   sets elsewhere alone. Then any pod of the ranking (``cold-evict``).
4. **Pricing.** Leaving a warm pod (over ``bound``, or ``a`` hot) for the cold pod of step 2-3
   happens only when the cold pod is cheaper, in seconds: cold = the load (``load_overhead_s +
   weights_bytes / link_bandwidth_bytes_per_s``; runtime pytorch: ``pod_read_overhead_s + weights_bytes /
   pod_read_bytes_per_s``, the pod reads the adapter) ``+ load x queue_delay_per_inflight_s`` (+ the load
   again when it evicts an adapter: that adapter's later reload); warm = ``load x queue_delay_per_inflight_s``.
5. **Hot spread.** ``a`` is hot when its own in-flight requests per warm candidate reach
   ``hot_spread_inflight_per_pod`` and none of its loads is in transit; the next pod of its ranking
   then competes on price, so a popular adapter grows onto more pods as its load grows, one pod at
   a time, in the same order on every replica.
6. **Fallback.** No warm pod and no cold pod within ``bound``: the least loaded candidate that can
   store ``a`` (pods in back-off last, ``cold-over-bound``). None can: :class:`CachesBusy` (the shell waits
   for a request to end, then routes again).
7. Base-model requests: least load, ties at random (``base-least-load``).

Not normalised scores in [0, 1]: the decision compares costs in seconds, not weighted sums.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from pydantic import Field

from trtfleet.api.common import ApiModel
from trtfleet_router.routing.config import RoutingConfig
from trtfleet_router.routing.framework import Choice, PodView, RoutingContext, least_loaded
from trtfleet_router.routing.hashing import rendezvous_rank, rendezvous_score
from trtfleet_router.routing.types import AdapterRef, CachesBusy

NAME = "trtfleet-adapter"
SECTION = "trtfleet_adapter"
CHURN_KEY = "trtfleet/churn-pods"  # HRW key that picks the churn pods


class TrtfleetPolicyConfig(ApiModel):
    """Parameters of the ``trtfleet-adapter`` policy and the adapter side of ``trtfleet``."""

    load_bound_inflight: int = Field(
        default=12,
        ge=0,
        description="A warm pod is preferred while its load exceeds the least-loaded "
        "candidate's by at most this many requests (in-flight + scraped waiting). Keep it well below the engine's "
        "max batch size: beyond it requests queue behind a full batch for a whole service time (12 suits batches "
        "of 64 and more; the real-run benchmark with max batch 8 uses 4).",
    )
    link_bandwidth_bytes_per_s: float = Field(
        default=1.25e9,
        gt=0,
        description="Assumed bandwidth of a cold load. Weights travel router -> pod "
        "inside the gRPC request over the pod network (10 GbE = 1.25 GB/s, and about what Python protobuf "
        "serialisation sustains); the pod's pinned-host -> GPU copy over PCIe (~25 GB/s) is never the "
        "narrow link, so the network is what a cold load costs.",
    )
    pod_read_bytes_per_s: float = Field(
        default=5e8,
        gt=0,
        description="Assumed speed of a cold load on runtime pytorch, where the pod reads the adapter's PEFT "
        "directory from its volume (nothing travels with the request): a shared volume (NFS, a PVC) read plus "
        "the PEFT-to-TRT-LLM conversion on the pod, about 0.5 GB/s.",
    )
    load_overhead_s: float = Field(
        default=0.005,
        ge=0,
        description="Fixed cost of one cold load that carries the weights (runtime tensorrt), on top of the bytes "
        "over the link: Triton unpacking the lora_weights/lora_config tensors, the PEFT cache's put into host "
        "pages and their copy to device pages before the step. 5 ms is an estimate for a GPU pod, not a "
        "measurement; `python -m bench.coldload` measures it on your fleet (1.7 ms on the CPU reference "
        "workers: docs/benchmarks/routing.md).",
    )
    pod_read_overhead_s: float = Field(
        default=0.05,
        ge=0,
        description="Fixed cost of one cold load on runtime pytorch, on top of the bytes read: the pod opens the "
        "PEFT directory and converts it module by module to TRT-LLM's layout, twice (rank 0's preload and "
        "add_request_peft each read lora_path). 50 ms is an estimate for a 32-layer model, not a measurement; "
        "`python -m bench.coldload --runtime pytorch` measures it on your fleet.",
    )
    queue_delay_per_inflight_s: float = Field(
        default=0.05,
        gt=0,
        description="Delay one more request ahead on a pod adds to a new one: about a "
        "request's service time (~6 s) over the batch it shares (~128) in in-flight batching.",
    )
    hot_spread_inflight_per_pod: int = Field(
        default=4,
        ge=1,
        description="When an adapter's own in-flight requests per warm pod reach this, "
        "the next pod in its rendezvous ranking may take it (cold) if that is cheaper.",
    )
    home_pods: int = Field(
        default=2,
        ge=1,
        description="Pods at the head of an adapter's rendezvous ranking (among those "
        "that can take it now) where a cold load may go if it evicts nothing more popular.",
    )
    rare_recent_requests: float = Field(
        default=2.0,
        ge=0,
        description="An adapter with fewer decayed recent requests than this is rare: any cold load may evict it.",
    )
    churn_pod_fraction: float = Field(
        default=0.25,
        gt=0,
        le=1,
        description="Share of pods (at least one) that take rare adapters' cold "
        "loads, chosen by rendezvous hashing so every replica picks the same ones.",
    )


    def load_s(self, adapter: AdapterRef) -> float:
        """What one cold load of ``adapter`` costs a pod: the fixed part plus its bytes over the link (tensorrt:
        the weights travel with the request) or over the pod's own read of ``lora_path`` (pytorch)."""
        if adapter.read_by_pod:
            return self.pod_read_overhead_s + adapter.weights_bytes / self.pod_read_bytes_per_s
        return self.load_overhead_s + adapter.weights_bytes / self.link_bandwidth_bytes_per_s


class TrtfleetPolicy:
    def __init__(self, config: TrtfleetPolicyConfig, retry_after_s: float) -> None:
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
        count = max(1, math.ceil(self._config.churn_pod_fraction * len(pod_ids)))
        self._churn = frozenset(rendezvous_rank(CHURN_KEY, pod_ids)[:count])

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
            found = self._cold_home(ctx, adapter, bound)
            if found is not None:
                cold, cold_load, _reason = found
                delay_s = config.queue_delay_per_inflight_s
                if self._cold_cost_s(cold, cold_load, adapter) < warm_load * delay_s:
                    return Choice(cold, "warm-overloaded" if not within else "hot-spread")
            return Choice(warm, "warm" if within else "warm-over-bound")

        found = self._cold_home(ctx, adapter, bound)
        if found is not None:
            return Choice(found[0], found[2])
        fallback = self._cold_anywhere(ctx, adapter)
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

    def _cold_home(
        self, ctx: RoutingContext, adapter: AdapterRef, bound: int
    ) -> tuple[PodView, int, str] | None:
        """Where a cold load goes: (pod, its load, reason) or None if no pod within ``bound`` can store it.

        1. ``cold-home``: among the first ``home_pods`` pods of the adapter's ranking that can store
           it, the first whose victims (if any) are all less in demand than ``max(rare threshold,
           the adapter's own demand)``: never push out a more popular adapter for this one.
        2. ``cold-churn``: else the first churn pod of the ranking that can store it.
        3. ``cold-evict``: else the first pod of the ranking that can store it.
        """
        config = self._config
        now_s = ctx.now_s
        excluded = ctx.request.exclude_pods
        by_id = ctx.by_id
        demand = ctx.demand
        task_id, pages = adapter.task_id, adapter.pages
        admit_below = max(config.rare_recent_requests, demand.recent_requests(task_id, now_s))
        churn = self._churn
        ranking = ctx.rankings.rank(adapter.name)
        examined = 0
        first_churn: tuple[PodView, int] | None = None
        first_any: tuple[PodView, int] | None = None
        for pod_id in ranking:
            pod = by_id[pod_id]
            if not pod.ready or pod_id in excluded or pod.cache_full_until_s > now_s:
                continue
            residency = pod.residency
            if residency.is_warm(task_id):
                continue
            load = ctx.load(pod)
            if load > bound:
                continue
            victims = [] if residency.holds(task_id) else residency.victims_for(pages)
            if victims is None:
                continue  # full of busy adapters: the request would only fail there
            if examined < config.home_pods:
                examined += 1
                if all(demand.recent_requests(victim, now_s) < admit_below for victim in victims):
                    return pod, load, "cold-home"
            if first_any is None:
                first_any = (pod, load)
            if first_churn is None and pod_id in churn:
                first_churn = (pod, load)
            if first_churn is not None and examined >= config.home_pods:
                break
        if first_churn is not None:
            return first_churn[0], first_churn[1], "cold-churn"
        if first_any is not None:
            return first_any[0], first_any[1], "cold-evict"
        return None

    @staticmethod
    def _cold_anywhere(ctx: RoutingContext, adapter: AdapterRef) -> PodView | None:
        """The least loaded candidate that can store the adapter; pods in back-off last."""
        now_s = ctx.now_s
        pages = adapter.pages
        best: PodView | None = None
        best_key = (True, 0)
        for pod_id in ctx.rankings.rank(adapter.name):
            pod = ctx.by_id[pod_id]
            residency = pod.residency
            if not ctx.is_candidate(pod) or not (
                residency.holds(adapter.task_id) or residency.has_evictable_slot(pages)
            ):
                continue
            key = (pod.cache_full_until_s > now_s, ctx.load(pod))
            if best is None or key < best_key:
                best, best_key = pod, key
        return best

    def _cold_cost_s(self, pod: PodView, load: int, adapter: AdapterRef) -> float:
        config = self._config
        transfer_s = config.load_s(adapter)
        residency = pod.residency
        evicts = not residency.holds(adapter.task_id) and residency.would_evict(adapter.pages)
        eviction_s = transfer_s if evicts else 0.0
        return transfer_s + eviction_s + load * config.queue_delay_per_inflight_s


def build(config: RoutingConfig) -> TrtfleetPolicy:
    return TrtfleetPolicy(config.section(SECTION, TrtfleetPolicyConfig), config.no_capacity_retry_after_s)
