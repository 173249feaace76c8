"""``dynamo-hrw``: NVIDIA Dynamo's LoRA allocation controller with rendezvous hashing, re-implemented (a baseline).

Source: ai-dynamo/dynamo ``lib/llm/src/lora/controller.rs`` (read at 0a8cd5a4), ``routing/hrw.rs`` (9323daba),
``config.rs`` (32381ac6), ``load_estimator.rs`` (20c307dd) and ``filter.rs`` (75de68bb). Dynamo places adapters on
*device* LoRA slots only (vLLM's ``max_loras``; TRT-LLM LoRA is not supported there); here a pod's slots are its
device pages over the adapter's pages.

* **Load**: arrivals per adapter in a sliding window of ``timestep x 30`` seconds (90 s), smoothed by an EMA
  (alpha 0.3) once per tick.
* **Every tick** (``timestep_s``, 3 s): adapters with load are *active*. Ranked by load (ties by name), at most
  ``total_slots`` of them; each gets ``ceil(load / total_load x total_slots)`` replicas, at least 1, at most the
  pod count; when the sum exceeds the slots, scaled down with largest remainders. A smaller count than the last
  applies only after ``scale_down_cooldown_ticks`` ticks (hysteresis). Each active adapter, in name order, keeps
  the prior workers of its set that are not full (stickiness) then fills from its HRW ranking, skipping workers
  whose slots this tick's placements filled. Active adapters over the slot budget keep the workers of their set
  where they are loaded, else get one HRW pin on a worker with a free slot; adapters known but without load get
  one HRW pin.
* **Routing** (the filter, then Dynamo's KV-router cost among what it leaves, :mod:`.dynamo_kv`): active: the
  replica set's pods where the adapter is loaded, else the whole replica set; inactive: the pin; not in the
  table: the pods where it is loaded, else every pod. Whatever the filter leaves is narrowed to candidates.

Arrivals are counted per routing decision (a retried request counts again). The controller runs inside the
policy on the fleet's clock (lazily, at the first decision of a new tick).
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass

from pydantic import Field

from trtfleet.api.common import ApiModel
from trtfleet_router.routing.baselines.dynamo_kv import DynamoKvConfig, lowest_kv_cost
from trtfleet_router.routing.config import RoutingConfig
from trtfleet_router.routing.framework import Choice, RoutingContext

EMA_FORGET = 0.01
"""An adapter whose smoothed load fell below this, with no arrival in the window, is forgotten (Dynamo prunes
adapters that are no longer loaded from its estimator)."""
SECTION = "dynamo_hrw"
NAME = "dynamo-hrw"


class DynamoHrwConfig(ApiModel):
    """Dynamo's ``LoraAllocationConfig`` defaults (``DYN_LORA_ALLOCATION_*``)."""

    timestep_s: float = Field(default=3.0, gt=0, description="Controller period (DYN_LORA_ALLOCATION_TIMESTEP_SECS).")
    rate_window_multiplier: int = Field(default=30, ge=1, description="Load window = timestep x this.")
    scale_down_cooldown_ticks: int = Field(default=3, ge=0, description="Ticks before a replica count may fall.")
    ema_alpha: float = Field(default=0.3, ge=0, le=1, description="EMA smoothing of the windowed arrival counts.")


@dataclass(slots=True)
class _Entry:
    replicas: tuple[str, ...]
    active: bool


class DynamoHrwPolicy:
    uses_prefix = True  # the KV-router cost among the filtered pods reads the request's blocks

    def __init__(self, config: DynamoHrwConfig, kv: DynamoKvConfig) -> None:
        self._config = config
        self._kv = kv
        self._window_s = max(5.0, config.timestep_s * config.rate_window_multiplier)
        self._arrivals: deque[tuple[float, str]] = deque()
        self._task_of: dict[str, int] = {}  # adapter name -> task id (residency is kept by task id)
        self._counts: dict[str, int] = {}
        self._ema: dict[str, float] = {}
        self._table: dict[str, _Entry] = {}
        self._scale_down_tick: dict[str, int] = {}
        self._tick = 0
        self._next_tick_s = -math.inf

    @property
    def name(self) -> str:
        return NAME

    def pods_changed(self, pod_ids: Sequence[str]) -> None:
        self._next_tick_s = -math.inf  # recompute at the next decision

    # -- the load estimator --------------------------------------------------------------------------
    def _arrive(self, adapter: str, task_id: int, now_s: float) -> None:
        self._task_of[adapter] = task_id
        self._arrivals.append((now_s, adapter))
        self._counts[adapter] = self._counts.get(adapter, 0) + 1

    def _expire(self, now_s: float) -> None:
        arrivals, counts = self._arrivals, self._counts
        while arrivals and arrivals[0][0] <= now_s - self._window_s:
            _, adapter = arrivals.popleft()
            left = counts[adapter] - 1
            if left:
                counts[adapter] = left
            else:
                del counts[adapter]

    # -- the controller ------------------------------------------------------------------------------
    def _recompute(self, ctx: RoutingContext, slot_pages: int) -> None:
        self._tick += 1
        alpha = self._config.ema_alpha
        ema = {name: alpha * self._counts.get(name, 0) + (1 - alpha) * value for name, value in self._ema.items()}
        for name, count in self._counts.items():
            if name not in ema:
                ema[name] = float(count)  # a new adapter starts at its count (Dynamo's EMA seeds with it)
        self._ema = {name: value for name, value in ema.items() if value >= EMA_FORGET or name in self._counts}
        loads = {name: max(0, round(value)) for name, value in ema.items()}
        workers = sorted(pod_id for pod_id, pod in ctx.by_id.items() if pod.ready)
        if not workers:
            self._table.clear()
            return
        capacity = {pod_id: ctx.by_id[pod_id].residency.cache.device.capacity // slot_pages for pod_id in workers}
        total_slots = sum(capacity.values())
        active = sorted((name, load) for name, load in loads.items() if load > 0)
        counts = replica_counts(active, total_slots, len(workers))
        usage = dict.fromkeys(workers, 0)
        table: dict[str, _Entry] = {}
        for name in sorted(counts):
            prior = self._table.get(name)
            current = len(prior.replicas) if prior is not None and prior.active else 0
            wanted = self._hysteresis(name, counts[name], current)
            ranking = [pod_id for pod_id in ctx.rankings.rank(name) if pod_id in usage]
            before = set(prior.replicas) if prior is not None else set()
            chosen: list[str] = []
            for pod_id in ranking:  # stickiness: prior workers that are not full
                if len(chosen) < wanted and pod_id in before and usage[pod_id] < capacity[pod_id]:
                    chosen.append(pod_id)
            for pod_id in ranking:
                if len(chosen) < wanted and pod_id not in chosen and usage[pod_id] < capacity[pod_id]:
                    chosen.append(pod_id)
            if not chosen:  # every worker full: plain HRW
                chosen = ranking[:wanted]
            for pod_id in chosen:
                usage[pod_id] += 1
            table[name] = _Entry(tuple(chosen), True)
        for name, _load in active:  # active over the slot budget: its warm prior workers, else one slot-aware pin
            if name in table:
                continue
            prior = self._table.get(name)
            task_id = self._task_of.get(name)
            warm = [pod_id for pod_id in (prior.replicas if prior is not None else ())
                    if pod_id in usage and task_id is not None and ctx.by_id[pod_id].residency.is_warm(task_id)]
            if not warm:
                ranking = [pod_id for pod_id in ctx.rankings.rank(name) if pod_id in usage]
                free = [pod_id for pod_id in ranking if usage[pod_id] < capacity[pod_id]]
                warm = (free or ranking)[:1]
            for pod_id in warm:
                usage[pod_id] += 1
            if warm:
                table[name] = _Entry(tuple(warm), True)
        for name, entry in self._table.items():  # known, no load: one HRW pin
            if name not in table:
                self._scale_down_tick.pop(name, None)
                ranking = [pod_id for pod_id in ctx.rankings.rank(name) if pod_id in usage]
                if ranking and (entry.active or name in loads):
                    table[name] = _Entry((ranking[0],), False)
        self._table = table

    def _hysteresis(self, name: str, desired: int, current: int) -> int:
        if desired >= current:
            self._scale_down_tick.pop(name, None)
            return desired
        last = self._scale_down_tick.get(name)
        if last is None:
            self._scale_down_tick[name] = self._tick
            return current
        if self._tick - last < self._config.scale_down_cooldown_ticks:
            return current
        self._scale_down_tick[name] = self._tick
        return desired

    # -- routing -------------------------------------------------------------------------------------
    def choose(self, ctx: RoutingContext) -> Choice:
        adapter = ctx.request.adapter
        if adapter is None:
            return Choice(ctx.pods[lowest_kv_cost(ctx, range(len(ctx.pods)), self._kv)], "kv-cost")
        now_s = ctx.now_s
        self._arrive(adapter.name, adapter.task_id, now_s)
        if now_s >= self._next_tick_s:
            self._expire(now_s)
            self._recompute(ctx, max(1, adapter.pages))
            self._next_tick_s = now_s + self._config.timestep_s
        task_id = adapter.task_id
        index = {pod.pod_id: i for i, pod in enumerate(ctx.pods)}
        loaded = [i for pod_id in ctx.residency.warm_pods(task_id) if (i := index.get(pod_id)) is not None
                  and ctx.pods[i].residency.is_warm(task_id)]
        entry = self._table.get(adapter.name)
        if entry is None:
            picked, reason = (loaded, "loaded") if loaded else (list(range(len(ctx.pods))), "unplaced")
        elif entry.active:
            in_set = [i for pod_id in entry.replicas if (i := index.get(pod_id)) is not None]
            loaded_set = set(loaded)
            loaded_in_set = [i for i in in_set if i in loaded_set]
            picked, reason = (loaded_in_set, "replica-loaded") if loaded_in_set else (in_set, "replica-set")
        else:
            pin = index.get(entry.replicas[0])
            picked, reason = ([pin], "pin") if pin is not None else ([], "pin")
        if not picked:  # the set's pods are all excluded or gone: Dynamo's bounded fallback
            fallback = loaded or [index[p] for p in ctx.rankings.rank(adapter.name)[:1] if p in index]
            picked, reason = (fallback or list(range(len(ctx.pods))), "fallback")
        return Choice(ctx.pods[lowest_kv_cost(ctx, sorted(set(picked)), self._kv)], reason)


def replica_counts(active: Sequence[tuple[str, int]], total_slots: int, workers: int) -> dict[str, int]:
    """Dynamo's ``compute_active_replica_counts``: proportional to load, at least 1, at most ``workers``,
    scaled to ``total_slots`` with largest remainders; only the ``total_slots`` most loaded adapters."""
    if not active or total_slots <= 0:
        return {}
    ranked = sorted(active, key=lambda item: (-item[1], item[0]))[:total_slots]
    total = sum(load for _, load in ranked)
    if total == 0:
        return {}
    raw = {name: min(float(workers), max(1.0, math.ceil(load / total * total_slots))) for name, load in ranked}
    if sum(raw.values()) <= total_slots:
        return {name: int(count) for name, count in raw.items()}
    scale = total_slots / sum(raw.values())
    scaled = {name: max(1.0, count * scale) for name, count in raw.items()}
    floored = {name: max(1, math.floor(count)) for name, count in scaled.items()}
    leftover = max(0, total_slots - sum(floored.values()))
    for name in sorted(scaled, key=lambda n: (-(scaled[n] - floored[n]), n)):
        if leftover == 0:
            break
        if floored[name] < workers:
            floored[name] += 1
            leftover -= 1
    return {name: max(1, min(workers, count)) for name, count in floored.items()}


def build(config: RoutingConfig) -> DynamoHrwPolicy:
    return DynamoHrwPolicy(config.section(SECTION, DynamoHrwConfig), config.section("dynamo_kv", DynamoKvConfig))
