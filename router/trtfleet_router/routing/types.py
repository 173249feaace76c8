"""Data the routing core takes and gives: requests, pods, decisions, tickets, snapshots.

All hot-path types are frozen, slotted dataclasses. Times are seconds on the clock the
:class:`~trtfleet_router.routing.fleet.Fleet` was given (``now``), never wall time of our own.

Errors (one tree, all raised by the routing core; the server maps them to HTTP/gRPC in one place):

* :class:`RoutingError` - the root.
* :class:`NoCapacity` - no pod can take the request now (none ready, all excluded, or every LoRA
  cache full of busy adapters): answer 503 with ``Retry-After: retry_after_s``.

  * :class:`CachesBusy` - the subclass for "every candidate's LoRA cache is full of adapters that
    requests still use": a slot frees when one of them ends, so the shell holds the request (bounded
    FIFO, bounded wait) and routes it again when a request of the fleet finishes, then answers 503.
  * :class:`NoReadyPod` - the subclass for "the base model has no ready pod at all": the shell holds
    the request (bounded, see ``holdWaitS``) until discovery reports a ready pod, then 503.
* :class:`AdapterTooLarge` - the adapter needs more cache pages than any pod's host tier has:
  a configuration error, retrying never helps (answer 500/400, not 503).
* :class:`UnknownPod` - ``start`` for a pod that is no longer in the fleet (removed between
  ``route`` and ``start``): route again.
* :class:`RoutingConfigError` - the policy configuration is invalid (unknown policy name):
  raised at start-up.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

from trtfleet_router.routing.prefix import NO_BLOCKS, PromptBlocks


class RoutingError(Exception):
    """Root of the routing core's errors."""


class NoCapacity(RoutingError):
    """No pod can take the request now; retry after ``retry_after_s``."""

    def __init__(self, reason: str, retry_after_s: float) -> None:
        super().__init__(f"no pod can take the request: {reason}")
        self.reason = reason
        self.retry_after_s = retry_after_s


class NoReadyPod(NoCapacity):
    """The base model has no ready pod at all (scaled to zero, or its pods starting): the shell may hold
    the request until one is ready."""


class CachesBusy(NoCapacity):
    """Every candidate pod's LoRA cache is full of busy adapters: capacity frees when a request ends."""


class AdapterTooLarge(RoutingError):
    """The adapter needs more LoRA cache pages than any pod's host tier holds."""

    def __init__(self, adapter: str, pages: int, largest_tier_pages: int) -> None:
        super().__init__(
            f"adapter {adapter!r} needs {pages} LoRA cache pages but the largest pod cache has "
            f"{largest_tier_pages}: raise lora.cache.hostMemoryBytes or lower the adapter rank"
        )
        self.adapter = adapter
        self.pages = pages


class UnknownPod(RoutingError):
    """The pod a decision named is no longer part of the fleet."""

    def __init__(self, pod: str) -> None:
        super().__init__(f"pod {pod!r} is not part of the fleet (removed or restarted): route again")
        self.pod = pod


class RoutingConfigError(RoutingError):
    """The routing configuration is invalid (e.g. an unknown policy name)."""


@dataclass(frozen=True, slots=True)
class AdapterRef:
    """A LoRA adapter as the router knows it (from the Adapter CR's status)."""

    name: str  # served name; the stable key for hashing (task ids differ per BaseModel)
    task_id: int  # TRT-LLM lora_task_id
    weights_bytes: int  # size of lora_weights as sent on the wire
    pages: int  # host-tier cache pages the adapter takes (trtfleet.loracache geometry)
    min_pods: int = 0  # warm.minPods: pods kept warm by prewarming
    read_by_pod: bool = False  # runtime pytorch: a cold pod reads the adapter from its volume (nothing sent)


@dataclass(frozen=True, slots=True)
class RouteRequest:
    model: str  # base model name
    adapter: AdapterRef | None  # None: the base model alone
    prompt_tokens: int
    max_tokens: int
    request_id: str = ""
    exclude_pods: frozenset[str] = frozenset()  # pods already tried for this request
    blocks: PromptBlocks = NO_BLOCKS  # the prompt's KV-cache blocks, keyed by the adapter (routing/prefix.py)
    # a batch line: counted as a pod's load when batch lines are routed, not when interactive requests are
    # (the dispatcher keeps batch lines below each pod's batch slots, so they leave interactive room)
    background: bool = False
    # a batch line's slots per pod: placed where its adapter is warm, one adapter per pod (routing/batchplace.py)
    batch_slots: int | None = None
    # pods kept free of batch lines while interactive requests come, and the requests in flight up to which
    # a reserved pod takes interactive ones first (routing/reserve.py); 0: no reserve
    reserve_pods: int = 0
    reserve_room: int = 0


@dataclass(frozen=True, slots=True)
class Decision:
    pod: str
    send_weights: bool  # True: cold on this pod, attach lora_weights + lora_config
    warm: bool  # the adapter is resident on the pod (always True without an adapter)
    policy: str
    reason: str  # short machine-friendly tag, e.g. "warm", "cold-home", "hot-spread"
    # warm, but its weights are still travelling with an earlier request that the pod has not admitted
    # yet: sent id-only now, this request may overtake them and miss (hold it for that admission, or
    # retry on the miss).
    loading: bool = False


@dataclass(frozen=True, slots=True)
class PodInfo:
    pod_id: str
    address: str  # host:port of the pod's Triton gRPC endpoint
    # Identity of the pod: a new value resets its shadow cache. The Kubernetes pod uid survives
    # container restarts, which also empty the cache; those show as not ready -> ready, which resets
    # the shadow too (Fleet.set_pods), or as Triton's request counters going back (Fleet.reset_pod from the
    # metrics scrape). A restart that shows neither way is left to misses.
    uid: str
    host_pages: int  # host-tier LoRA cache pages (BaseModel status.capacity.loraHostPages)
    device_pages: int  # device-tier pages (status.capacity.loraDevicePages)
    ready: bool = True
    kv_blocks: int = 0  # KV-cache capacity in blocks (capacity plan); 0: the routing setting prefix.podKvBlocks


@dataclass(frozen=True, slots=True)
class PodMetrics:
    """Scraped from the pod's Triton metrics (nv_trt_llm_request_metrics, kv cache blocks)."""

    active_requests: int
    waiting_requests: int
    kv_cache_used_fraction: float | None = None  # 0..1; None when the pod does not export it
    kv_reused_blocks_total: int | None = None  # cumulative KV blocks reused (engine counter), None: not exported
    kv_missed_blocks_total: int | None = None  # cumulative KV blocks missed (computed afresh)
    kv_capacity_blocks: int | None = None  # the engine's KV-cache size in the router's blocks; None: not exported
    tokens_per_step: float | None = None  # speculative decoding: tokens a step gives a request; None: 1 (none)


class Outcome(StrEnum):
    OK = "ok"
    MISS = "miss"  # the pod said "LoRA task <id> not found in cache": it does not hold the adapter
    CACHE_FULL = "cache_full"  # "Cache is full. There are no done tasks to evict": back-pressure
    FAILED = "failed"  # any other pod error, or the pod was unreachable


@dataclass(frozen=True, slots=True)
class Ticket:
    """Bookkeeping for one request sent to a pod; hand it back to ``Fleet.finish`` exactly once."""

    ticket_id: int
    pod: str
    pod_uid: str  # finish on a restarted pod releases nothing
    task_id: int | None
    sent_weights: bool
    pinned: bool  # the adapter was acquired in the pod's shadow cache (False if it could not be stored)
    started_at_s: float
    loads_weights: bool = False  # its weights are in the shadow as loading until confirm/finish
    background: bool = False  # a batch line (RouteRequest.background)


@dataclass(frozen=True, slots=True)
class PodSnapshot:
    pod_id: str
    address: str
    uid: str
    ready: bool
    inflight: int  # this router's requests in flight on the pod
    waiting_requests: int | None  # scraped; None when stale or never scraped
    kv_cache_used_fraction: float | None
    resident_task_ids: tuple[int, ...]  # shadow host cache, least recently used idle first, then busy
    host_pages_used: int
    host_pages: int
    cache_full_until_s: float  # cold placement avoids the pod until then
    warm_routes_total: int  # requests started warm (no weights sent)
    cold_loads_total: int  # requests started with weights
    misses_total: int  # MISS outcomes (the shadow was wrong)
    cache_full_total: int
    failures_total: int
    evictions_total: int  # adapters the shadow evicted to make room (predicted evictions)
    kv_blocks_held: int = 0  # KV-cache blocks the prefix index believes the pod holds
    kv_blocks_capacity: int = 0  # the pod's size in the prefix index (engine-reported, planned or the default)
    kv_prefix_confidence: float = 1.0  # share of predicted block reuse the engine's counters confirmed
    batch_lines: int = 0  # of ``inflight``: this router's batch lines
    remote_inflight: int = 0  # the other router replicas' requests in flight on the pod (their events)
    remote_batch_lines: int = 0  # of ``remote_inflight``: their batch lines (events of format version 2)


@dataclass(frozen=True, slots=True)
class FleetSnapshot:
    model: str
    policy: str
    at_s: float
    pods: tuple[PodSnapshot, ...]
    open_tickets: int

    @property
    def warm_routes_total(self) -> int:
        return sum(p.warm_routes_total for p in self.pods)

    @property
    def cold_loads_total(self) -> int:
        return sum(p.cold_loads_total for p in self.pods)

    @property
    def misses_total(self) -> int:
        return sum(p.misses_total for p in self.pods)
