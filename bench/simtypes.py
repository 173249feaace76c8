"""The simulator's inputs and outputs (:mod:`bench.simulate`) and its model of the router's weight store.

* :class:`FleetSpec`: pods, their step-time model, links, the router's weight store, and the router
  deployment: ``router_replicas`` processes behind a Service (each request goes to one at random) and
  ``router_view``: ``shadow`` (each replica keeps its own view of the pods' LoRA caches, fed only by its
  own requests: the router before a shared view) or ``shared`` (one view fed by every request: exactly
  the single router, whatever the replica count; with ``router_view_delay_s`` > 0 each replica keeps its
  own view and gets the others' events that much later, :mod:`bench.simpeers`);
* :class:`RequestRecord` (one per trace request) and :class:`SimResult` (one per run);
* :class:`WeightStoreModel`: the router's weight store as a latency model.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass, field

from trtfleet_router.routing.types import AdapterRef

from bench.podsim import PodSpec, StepTimeModel

RUNTIMES = ("tensorrtllm", "pytorch")
ROUTER_VIEWS = ("shared", "shadow")


@dataclass(frozen=True, slots=True)
class FleetSpec:
    pods: int
    pod: PodSpec
    model: StepTimeModel
    adapter_pages: int
    adapter_weights_bytes: int
    link_bytes_per_s: float = 1.25e9  # 10 GbE pod network
    one_way_latency_s: float = 0.25e-3
    router_store_bytes: int = 2 * 1024**3  # trtfleet_router.weights.DEFAULT_CAPACITY_BYTES
    artifact_fetch_latency_s: float = 0.05
    artifact_bytes_per_s: float = 0.5e9
    scrape_interval_s: float = 1.0
    max_attempts: int = 3
    add_decision_time: bool = True
    runtime: str = "tensorrtllm"  # or "pytorch": trtllm-serve pods read cold adapters themselves
    pod_read_bytes_per_s: float = 5e8  # runtime pytorch (the trtfleet policy's podReadBytesPerS default)
    router_replicas: int = 1  # router processes, each request sent to one at random (a Kubernetes Service)
    router_view: str = "shared"  # "shadow": each replica its own view of the pods; "shared": one view for all
    router_view_delay_s: float = 0.0  # shared view: a replica sees the others' events this much later (0: at once)

    def __post_init__(self) -> None:
        if self.runtime not in RUNTIMES:
            raise ValueError(f"runtime {self.runtime!r} is not one of {', '.join(RUNTIMES)}")
        if self.router_view not in ROUTER_VIEWS:
            raise ValueError(f"router view {self.router_view!r} is not one of {', '.join(ROUTER_VIEWS)}")
        if self.router_view_delay_s < 0:
            raise ValueError(f"router view delay must be >= 0 s, got {self.router_view_delay_s}")
        if self.router_replicas < 1:
            raise ValueError(f"router replicas must be at least 1, got {self.router_replicas}")


@dataclass(slots=True)
class RequestRecord:
    key: int
    arrival_s: float
    adapter: str
    attempts: int = 0
    hit: bool = False
    misses: int = 0
    loads: int = 0
    weights_bytes: int = 0
    ttft_s: float | None = None
    e2e_s: float | None = None
    output_tokens: int = 0
    error: str | None = None
    excluded: set[str] = field(default_factory=set)
    waited_s: float = 0.0  # time spent waiting in the router for LoRA cache capacity
    reused_blocks: int = 0  # KV blocks the serving pod had cached at admission (bench/podkv.py)
    background: bool = False  # a prefetch the placement sent (not a client's request)


@dataclass
class SimResult:
    policy: str
    records: list[RequestRecord]
    decision_times_s: list[float]
    pod_loads: int
    pod_busy_s: list[float]
    sim_end_s: float
    fleet_counters: dict[str, int]
    wall_s: float
    admitted_adapters: list[str]  # in the order pods admitted them (for the per-run bound)


def adapter_refs(
    names: Sequence[str], pages: int, weights_bytes: int, read_by_pod: bool = False
) -> dict[str, AdapterRef]:
    """One AdapterRef per adapter, task ids 1.. in name order (as the operator would allocate them)."""
    return {
        name: AdapterRef(name=name, task_id=index + 1, weights_bytes=weights_bytes, pages=pages,
                         read_by_pod=read_by_pod)
        for index, name in enumerate(sorted(names))
    }


class WeightStoreModel:
    """The router's weight store as a latency model: byte-bounded LRU, coalesced fetches."""

    def __init__(self, capacity_bytes: int, latency_s: float, bytes_per_s: float) -> None:
        self._capacity = capacity_bytes
        self._latency_s = latency_s
        self._bytes_per_s = bytes_per_s
        self._ready_at: OrderedDict[str, tuple[float, int]] = OrderedDict()
        self._used = 0
        self.fetches = 0

    def ready_at(self, adapter: str, size: int, now_s: float) -> float:
        entry = self._ready_at.get(adapter)
        if entry is not None:
            self._ready_at.move_to_end(adapter)
            return max(entry[0], now_s)
        self.fetches += 1
        ready = now_s + self._latency_s + size / self._bytes_per_s
        self._ready_at[adapter] = (ready, size)
        self._used += size
        while self._used > self._capacity and len(self._ready_at) > 1:
            _name, (_ready, old) = self._ready_at.popitem(last=False)
            self._used -= old
        return ready
