"""Which KV-cache blocks each pod holds: one LRU per pod plus a fleet-wide ``hash -> pods`` index.

Three sources, from the weakest to the exact one:

1. **The router's own routing** (:meth:`PrefixIndex.record`): a request started on a pod leaves its
   blocks there. Each pod is an LRU of its KV-cache capacity in blocks (``kv_cache_tokens /
   tokens_per_block`` from the BaseModel's capacity plan, else the routing setting
   ``prefix.podKvBlocks``), and once the pod's metrics are scraped the size its engine reports
   (Triton's ``kv_cache_block_type="max"`` x ``"tokens_per"``, trtllm-serve's ``kvCacheStats{maxNumBlocks,
   tokensPerBlock}``): a plan is an estimate, the engine's own pool is not. A request's blocks are touched
   last block first, so its first blocks are the most recent and a shared prefix outlives the tails that
   hang off it, as TensorRT-LLM evicts leaves before their parents.
2. **The engine's reuse counters** (:meth:`PrefixIndex.observe_counters`): trtllm-serve's
   ``kvCacheStats{reusedBlocks, missedBlocks}`` and Triton's ``nv_trt_llm_kv_cache_block_metrics
   {kv_cache_block_type="reused"}``. Between two scrapes the index predicted ``p`` reused blocks on the
   pod and the engine reports ``r``: the pod's *confidence* moves halfway to ``min(1, r / p)``, and the
   routing cost counts only that share of the predicted cached tokens. Other replicas' requests make
   ``r`` larger, never the confidence above 1. Counters that go down mean the engine restarted: the
   pod's blocks are forgotten.
3. **KV-cache events** (:mod:`~trtfleet_router.routing.kvevents`): ``stored`` and ``removed`` blocks,
   exact (:meth:`store` / :meth:`remove`).

Memory is bounded by the sum of the pods' capacities (one OrderedDict entry per block and pod, one int
per distinct block in the index). :meth:`match` is O(blocks of the request): the index maps a block hash
to a bit mask of pod slots, and the walk stops at the first block no remaining pod holds.
"""

from __future__ import annotations

import math
from collections import OrderedDict
from collections.abc import Iterable, Mapping, Sequence

from trtfleet_router.routing.types import PodMetrics

PrefillKey = int | tuple[str, int]
"""A request whose prefill waits on a pod: a local ticket id, or ``(origin replica, its ticket)`` for another
replica's request (booked from its peer events)."""

CONFIDENCE_STEP = 0.5  # how far one scrape moves a pod's confidence towards the observed reuse share


class PodBlocks:
    """The blocks one pod is believed to hold, least recently used first."""

    __slots__ = (
        "blocks",
        "capacity_blocks",
        "confidence",
        "evicted_total",
        "head_since_s",
        "head_tokens",
        "last_missed",
        "last_reused",
        "pending_prefill_tokens",
        "predicted_reused",
        "queue",
        "slot",
    )

    def __init__(self, slot: int, capacity_blocks: int) -> None:
        self.slot = slot
        self.capacity_blocks = capacity_blocks
        self.blocks: OrderedDict[int, None] = OrderedDict()
        self.confidence = 1.0
        self.predicted_reused = 0  # blocks the index predicted reused since the last counter scrape
        self.last_reused: int | None = None
        self.last_missed: int | None = None
        self.evicted_total = 0
        self.pending_prefill_tokens = 0  # uncached prompt tokens of requests started here, first token not yet
        self.queue: dict[PrefillKey, int] = {}  # those requests, oldest first -> their uncached tokens
        self.head_since_s = math.inf  # since when the oldest of them has had the pod to itself (inf: unknown)
        self.head_tokens = 0  # the oldest one's uncached tokens


def pending_prefill_of(pod: PodBlocks, now_s: float, s_per_token: float) -> float:
    """A pod's pending prefill in seconds at ``now_s``, less the head request's progress (see
    :meth:`PrefixIndex.pending_prefill_s`; the queue prices of every candidate call it on :attr:`PrefixIndex.pods`
    directly)."""
    pending_s = pod.pending_prefill_tokens * s_per_token
    elapsed_s = now_s - pod.head_since_s
    if elapsed_s <= 0.0:  # also for an unknown start (inf)
        return pending_s
    head_s = pod.head_tokens * s_per_token
    return pending_s - (elapsed_s if elapsed_s < head_s else head_s)


class PrefixIndex:
    """Per-pod block LRUs and the fleet-wide ``block hash -> pods`` bit masks."""

    __slots__ = ("_default_capacity", "_free_slots", "_holders", "_pending", "_pods")

    def __init__(self, default_capacity_blocks: int) -> None:
        if default_capacity_blocks < 0:
            raise ValueError("a pod's KV-cache capacity in blocks cannot be negative")
        self._default_capacity = default_capacity_blocks
        self._pods: dict[str, PodBlocks] = {}
        self._holders: dict[int, int] = {}  # block hash -> bit mask of pod slots
        self._free_slots: list[int] = []
        self._pending: dict[PrefillKey, PodBlocks] = {}  # request -> the pod whose queue holds it

    # -- pods --------------------------------------------------------------------------------------
    def reset_pod(self, pod_id: str, capacity_blocks: int = 0) -> None:
        """A new or restarted pod: empty, ``capacity_blocks`` (0: the default)."""
        self.drop_pod(pod_id)
        slot = self._free_slots.pop() if self._free_slots else len(self._pods)
        self._pods[pod_id] = PodBlocks(slot, capacity_blocks or self._default_capacity)

    def set_capacity(self, pod_id: str, capacity_blocks: int) -> None:
        """The pod's KV-cache capacity as its engine reports it (more exact than a plan or the default); the
        least recently used blocks beyond it go. Ignored for unknown pods, for a size below 1, and for a pod whose
        index is off (capacity 0: routing setting ``prefix.podKvBlocks`` 0 and no capacity plan)."""
        pod = self._pods.get(pod_id)
        if pod is None or capacity_blocks < 1 or pod.capacity_blocks == 0 or pod.capacity_blocks == capacity_blocks:
            return
        pod.capacity_blocks = capacity_blocks
        self._evict_over(pod)

    def drop_pod(self, pod_id: str) -> None:
        pod = self._pods.pop(pod_id, None)
        if pod is None:
            return
        self._clear(pod)
        self._free_slots.append(pod.slot)

    def pod(self, pod_id: str) -> PodBlocks | None:
        return self._pods.get(pod_id)

    @property
    def pods(self) -> Mapping[str, PodBlocks]:
        """Every pod's blocks and prefill queue, by pod id (read them; change them through the methods)."""
        return self._pods

    def _clear(self, pod: PodBlocks) -> None:
        keep = ~(1 << pod.slot)
        holders = self._holders
        for block in pod.blocks:
            mask = holders[block] & keep
            if mask:
                holders[block] = mask
            else:
                del holders[block]
        pod.blocks.clear()

    # -- the decision's question ---------------------------------------------------------------------
    def match(self, hashes: Sequence[int]) -> dict[str, int]:
        """Pods holding a prefix of ``hashes``: pod -> leading blocks held (pods holding none are absent)."""
        if not hashes:
            return {}
        holders = self._holders
        alive = holders.get(hashes[0], 0)
        if not alive:
            return {}
        ended: dict[int, int] = {}  # slot -> blocks matched
        index = 1
        for index in range(1, len(hashes)):
            mask = holders.get(hashes[index], 0) & alive
            if mask != alive:
                gone = alive & ~mask
                while gone:
                    low = gone & -gone
                    ended[low.bit_length() - 1] = index
                    gone ^= low
                alive = mask
                if not alive:
                    break
        else:
            index = len(hashes)
        while alive:
            low = alive & -alive
            ended[low.bit_length() - 1] = index
            alive ^= low
        return {pod_id: ended[pod.slot] for pod_id, pod in self._pods.items() if pod.slot in ended}

    def confidence(self, pod_id: str) -> float:
        pod = self._pods.get(pod_id)
        return pod.confidence if pod is not None else 0.0

    # -- sources -------------------------------------------------------------------------------------
    def record(self, pod_id: str, hashes: Sequence[int], matched_blocks: int = 0) -> None:
        """A request with blocks ``hashes`` started on the pod; ``matched_blocks`` were predicted reused."""
        pod = self._pods.get(pod_id)
        if pod is None or not hashes:
            return
        pod.predicted_reused += matched_blocks
        self._touch(pod, reversed(hashes))

    def store(self, pod_id: str, hashes: Iterable[int]) -> None:
        """The pod stored these blocks (a KV-cache event), in the order given."""
        pod = self._pods.get(pod_id)
        if pod is not None:
            self._touch(pod, hashes)

    def remove(self, pod_id: str, hashes: Iterable[int]) -> None:
        """The pod evicted these blocks (a KV-cache event)."""
        pod = self._pods.get(pod_id)
        if pod is None:
            return
        keep = ~(1 << pod.slot)
        holders = self._holders
        for block in hashes:
            if block in pod.blocks:
                del pod.blocks[block]
                mask = holders[block] & keep
                if mask:
                    holders[block] = mask
                else:
                    del holders[block]

    def forget(self, pod_id: str) -> None:
        """The pod's cache was emptied (engine restart, or a ``created`` event): hold nothing."""
        pod = self._pods.get(pod_id)
        if pod is not None:
            self._clear(pod)
            pod.predicted_reused = 0

    def observe_metrics(self, pod_id: str, snapshot: PodMetrics) -> None:
        """A scrape of the pod: its engine's KV-cache size (when exported) and its reused / missed counters."""
        if snapshot.kv_capacity_blocks is not None:
            self.set_capacity(pod_id, snapshot.kv_capacity_blocks)
        if snapshot.kv_reused_blocks_total is not None:  # Triton exports no missed count: 0
            self.observe_counters(pod_id, snapshot.kv_reused_blocks_total, snapshot.kv_missed_blocks_total or 0)

    def observe_counters(self, pod_id: str, reused_total: int, missed_total: int) -> None:
        """The engine's cumulative reused / missed block counters, as scraped."""
        pod = self._pods.get(pod_id)
        if pod is None:
            return
        last_reused, last_missed = pod.last_reused, pod.last_missed
        pod.last_reused, pod.last_missed = reused_total, missed_total
        if last_reused is None or last_missed is None:
            pod.predicted_reused = 0
            return
        if reused_total < last_reused or missed_total < last_missed:
            self.forget(pod_id)  # counters went back: the engine restarted with an empty cache
            return
        predicted, pod.predicted_reused = pod.predicted_reused, 0
        if predicted <= 0:
            return
        observed_share = min(1.0, (reused_total - last_reused) / predicted)
        pod.confidence += CONFIDENCE_STEP * (observed_share - pod.confidence)

    def _touch(self, pod: PodBlocks, hashes: Iterable[int]) -> None:
        blocks = pod.blocks
        holders = self._holders
        bit = 1 << pod.slot
        for block in hashes:
            if block in blocks:
                blocks.move_to_end(block)
            else:
                blocks[block] = None
                holders[block] = holders.get(block, 0) | bit
        if len(blocks) > pod.capacity_blocks:
            self._evict_over(pod)

    def _evict_over(self, pod: PodBlocks) -> None:
        """Drop the pod's least recently used blocks beyond its capacity."""
        blocks, holders, keep = pod.blocks, self._holders, ~(1 << pod.slot)
        while len(blocks) > pod.capacity_blocks:
            old, _ = blocks.popitem(last=False)
            pod.evicted_total += 1
            mask = holders[old] & keep
            if mask:
                holders[old] = mask
            else:
                del holders[old]

    # -- prefill work in flight (the queue a long prompt adds to a pod) -------------------------------
    def book(
        self,
        ticket_id: PrefillKey,
        pod_id: str,
        hashes: Sequence[int],
        prompt_tokens: int,
        block_tokens: int,
        now_s: float | None = None,
    ) -> None:
        """A request started on the pod: its blocks are there from now on, and its uncached prompt tokens are
        prefill work there until its first token (:meth:`prefill_done`)."""
        matched = self.match(hashes).get(pod_id, 0) if hashes else 0
        if hashes:
            self.record(pod_id, hashes, matched)
        self.prefill_started(ticket_id, pod_id, prompt_tokens - matched * block_tokens, now_s)

    def prefill_started(self, ticket_id: PrefillKey, pod_id: str, tokens: int, now_s: float | None = None) -> None:
        """A request whose prefill computes ``tokens`` uncached tokens was started on the pod at ``now_s`` (None:
        unknown, e.g. another replica's request copied from a snapshot)."""
        pod = self._pods.get(pod_id)
        if pod is not None and tokens > 0 and ticket_id not in self._pending:  # booked once (snapshot, then event)
            if not pod.queue:
                pod.head_since_s = math.inf if now_s is None else now_s
                pod.head_tokens = tokens
            pod.pending_prefill_tokens += tokens
            pod.queue[ticket_id] = tokens
            self._pending[ticket_id] = pod

    def prefill_done(self, ticket_id: PrefillKey, now_s: float | None = None) -> bool:
        """Its first token came back (or it ended) at ``now_s``: its prefill no longer waits on the pod.
        Idempotent; True when it was still pending."""
        pod = self._pending.pop(ticket_id, None)
        if pod is None:
            return False
        head = next(iter(pod.queue), None)
        pod.pending_prefill_tokens -= pod.queue.pop(ticket_id)
        if head == ticket_id:  # the next one has the pod from now on
            pod.head_since_s = math.inf if now_s is None else now_s
            pod.head_tokens = next(iter(pod.queue.values()), 0)
        return True

    def pending_prefill_tokens(self, pod_id: str) -> int:
        pod = self._pods.get(pod_id)
        return pod.pending_prefill_tokens if pod is not None else 0

    def pending_prefill_s(self, pod_id: str, now_s: float, s_per_token: float) -> float:
        """The prefill still to compute on the pod at ``now_s``, in seconds: every pending request's uncached
        tokens at ``s_per_token``, less what the oldest one has computed since it got the pod (at most its own
        prefill; nothing while that start is unknown). Without that credit a pod one step from its first token
        looks as busy as one that has just begun a long prompt."""
        pod = self._pods.get(pod_id)
        if pod is None or not pod.pending_prefill_tokens:
            return 0.0
        return pending_prefill_of(pod, now_s, s_per_token)

    def pending_tokens(self, ticket_id: PrefillKey) -> int:
        """The uncached tokens of a request whose prefill still waits (0: done, or never booked)."""
        pod = self._pending.get(ticket_id)
        return pod.queue[ticket_id] if pod is not None else 0

    # -- a replica's snapshot ------------------------------------------------------------------------
    def recent_blocks(self, pod_id: str, limit: int) -> list[int]:
        """The pod's ``limit`` most recently used blocks, least recent first (the order :meth:`store` keeps)."""
        pod = self._pods.get(pod_id)
        if pod is None or limit <= 0:
            return []
        blocks = pod.blocks
        skip = len(blocks) - limit
        return [block for index, block in enumerate(blocks) if index >= skip]

    def set_confidence(self, pod_id: str, confidence: float) -> None:
        pod = self._pods.get(pod_id)
        if pod is not None:
            pod.confidence = min(1.0, max(0.0, confidence))

    # -- introspection -------------------------------------------------------------------------------
    def blocks_held(self, pod_id: str) -> int:
        pod = self._pods.get(pod_id)
        return len(pod.blocks) if pod is not None else 0

    def capacity(self, pod_id: str) -> int:
        pod = self._pods.get(pod_id)
        return pod.capacity_blocks if pod is not None else 0

    def check_invariants(self) -> None:
        seen: dict[int, int] = {}
        for pod in self._pods.values():
            if len(pod.blocks) > pod.capacity_blocks:
                raise AssertionError(f"slot {pod.slot}: {len(pod.blocks)} blocks over {pod.capacity_blocks}")
            if pod.pending_prefill_tokens != sum(pod.queue.values()) or (
                pod.queue and pod.head_tokens != next(iter(pod.queue.values()))
            ):
                raise AssertionError(f"slot {pod.slot}: pending prefill disagrees with its queue")
            for block in pod.blocks:
                seen[block] = seen.get(block, 0) | (1 << pod.slot)
        if seen != self._holders:
            raise AssertionError("the hash -> pods index disagrees with the pods' blocks")

