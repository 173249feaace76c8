"""Fleet-level adapter placement over both LoRA tiers: which pods should hold each adapter (pure).

TRT-LLM gives every pod two LRU tiers: the host tier (pinned CPU pages, ``max_cpu_loras`` / the host cache
bytes) decides hits and misses, the device tier only what must be copied over PCIe before a step. A request
that finds its adapter in the host tier pays a host-to-device copy (milliseconds); one that finds it nowhere
pays a transfer over the pod network or a read of the adapter's volume, tens of milliseconds or more. The
host tier is cheap (a node's memory is terabytes), so :func:`plan_placement` decides, from the demand
forecast, where every adapter should have host copies so that almost every request lands on one:

1. **Copies per adapter** (:func:`copy_counts`): ``ceil(rate / copy_rate_per_s)`` host copies, at least
   ``min_host_copies`` (every registered adapter, so even one never asked for yet is a copy, not a transfer,
   away), at most ``max_host_copies`` and the pod count. When the fleet's host pages (``host_fill`` of each
   pod's) cannot hold them all, copies go first to the adapters with the most demand per copy; the rest
   keep fewer (and the least wanted none: they load on demand). A count shrinks by at most a quarter of its
   copies per plan, so a lull does not drop copies a returning burst needs.
2. **Where** (:func:`plan_placement`): first every adapter keeps the pods it had in the previous plan, as
   far as their pages allow (stickiness: no adapter loses a copy to another's new one); then, hottest adapter
   first, each takes further pods along its rendezvous (HRW) ranking, skipping a pod whose planned pages are
   full or whose planned demand would exceed ``(1 + load_slack)`` x the fleet mean plus this copy's share
   (bounded loads): hot adapters spread over many pods, none of which ends up with more than its share of the
   hot ones. The same inputs give every router replica the same plan.
3. **Bounded moves**: a copy that is neither in the previous plan nor already resident is a *move* (it will
   cost a transfer); at most ``max_moves`` per plan, spent on the hottest adapters first. The rest are
   ``deferred`` to the next plan, so demand shifts re-place the fleet smoothly.
4. **Device tier**: on each pod, the planned adapters with the most demand per copy, as many as its device
   pages hold: what the pod should keep on its GPU. TRT-LLM has no API to pin them; routing keeps them there
   by sending their traffic where they are planned (the router prices the copy it saves).

Cost: O(adapters x log adapters + copies x ranking walk); the rankings come from the fleet's cache.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

from pydantic import Field

from trtfleet.api.common import ApiModel
from trtfleet_router.routing.forecast import ForecastConfig
from trtfleet_router.routing.prefetch import PrefetchConfig

SHRINK_PER_PLAN = 0.25
"""A copy count falls by at most this share of its copies per plan (at least one copy)."""


class PlacementConfig(ApiModel):
    """How the fleet places adapters in its pods' host tiers (``placement:`` in the routing file)."""

    enabled: bool = Field(
        default=False,
        description="Plan host copies of every adapter from its demand forecast and prefetch them into the pods' "
        "host tiers in idle capacity. Off: adapters load only when requests need them.",
    )
    interval_s: float = Field(default=5.0, gt=0, description="How often the plan is recomputed.")
    min_host_copies: int = Field(
        default=2,
        ge=0,
        description="Host copies of every registered adapter, asked for or not: a request for a rarely used "
        "adapter then costs a host-to-device copy on one of these pods, never a transfer. 2 leaves a choice "
        "when one of them is busy or gone.",
    )
    max_host_copies: int = Field(
        default=0, ge=0, description="Most host copies of one adapter (0: as many as there are pods)."
    )
    copy_rate_per_s: float = Field(
        default=2.0,
        gt=0,
        description="An adapter gets one host copy per this many predicted requests per second (hot adapters "
        "spread: 100 requests/s over 50 pods). Lower spreads more and moves more bytes.",
    )
    host_fill: float = Field(
        default=0.8,
        gt=0,
        le=1,
        description="Share of each pod's host pages the plan may fill; the rest stays for cold loads the plan "
        "did not foresee (the engine's LRU manages both).",
    )
    load_slack: float = Field(
        default=0.25,
        ge=0,
        description="A pod takes another copy while its planned demand stays below (1 + slack) x the fleet's "
        "mean per pod plus that copy's share (bounded loads, as consistent hashing with bounded loads does "
        "for requests).",
    )
    max_moves: int = Field(
        default=2048,
        ge=0,
        description="Most new host copies (transfers) one plan may ask for; the rest wait for the next plan. "
        "2,048 rank-8 Llama-3-8B adapters (40 MB) are 86 GB per interval: about what 64 pods' prefetch budgets "
        "(a quarter of 10 GbE each) carry in 5 s. Size it with the fleet.",
    )
    forecast: ForecastConfig = Field(
        default_factory=ForecastConfig, description="The demand forecast the plan is made from."
    )
    prefetch: PrefetchConfig = Field(
        default_factory=PrefetchConfig, description="How planned copies are pushed without competing with traffic."
    )


@dataclass(frozen=True, slots=True)
class PodTiers:
    """A ready pod's tier sizes in pages."""

    pod_id: str
    host_pages: int
    device_pages: int


@dataclass(frozen=True, slots=True)
class AdapterWant:
    """An adapter to place and its predicted demand."""

    name: str  # the rendezvous key (every replica ranks pods the same way for it)
    task_id: int
    pages: int
    rate_per_s: float


@dataclass(frozen=True)
class PlacementPlan:
    """Where each adapter should be held. ``host``: task id -> pods (best first); ``device``: pod -> task ids it
    should keep on its GPU; ``moves``: copies new in this plan (not planned before, not resident); ``deferred``:
    copies wanted but over the move budget."""

    host: Mapping[int, tuple[str, ...]]
    device: Mapping[str, frozenset[int]]
    moves: int = 0
    deferred: int = 0
    pod_rate_per_s: Mapping[str, float] = field(default_factory=dict)
    pod_pages: Mapping[str, int] = field(default_factory=dict)

    def pods_of(self, task_id: int) -> tuple[str, ...]:
        return self.host.get(task_id, ())

    def copies(self) -> int:
        return sum(len(pods) for pods in self.host.values())


EMPTY_PLAN = PlacementPlan(host={}, device={})


def copy_counts(
    wants: Sequence[AdapterWant],
    pods: Sequence[PodTiers],
    config: PlacementConfig,
    previous: Mapping[int, int] | None = None,
) -> dict[int, int]:
    """Host copies per task id (see the module docstring, step 1). ``previous``: last plan's counts."""
    if not pods:
        return {}
    limit = len(pods) if config.max_host_copies == 0 else min(config.max_host_copies, len(pods))
    desired: dict[int, int] = {}
    for want in wants:
        count = min(limit, max(config.min_host_copies, math.ceil(want.rate_per_s / config.copy_rate_per_s)))
        old = (previous or {}).get(want.task_id, 0)
        if count < old:  # shrink smoothly
            count = max(count, old - max(1, math.floor(old * SHRINK_PER_PLAN)))
        desired[want.task_id] = count
    budget = sum(math.floor(pod.host_pages * config.host_fill) for pod in pods)
    # grant copies one at a time, the next always to the adapter with the most demand per granted copy:
    # when the pages do not suffice the least wanted copies are the ones left out
    pages_of = {want.task_id: max(1, want.pages) for want in wants}
    if sum(count * pages_of[task] for task, count in desired.items()) <= budget:
        return _positive(desired)
    granted = dict.fromkeys(desired, 0)
    rate_of = {want.task_id: want.rate_per_s for want in wants}
    order = sorted(wants, key=lambda w: (-w.rate_per_s, w.name))
    # first copies by demand (ties by name), then further copies by demand per copy
    for want in order:
        if desired[want.task_id] and pages_of[want.task_id] <= budget:
            granted[want.task_id] = 1
            budget -= pages_of[want.task_id]
    extra = sorted(
        ((rate_of[task] / (n + 1), task, n + 1) for task, count in desired.items() for n in range(1, count)),
        key=lambda item: (-item[0], item[1], item[2]),
    )
    for _value, task, _n in extra:
        if granted[task] and pages_of[task] <= budget:
            granted[task] += 1
            budget -= pages_of[task]
    return {task: count for task, count in granted.items() if count}


def _positive(counts: Mapping[int, int]) -> dict[int, int]:
    return {task: count for task, count in counts.items() if count > 0}


def plan_placement(
    wants: Sequence[AdapterWant],
    pods: Sequence[PodTiers],
    config: PlacementConfig,
    rank: Callable[[str], Sequence[str]],
    *,
    previous: PlacementPlan = EMPTY_PLAN,
    holds: Callable[[str, int], bool] | None = None,
) -> PlacementPlan:
    """Where every adapter of ``wants`` should have host copies (module docstring, steps 2-4).

    ``rank(name)``: the fleet's pods in the adapter's rendezvous order (pods not in ``pods`` are skipped);
    ``previous``: the last plan (its placements are kept where they still fit); ``holds(pod, task id)``:
    whether the pod holds the adapter now (a copy there is not a move).
    """
    tiers = {pod.pod_id: pod for pod in pods}
    counts = copy_counts(wants, pods, config, {task: len(p) for task, p in previous.host.items()})
    total_rate = sum(want.rate_per_s for want in wants if want.task_id in counts)
    mean_rate = total_rate / len(pods) if pods else 0.0
    page_cap = {pod.pod_id: math.floor(pod.host_pages * config.host_fill) for pod in pods}
    pages_used = dict.fromkeys(tiers, 0)
    rate_used = dict.fromkeys(tiers, 0.0)
    holding = holds or _holds_nothing
    order = sorted((w for w in wants if w.task_id in counts), key=lambda w: (-w.rate_per_s, w.name))
    rankings = {w.task_id: [pod_id for pod_id in rank(w.name) if pod_id in tiers] for w in order}
    chosen: dict[int, list[str]] = {w.task_id: [] for w in order}

    def take(want: AdapterWant, pod_id: str) -> None:
        chosen[want.task_id].append(pod_id)
        pages_used[pod_id] += max(1, want.pages)
        rate_used[pod_id] += want.rate_per_s / counts[want.task_id]

    # 1. stickiness first, for every adapter: the pods it had, best ranked first, while their pages allow
    for want in order:
        before = set(previous.pods_of(want.task_id))
        for pod_id in rankings[want.task_id]:
            if len(chosen[want.task_id]) >= counts[want.task_id]:
                break
            if pod_id in before and pages_used[pod_id] + max(1, want.pages) <= page_cap[pod_id]:
                take(want, pod_id)
    # 2. new copies along each ranking, hottest adapters first: within the load bound, then anywhere with pages;
    # a copy the pod does not hold yet is a move, and the moves are bounded
    moves = deferred = 0
    for want in order:
        count, pages = counts[want.task_id], max(1, want.pages)
        share = want.rate_per_s / count
        bound = (1.0 + config.load_slack) * mean_rate + share
        mine = chosen[want.task_id]
        over_budget = False
        for bounded in (True, False):
            for pod_id in rankings[want.task_id]:
                if len(mine) >= count:
                    break
                if pod_id in mine or pages_used[pod_id] + pages > page_cap[pod_id]:
                    continue
                if bounded and rate_used[pod_id] + share > bound:
                    continue
                if not holding(pod_id, want.task_id):
                    if moves >= config.max_moves:
                        over_budget = True
                        continue
                    moves += 1
                take(want, pod_id)
        if over_budget:
            deferred += count - len(mine)
    host = {
        w.task_id: tuple(pod_id for pod_id in rankings[w.task_id] if pod_id in chosen[w.task_id])
        for w in order
        if chosen[w.task_id]
    }
    return PlacementPlan(
        host=host,
        device=_device_plan(order, host, counts, tiers),
        moves=moves,
        deferred=deferred,
        pod_rate_per_s=rate_used,
        pod_pages=pages_used,
    )


def _device_plan(
    order: Sequence[AdapterWant],
    host: Mapping[int, tuple[str, ...]],
    counts: Mapping[int, int],
    tiers: Mapping[str, PodTiers],
) -> dict[str, frozenset[int]]:
    """Per pod, its planned adapters with the most demand per copy, as many as its device pages hold."""
    per_copy = sorted(
        ((want.rate_per_s / counts[want.task_id], want) for want in order if want.task_id in host),
        key=lambda item: (-item[0], item[1].name),
    )
    left = {pod_id: tier.device_pages for pod_id, tier in tiers.items()}
    device: dict[str, set[int]] = {pod_id: set() for pod_id in tiers}
    for rate, want in per_copy:
        if rate <= 0:
            break
        for pod_id in host[want.task_id]:
            pages = max(1, want.pages)
            if left[pod_id] >= pages:
                left[pod_id] -= pages
                device[pod_id].add(want.task_id)
    return {pod_id: frozenset(tasks) for pod_id, tasks in device.items()}


def _holds_nothing(pod_id: str, task_id: int) -> bool:
    return False


def missing_copies(
    plan: PlacementPlan, holds: Callable[[str, int], bool], rate_of: Mapping[int, float]
) -> list[tuple[str, int]]:
    """(pod, task id) copies the plan wants that the pods do not hold yet, most wanted first (the demand per
    copy, then the adapter's rank among its pods): what the prefetcher pushes."""
    missing: list[tuple[float, int, int, str]] = []
    for task_id, pods in plan.host.items():
        per_copy = rate_of.get(task_id, 0.0) / max(1, len(pods))
        for position, pod_id in enumerate(pods):
            if not holds(pod_id, task_id):
                missing.append((-per_copy, position, task_id, pod_id))
    missing.sort()
    return [(pod_id, task_id) for _rate, _position, task_id, pod_id in missing]


def host_pages_needed(wants: Sequence[AdapterWant], pods: int, config: PlacementConfig) -> int:
    """Host pages each of ``pods`` pods needs for the plan to hold every copy it wants (sizing the host
    tier from the plan, ``host_fill`` included): ``ceil(sum copies x pages / pods / host_fill)``."""
    if pods <= 0:
        return 0
    limit = pods if config.max_host_copies == 0 else min(config.max_host_copies, pods)
    total = sum(
        min(limit, max(config.min_host_copies, math.ceil(w.rate_per_s / config.copy_rate_per_s))) * max(1, w.pages)
        for w in wants
    )
    return math.ceil(total / pods / config.host_fill)
