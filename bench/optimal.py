"""An upper bound on the adapter hit rate of ANY routing policy, and the compulsory-miss floor.

**Hit** (one definition for the real runs, the simulator and this bound): a request is a hit when its
adapter is resident in the host LoRA cache of the pod that admits it, at the moment it is admitted,
before anything is inserted for it. A weights re-send after a miss, a request sent with weights that
get stored, and a request that fails are not hits. The device tier never decides a hit
(``trtfleet.loracache``). A router could make any request a "hit" by pushing the adapter just
before it (prewarming), so the quantity the bound caps charges that work: the **effective hit rate**
``1 - (adapter loads + failed requests) / requests``, where a load is any insertion of weights into a
pod's host cache (request, re-send or prewarm). When nothing prewarms, every request is either a hit,
or admitted with one load, or failed, and the two rates are equal; the tables show both.

**The bound.** Take any fleet of pods ``p`` with host caches of ``C_p`` pages, every adapter taking at
least ``s_min`` pages, and any routing, prewarming, eviction and timing. Let ``U_t`` be the set of
adapters resident on *some* pod just before request ``t`` is admitted.

1. ``|U_t| <= K := sum_p floor(C_p / s_min)``: each pod holds at most ``floor(C_p / s_min)`` adapters.
2. A fleet hit at ``t`` implies ``r_t in U_t`` (resident on the chosen pod means resident somewhere);
   a served request has ``r_t`` resident on its pod after admission, so ``r_t`` is in the union then.
3. So ``U_0, U_1, ...`` is a schedule of one cache of ``K`` uniform slots that may load at any time
   (prefetch), evict anything at any time (no pinning: requests in flight pin adapters in real pods,
   which only removes schedules, never adds one) and skip storing an adapter (bypass: the failed
   requests). Each insertion into ``U`` is at least one pod load (loading an adapter that another pod
   already holds costs a load and leaves ``U`` unchanged), so its cost ``insertions + bypasses`` is at
   most the fleet's ``loads + failures``.
4. Over all such schedules the least cost is reached without prefetching (defer every load to the
   request that needs it: never more loads) by Belady's rule with bypass: on a miss, store the adapter
   only if its next use is sooner than the furthest next use in a full cache, evicting that one. The
   unit tests check this against exhaustive search on small traces.

Hence ``1 - belady_misses(trace, K) / n >= effective hit rate of any policy`` on the same order of
admissions. A router that never holds a request back keeps the trace order; the runs compare in that
order. With adapters of different sizes ``s_min`` loosens the bound (still valid). Caches start empty
in every run, as here.

The **compulsory-miss floor** is the first use of each distinct adapter: no schedule that starts cold
and does not prefetch for free avoids it, so the bound is ``<= 1 - distinct / requests``.
"""

from __future__ import annotations

import heapq
import math
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

NEVER = math.inf


@dataclass(frozen=True, slots=True)
class BoundResult:
    requests: int
    hits: int
    compulsory_misses: int
    capacity_slots: int

    @property
    def hit_rate(self) -> float:
        return self.hits / self.requests if self.requests else 0.0

    @property
    def compulsory_ceiling(self) -> float:
        """``1 - distinct / requests``: the hit rate with an infinite cache."""
        return 1.0 - self.compulsory_misses / self.requests if self.requests else 0.0


def next_uses(adapters: Sequence[str]) -> list[float]:
    """For each position, the index of the next request for the same adapter (``inf`` if none)."""
    following: list[float] = [NEVER] * len(adapters)
    last_seen: dict[str, int] = {}
    for index in range(len(adapters) - 1, -1, -1):
        adapter = adapters[index]
        following[index] = last_seen.get(adapter, NEVER)
        last_seen[adapter] = index
    return following


def belady_hits(adapters: Sequence[str], capacity_slots: int, *, bypass: bool = True) -> int:
    """Hits of Belady's furthest-next-use rule on one cache of ``capacity_slots`` uniform slots.

    With ``bypass`` (the default, used for the bound) a missed adapter is not stored when it is
    reused later than everything in a full cache. Runs in O(n log n) with a lazily cleaned heap.
    """
    if capacity_slots <= 0:
        return 0
    following = next_uses(adapters)
    cached: dict[str, float] = {}  # adapter -> its next use
    heap: list[tuple[float, str]] = []  # (-next use, adapter); stale entries skipped
    hits = 0
    for index, adapter in enumerate(adapters):
        upcoming = following[index]
        if adapter in cached:
            hits += 1
            cached[adapter] = upcoming
            heapq.heappush(heap, (-upcoming, adapter))
            continue
        if len(cached) >= capacity_slots:
            while True:  # furthest next use currently cached
                negative, victim = heap[0]
                if cached.get(victim) == -negative:
                    break
                heapq.heappop(heap)
            if bypass and -negative <= upcoming:
                continue  # storing it would evict something needed sooner
            heapq.heappop(heap)
            del cached[victim]
        if bypass and upcoming == NEVER:
            continue
        cached[adapter] = upcoming
        heapq.heappush(heap, (-upcoming, adapter))
    return hits


def lru_hits(adapters: Sequence[str], capacity_slots: int) -> int:
    """Hits of plain LRU on one pooled cache (a reference point, not a bound)."""
    cache: OrderedDict[str, None] = OrderedDict()
    hits = 0
    for adapter in adapters:
        if adapter in cache:
            hits += 1
            cache.move_to_end(adapter)
            continue
        if capacity_slots <= 0:
            continue
        if len(cache) >= capacity_slots:
            cache.popitem(last=False)
        cache[adapter] = None
    return hits


def pooled_slots(pod_host_pages: Sequence[int], adapter_pages: Mapping[str, int] | int) -> int:
    """``K = sum_p floor(C_p / s_min)``: adapters the whole fleet can hold at once, at most."""
    smallest = adapter_pages if isinstance(adapter_pages, int) else min(adapter_pages.values())
    if smallest <= 0:
        raise ValueError("an adapter takes at least one page")
    return sum(pages // smallest for pages in pod_host_pages)


def hit_rate_bound(
    adapters: Sequence[str], pod_host_pages: Sequence[int], adapter_pages: Mapping[str, int] | int
) -> BoundResult:
    """The bound for requests naming ``adapters`` in admission order on a fleet of these caches."""
    slots = pooled_slots(pod_host_pages, adapter_pages)
    return BoundResult(
        requests=len(adapters),
        hits=belady_hits(adapters, slots),
        compulsory_misses=len(set(adapters)),
        capacity_slots=slots,
    )
