"""Where an adapter loads cold, and what a load costs: the steps both product policies share.

* :func:`cold_home`: the adapter's rendezvous (HRW) ranking, BLAKE2b-64 of ``name NUL pod id``, so replicas
  without shared state agree. Skipped: pods that are not candidates, are warm, are over ``bound``, are in a
  cache-full back-off, or whose cache cannot store the adapter even by evicting every idle one (never a cold
  load where it could only fail). Of the first ``home_pods`` remaining, the first whose LRU victims are all less
  in demand than ``max(rare_recent_requests, demand(adapter))`` takes it (``cold-home``): a cold load never
  pushes out a more popular adapter. Else the first of the *churn pods* (``cold-churn``), a fixed HRW-chosen
  share (``churn_pod_fraction``) of the fleet: TRT-LLM evicts plain LRU among idle adapters, so where rare
  adapters go is the only lever, and they churn a few pods' caches while the warm working sets elsewhere stay.
  Else any pod of the ranking (``cold-evict``).
* :func:`cold_anywhere`: the least loaded candidate that can store the adapter, pods in back-off last.
* :meth:`AdapterPlacementConfig.load_s`: one cold load in seconds (weights over the link, or the pod's own read).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from pydantic import Field

from trtfleet.api.common import ApiModel
from trtfleet_router.routing.framework import PodView, RoutingContext
from trtfleet_router.routing.hashing import rendezvous_rank
from trtfleet_router.routing.types import AdapterRef

CHURN_KEY = "trtfleet/churn-pods"  # HRW key that picks the churn pods


class AdapterPlacementConfig(ApiModel):
    """Where adapters may load cold, and what a load costs: the parameters both product policies share."""

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


def churn_pods(config: AdapterPlacementConfig, pod_ids: Sequence[str]) -> frozenset[str]:
    """The pods rare adapters load on: a ``churn_pod_fraction`` share (at least one), by rendezvous order."""
    count = max(1, math.ceil(config.churn_pod_fraction * len(pod_ids)))
    return frozenset(rendezvous_rank(CHURN_KEY, pod_ids)[:count])


def cold_home(
    ctx: RoutingContext, adapter: AdapterRef, bound: int, config: AdapterPlacementConfig, churn: frozenset[str]
) -> tuple[PodView, int, str] | None:
    """Where a cold load goes: (pod, its load, reason) or None if no pod within ``bound`` can store it.

    1. ``cold-home``: among the first ``home_pods`` pods of the adapter's ranking that can store
       it, the first whose victims (if any) are all less in demand than ``max(rare threshold,
       the adapter's own demand)``: never push out a more popular adapter for this one.
    2. ``cold-churn``: else the first churn pod of the ranking that can store it.
    3. ``cold-evict``: else the first pod of the ranking that can store it.
    """
    now_s = ctx.now_s
    excluded = ctx.request.exclude_pods
    by_id = ctx.by_id
    demand = ctx.demand
    task_id, pages = adapter.task_id, adapter.pages
    admit_below = max(config.rare_recent_requests, demand.recent_requests(task_id, now_s))
    ranking = ctx.rankings.rank(adapter.name)
    examined = 0
    first_churn: tuple[PodView, int] | None = None
    first_any: tuple[PodView, int] | None = None
    for pod_id in ranking:
        if examined >= config.home_pods and first_any is not None and pod_id not in churn:
            continue  # past the home pods with a fallback found: only a churn pod can still change the answer
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


def cold_anywhere(ctx: RoutingContext, adapter: AdapterRef) -> PodView | None:
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
