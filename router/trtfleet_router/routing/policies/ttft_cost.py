"""``ttft-cost`` (the default): each candidate pod priced by the first token it would give, in seconds.

On TensorRT-LLM a cached prefix exists only where the same adapter served the same leading tokens (the block key
holds the LoRA task id), so "where is the adapter warm" and "where is the prefix cached" are one question.
Every candidate ``p`` gets one cost::

    cost(p) = queue(p) + adapter(p) + prefill(p)
    queue(p)    = pending_prefill(p) x prefill_s_per_token   (uncached prompt tokens of requests started there that
                  - min(now - head_since(p), head_prefill(p))  have no first token yet, less what the oldest has
                  + load(p) x inflight_delay_s / tps(p)        computed since; plus what each request in flight adds:
                                                               its decode steps, fewer with speculation: tps(p) is
                                                               the pod's scraped tokens per step, at least 1)
    adapter(p)  = 0 when warm and settled, else link(p) x load_s   (link(p) = 1 + weight transfers already on their
                  (+ one load more when storing it evicts an      way to p: they go one after another)
                  adapter: that adapter's later reload)
    prefill(p)  = (prompt_tokens - matched_blocks(p) x block_tokens x confidence(p)) x prefill_s_per_token

A pod where the adapter is warm but its weights are still on their way with an earlier request is priced with the
transfer: a request sent there now carries the weights again. The cheapest candidate takes the request.
Candidates: every pod where the adapter is warm; every pod that holds a prefix of the request's blocks and can
store the adapter (priced cold); the adapter's cold home (``policies/cold_placement.py``) when no pod is warm,
when the adapter is hot (its in-flight requests per warm pod reach ``hot_spread_inflight_per_pod``), when the warm
pods are over the load bound, or when the prefill waiting on the cheapest warm pod takes longer than a load; and
the spill pod, the candidate with the shortest queue that can store the adapter, scanned only while the best so
far costs more than a load plus a full prefill (the least a pod without the prefix can cost).

So a conversation stays on its pod while its cached prefix saves more prefill than that pod's queue costs, and a
hot prefix or adapter spreads as soon as queueing where it is costs more than a cold load plus a fresh prefill
elsewhere. The queue is priced as the prefill waiting ahead, not as a count (as Dynamo's KV router does in
blocks; a count makes three short requests look dearer than one 8,000-token prompt); docs/benchmarks/ compares
it with the other policies.

Ties (within 1 us) go to warm before cold, then (``planned_homes``) to a pod where the placement plans the adapter,
then to the adapter's rendezvous order (replicas agree). No candidate
within the bound: the least loaded pod that can store the adapter (``cold-over-bound``); none:
:class:`~trtfleet_router.routing.types.CachesBusy`. Base-model requests: the cheapest by queue + prefill.

Both tiers (``tiered-cost``, ``policies/tiered_cost.py``, sets these; off here): with ``host_to_device_bytes_per_s``
a warm pod whose device tier does not hold the adapter costs its copy more, and a cold load its transfer plus the
copy; with ``overlap_transfer_with_queue`` a cold load of an adapter no pod holds costs ``max(link, queue)``,
not their sum (the weights travel while the pod works through the queue ahead of the request; where some pod
holds it, the sum still prices what a transfer adds over going there); with ``planned_homes`` the pods where the
fleet's placement wants a host copy are priced as cold candidates too (``cold-planned``).

Reasons: ``warm``, ``warm-prefix`` (a warm pod chosen over a less loaded one), ``cold-prefix``, ``hot-spread``,
``spill``, ``cold-home`` / ``cold-churn`` / ``cold-evict``, ``cold-planned``, ``cold-over-bound``, ``base-priced``.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Collection, Mapping, Sequence

from pydantic import Field

from trtfleet_router.routing.config import RoutingConfig
from trtfleet_router.routing.framework import Choice, PodView, RoutingContext
from trtfleet_router.routing.hashing import rendezvous_score
from trtfleet_router.routing.policies.cold_placement import (
    AdapterPlacementConfig,
    churn_pods,
    cold_anywhere,
    cold_home,
)
from trtfleet_router.routing.prefixindex import pending_prefill_of
from trtfleet_router.routing.types import AdapterRef, CachesBusy

NAME = "ttft-cost"
SECTION = "ttft_cost"
COST_TIE_S = 1e-6


def tokens_per_step(ctx: RoutingContext, pod_id: str) -> float:
    """The pod's fresh scraped tokens per decode step of a request (speculative decoding), at least 1."""
    pod = ctx.by_id.get(pod_id)
    metrics = pod.load.fresh_metrics(ctx.now_s) if pod is not None else None
    found = metrics.tokens_per_step if metrics is not None else None
    return max(1.0, found) if found is not None else 1.0


class TtftCostConfig(AdapterPlacementConfig):
    """Parameters of the default ``ttft-cost`` policy."""

    prefill_s_per_token: float = Field(
        default=14.5e-6,
        ge=0,
        description="GPU time to prefill one prompt token that is not in the KV cache. 14.5 us: Llama-3.1-8B "
        "FP8 on one H100 (bench/podsim.py fit to NVIDIA's published TensorRT-LLM throughput); take it from the "
        "capacity plan or a measured profile of your engine.",
    )
    inflight_delay_s: float = Field(
        default=0.005,
        ge=0,
        description="What one request in flight on a pod adds to a new request's first token beyond the prefill "
        "queued ahead (decode steps it shares the batch with). 5 ms: the Mooncake replay in the simulator is "
        "as good from 3 to 10 ms (docs/benchmarks/prefix.md); adapter-affinity's 50 ms per "
        "request (queueDelayPerInflightS) is the whole service time over the batch and outweighs prefill.",
    )


    host_to_device_bytes_per_s: float | None = Field(
        default=None,
        gt=0,
        description="Bandwidth of a pod's host-to-device copy (PCIe). Set: a request whose adapter is in the pod's "
        "host tier but not on its device tier is priced with the copy (weights / this), and a cold load with the "
        "copy after its transfer. None: copies are free (the network is the narrow link). tiered-cost sets it.",
    )
    overlap_transfer_with_queue: bool = Field(
        default=False,
        description="A cold load's transfer runs while the request would wait in the pod's queue anyway: price "
        "max(transfer, queue) instead of their sum. tiered-cost sets it.",
    )
    planned_homes: bool = Field(
        default=False,
        description="Price the pods where the fleet's placement plans a host copy of the adapter as cold "
        "candidates too (a request there leaves its weights where the plan wants them). tiered-cost sets it.",
    )


class QueuePrices:
    """Each candidate's queue in seconds for one decision, computed once per pod: the same pod is priced as a warm,
    a cold and a spill candidate, and the spill scan reads every candidate's.

    A pod's queue is the prefill still pending there (started, no first token; less what the oldest has computed
    since it got the pod) plus what the requests in flight add. Only candidates are priced: ``ctx.pods`` are the
    candidates, and every caller passes the load the request compares (``ctx.load``, ``ctx.loads``)."""

    __slots__ = ("_ctx", "_delay_s", "_every", "_queues", "_s_per_token")

    def __init__(self, ctx: RoutingContext, config: TtftCostConfig) -> None:
        self._ctx = ctx
        self._delay_s = config.inflight_delay_s
        self._s_per_token = config.prefill_s_per_token
        self._queues: dict[str, float] = {}
        self._every = False

    def of(self, pod_id: str, load: int) -> float:
        """The queue of candidate ``pod_id`` whose load is ``load``."""
        found = self._queues.get(pod_id)
        if found is None:
            ctx = self._ctx
            pending_s = ctx.prefix.pending_prefill_s(pod_id, ctx.now_s, self._s_per_token)
            found = self._queues[pod_id] = load * self._delay_s / tokens_per_step(ctx, pod_id) + pending_s
        return found

    def every(self) -> Mapping[str, float]:
        """Every candidate's queue, by pod id."""
        queues = self._queues
        if not self._every:
            ctx = self._ctx
            now_s, delay_s, s_per_token = ctx.now_s, self._delay_s, self._s_per_token
            blocks_of = ctx.prefix.pods
            for pod, load in zip(ctx.pods, ctx.loads, strict=True):
                pod_id = pod.pod_id
                if pod_id in queues:
                    continue
                # tokens_per_step and pending_prefill_s inlined: this runs for every candidate
                state = pod.load
                metrics = state.metrics
                per_step = 1.0
                if metrics is not None and now_s <= state.fresh_until_s:
                    found = metrics.tokens_per_step
                    if found is not None and found > 1.0:
                        per_step = found
                queue_s = load * delay_s / per_step
                blocks = blocks_of.get(pod_id)
                if blocks is not None and blocks.pending_prefill_tokens:
                    queue_s += pending_prefill_of(blocks, now_s, s_per_token)
                queues[pod_id] = queue_s
            self._every = True
        return queues

    def shortest(
        self, adapter: AdapterRef, can_store: Callable[[PodView, AdapterRef], bool]
    ) -> tuple[PodView, int] | None:
        """The not-warm candidate with the shortest queue that ``can_store`` the adapter and is not in back-off;
        walking the adapter's rendezvous ranking, a pod replaces the one found only with a queue shorter by more
        than ``COST_TIE_S``, so replicas agree. Only a pod that would replace it is checked further."""
        queues = self.every()
        ctx = self._ctx
        by_id = ctx.by_id
        now_s = ctx.now_s
        task_id = adapter.task_id
        found: PodView | None = None
        below = math.inf  # what a queue must be under to replace the one found (none yet: any)
        shortest_s = min(queues.values(), default=math.inf)
        for pod_id in ctx.rankings.rank(adapter.name):
            queue_s = queues.get(pod_id)
            if queue_s is None or queue_s >= below:
                continue  # not a candidate, or not shorter than the one found
            pod = by_id[pod_id]
            if pod.residency.is_warm(task_id) or pod.cache_full_until_s > now_s or not can_store(pod, adapter):
                continue
            found, below = pod, queue_s - COST_TIE_S
            if below <= shortest_s:
                break  # no candidate's queue is under it: the rest of the ranking cannot replace this one
        return None if found is None else (found, ctx.load(found))


class TtftCostPolicy:
    uses_prefix = True  # the fleet hashes prompts and books their blocks only for such policies
    prices: Callable[[RoutingContext, TtftCostConfig], QueuePrices] = QueuePrices  # one decision's queues

    def __init__(self, config: TtftCostConfig, retry_after_s: float, name: str = NAME) -> None:
        self._config = config
        self._retry_after_s = retry_after_s
        self._name = name
        self._churn: frozenset[str] = frozenset()

    @property
    def churn_pods(self) -> frozenset[str]:
        return self._churn

    def pods_changed(self, pod_ids: Sequence[str]) -> None:
        self._churn = churn_pods(self._config, pod_ids)

    @property
    def name(self) -> str:
        return self._name

    def choose(self, ctx: RoutingContext) -> Choice:
        adapter = ctx.request.adapter
        if adapter is None:
            return self._choose_base(ctx)
        config = self._config
        task_id = adapter.task_id
        matches = ctx.prefix_matches()
        queues = self.prices(ctx, config)
        bound = min(ctx.loads) + config.load_bound_inflight
        best = _Best(adapter.name, ctx.placement.pods_of(task_id) if config.planned_homes else ())
        full_prefill_s = ctx.request.prompt_tokens * config.prefill_s_per_token
        transfer_s = self._config.load_s(adapter)
        least_warm_load: int | None = None
        warm_count = 0
        adapter_copy_s = self._copy_s(adapter)
        for pod_id in ctx.residency.warm_pods(task_id):
            pod = ctx.by_id[pod_id]
            if not ctx.is_candidate(pod) or not pod.residency.is_warm(task_id):
                continue
            warm_count += 1
            load = ctx.load(pod)
            if least_warm_load is None or load < least_warm_load:
                least_warm_load = load
            prefill_s = self._prefill_s(ctx, pod_id, matches) if pod_id in matches else full_prefill_s
            # weights still in transit there: this request carries them too (one more transfer on its link)
            loading_s = self._link_s(pod, transfer_s) if pod.residency.is_loading(task_id) else 0.0
            copy_s = 0.0 if not adapter_copy_s or pod.residency.on_device(task_id) else adapter_copy_s
            best.offer(pod, queues.of(pod_id, load) + prefill_s + loading_s + copy_s, False, "warm")
        if best.pod is not None and least_warm_load is not None and ctx.load(best.pod) > least_warm_load:
            best.reason = "warm-prefix"
        # held nowhere: its transfer is on the request's path wherever it goes, so it runs during the queue wait
        overlap = config.overlap_transfer_with_queue and warm_count == 0
        for pod_id in matches:
            pod = ctx.by_id[pod_id]
            if not ctx.is_candidate(pod) or pod.residency.is_warm(task_id) or not self._can_store(pod, adapter):
                continue
            load = ctx.load(pod)
            cost = self._cold_s(queues, pod, load, adapter, overlap) + self._prefill_s(ctx, pod_id, matches)
            best.offer(pod, cost, True, "cold-prefix")
        hot = warm_count > 0 and ctx.demand.inflight(task_id) >= config.hot_spread_inflight_per_pod * warm_count
        queued = (
            best.pod is not None
            and ctx.prefix.pending_prefill_s(best.pod.pod_id, ctx.now_s, config.prefill_s_per_token) > transfer_s
        )
        if config.planned_homes:
            for pod_id in ctx.placement.pods_of(task_id):
                home = ctx.by_id.get(pod_id)
                if home is None or not ctx.is_candidate(home) or home.residency.is_warm(task_id):
                    continue
                load = ctx.load(home)
                if load > bound or home.cache_full_until_s > ctx.now_s or not self._can_store(home, adapter):
                    continue
                cost = self._cold_s(queues, home, load, adapter, overlap) + self._prefill_s(ctx, pod_id, matches)
                best.offer(home, cost, True, "cold-planned")
        if best.pod is None or hot or queued or (least_warm_load is not None and least_warm_load > bound):
            found = cold_home(ctx, adapter, bound, config, self._churn)
            if found is not None:
                pod, load, reason = found
                cost = self._cold_s(queues, pod, load, adapter, overlap) + self._prefill_s(ctx, pod.pod_id, matches)
                best.offer(pod, cost, True, reason if warm_count == 0 else "hot-spread")
        # a spill pod holds none of the prefix (those were priced above): it costs at least a transfer and a full
        # prefill, so the O(pods) scan is skipped while the best candidate is cheaper than that
        if best.pod is not None and best.cost_s >= transfer_s + full_prefill_s - COST_TIE_S:
            spill = queues.shortest(adapter, self._can_store)
            if spill is not None:
                pod, load = spill
                cost = self._cold_s(queues, pod, load, adapter, overlap) + self._prefill_s(ctx, pod.pod_id, matches)
                best.offer(pod, cost, True, "spill")
        if best.pod is not None:
            return Choice(best.pod, best.reason)
        fallback = cold_anywhere(ctx, adapter)
        if fallback is not None:
            return Choice(fallback, "cold-over-bound")
        raise CachesBusy("every candidate pod's LoRA cache is full of busy adapters", self._retry_after_s)

    # -- pieces --------------------------------------------------------------------------------------
    def _cold_s(
        self, queues: QueuePrices, pod: PodView, load: int, adapter: AdapterRef, overlap: bool = False
    ) -> float:
        """The adapter's cold load (and a reload of what it evicts) plus the queue there: one after the other, or
        with ``overlap`` (no pod holds the adapter) overlapped; then its host-to-device copy."""
        transfer_s = self._config.load_s(adapter)
        residency = pod.residency
        evicts = not residency.holds(adapter.task_id) and residency.would_evict(adapter.pages)
        link_s, queue_s = self._link_s(pod, transfer_s), queues.of(pod.pod_id, load)
        waited_s = max(link_s, queue_s) if overlap else link_s + queue_s
        return waited_s + (transfer_s if evicts else 0.0) + self._copy_s(adapter)

    def _copy_s(self, adapter: AdapterRef) -> float:
        """The adapter's host-to-device copy (0 while copies are not priced)."""
        bandwidth = self._config.host_to_device_bytes_per_s
        return 0.0 if bandwidth is None else adapter.weights_bytes / bandwidth

    @staticmethod
    def _link_s(pod: PodView, transfer_s: float) -> float:
        """When weights sent now reach the pod: after the weights already on their way there (same size assumed)."""
        return (1 + sum(pod.residency.loading.values())) * transfer_s


    @staticmethod
    def _can_store(pod: PodView, adapter: AdapterRef) -> bool:
        residency = pod.residency
        return residency.holds(adapter.task_id) or residency.has_evictable_slot(adapter.pages)

    def _prefill_s(self, ctx: RoutingContext, pod_id: str, matches: dict[str, int]) -> float:
        request = ctx.request
        matched = matches.get(pod_id, 0)
        cached = 0.0
        if matched:
            cached = min(request.prompt_tokens, matched * request.blocks.block_tokens) * ctx.prefix.confidence(pod_id)
        return max(0.0, request.prompt_tokens - cached) * self._config.prefill_s_per_token

    def _choose_base(self, ctx: RoutingContext) -> Choice:
        matches = ctx.prefix_matches()
        queues = self.prices(ctx, self._config)
        costs = [
            queues.of(pod.pod_id, load) + self._prefill_s(ctx, pod.pod_id, matches)
            for pod, load in zip(ctx.pods, ctx.loads, strict=True)
        ]
        low = min(costs)
        tied = [i for i, cost in enumerate(costs) if cost <= low + COST_TIE_S]
        chosen = tied[0] if len(tied) == 1 else tied[ctx.rng.randrange(len(tied))]
        return Choice(ctx.pods[chosen], "base-priced")


class _Best:
    """The cheapest candidate so far. Ties (within ``COST_TIE_S``): warm before cold, then a pod in ``planned`` (where
    the placement wants the adapter) before one that is not, then the pod ranked first for the adapter; rendezvous
    scores are computed only for ties."""

    __slots__ = ("adapter", "cold", "cost_s", "planned", "pod", "reason", "score")

    def __init__(self, adapter: str, planned: Collection[str] = ()) -> None:
        self.adapter = adapter
        self.planned = planned
        self.pod: PodView | None = None
        self.cost_s = 0.0
        self.cold = False
        self.reason = ""
        self.score: int | None = None

    def offer(self, pod: PodView, cost_s: float, cold: bool, reason: str) -> None:
        current = self.pod
        if current is not None and cost_s >= self.cost_s - COST_TIE_S:
            if cost_s > self.cost_s + COST_TIE_S or (cold and not self.cold):
                return
            if cold == self.cold:  # a tie on cost and kind: the plan, then the adapter's rendezvous order decides
                planned, current_planned = pod.pod_id in self.planned, current.pod_id in self.planned
                if planned != current_planned:
                    if planned:
                        self.pod, self.cost_s, self.cold, self.reason, self.score = pod, cost_s, cold, reason, None
                    return
                if self.score is None:
                    self.score = rendezvous_score(self.adapter, current.pod_id)
                score = rendezvous_score(self.adapter, pod.pod_id)
                if score <= self.score:
                    return
                self.pod, self.cost_s, self.cold, self.reason, self.score = pod, cost_s, cold, reason, score
                return
        self.pod, self.cost_s, self.cold, self.reason, self.score = pod, cost_s, cold, reason, None


def build(config: RoutingConfig) -> TtftCostPolicy:
    return TtftCostPolicy(config.section(SECTION, TtftCostConfig), config.no_capacity_retry_after_s)
