"""Pods kept free of batch lines while interactive requests come (``--batch-reserve-pods``; pure).

An engine runs its batch step by step (in-flight batching): a request that reaches a pod in the middle of a step
waits for that step to end before its own prefill runs. A batch line on every pod therefore costs each
interactive request up to one step, however few lines run and however first the router puts it; only a pod
with nothing in flight starts the request at once (docs/benchmarks/batch.md). The reserve trades batch
throughput for that: while interactive requests come, ``count`` pods take no new batch line, and interactive
requests go there first.

* **Which pods**: the first ``count`` ready pods in the rendezvous order of :data:`RESERVE_KEY`, so every
  router replica reserves the same ones and a pod joining or leaving moves few others. At most all ready pods
  but one: a batch always keeps a pod to progress on.
* **How many** with :data:`RESERVE_AUTO`: the fewest pods that an interactive request finds all busy at most
  ``busyShare`` of the time (:func:`pods_for_load`; :class:`ReserveConfig`, the routing file's ``batchReserve``, 1 %
  by default): a request that finds every reserved pod busy shares one, and waits for the other request's step,
  which is what sets the interactive p99 (a share under 1 % leaves the p99 to requests that had a pod to
  themselves). The load is the mean of what each interactive request finds in flight on the fleet when it starts
  (every replica's, batch lines left out), over about the last :data:`RESERVE_SAMPLES` of them: for Poisson arrivals
  that is the time average (arrivals see time averages), and the count found is Poisson (in flight = M/G/infinity),
  so all n pods are busy for a share ``P(N >= n)``; bursts see more, which reserves more. Replicas see the same
  requests in flight (their events), so their means and counts agree but for the moments around a change.
* **When**: while an interactive request started within the last ``holdS`` seconds (30) on this
  router, or another replica has an interactive request in flight on any pod (their events). A batch alone
  uses every pod; when interactive requests come back, the lines already on a reserved pod finish there and
  no new one starts.
* **Batch lines** are placed among the other pods only (``routing/batchplace.py`` on that subset).
* **Interactive requests**, while the reserve holds and a batch line of any replica is in flight, are routed
  among the reserved pods that have fewer than ``room`` requests in flight (the dispatcher passes its batch
  slots: a reserved pod takes as many as a batch pod admits batch lines) and can take the request's adapter;
  when no reserved pod can, or no batch line runs, among all pods, as without a reserve.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import replace
from typing import Final, TypeVar

from trtfleet_router.routing.config import RESERVE_BUSY_SHARE, ReserveConfig
from trtfleet_router.routing.framework import PodView
from trtfleet_router.routing.hashing import RendezvousRankings
from trtfleet_router.routing.types import RouteRequest

RESERVE_KEY: Final = "\x00trtfleet/interactive-reserve"  # no adapter or model name holds a NUL
RESERVE_AUTO: Final = -1  # a reserve sized from the interactive load (``--batch-reserve-pods auto``)
RESERVE_SAMPLES: Final = 32  # auto: the interactive requests the mean in flight is taken over (about)

PodT = TypeVar("PodT", bound=PodView)


def pods_for_load(mean_inflight: float, share: float = RESERVE_BUSY_SHARE, limit: int = 4096) -> int:
    """The fewest pods, at least one and at most ``limit``, that a request arriving with a Poisson count of
    mean ``mean_inflight`` others in flight finds all busy (that count or more) at most ``share`` of the time."""
    term = math.exp(-max(0.0, mean_inflight))  # P(N = 0)
    below, pods = term, 1  # below: P(N <= pods - 1)
    while 1.0 - below > share and pods < limit:
        term *= mean_inflight / pods
        below += term
        pods += 1
    return pods


def reserved_pods(rankings: RendezvousRankings, ready_ids: Sequence[str], count: int) -> frozenset[str]:
    """The ids of the reserved pods among ``ready_ids`` (at most all but one)."""
    count = min(count, len(ready_ids) - 1)
    if count <= 0:
        return frozenset()
    ready = set(ready_ids)
    chosen: list[str] = []
    for pod_id in rankings.rank(RESERVE_KEY):
        if pod_id in ready:
            chosen.append(pod_id)
            if len(chosen) == count:
                break
    return frozenset(chosen)


def hidden_pods(
    ids: Sequence[str],
    loads: Sequence[int],
    reserved: frozenset[str],
    batch_line: bool,
    room: int,
    fits: Sequence[bool] | None = None,
) -> frozenset[str]:
    """Of the candidates ``ids`` (with the ``loads`` the request is compared by), those a request does not see
    with ``reserved`` held back (none: it is routed as without a reserve).

    An interactive request's loads leave batch lines out, which is right for the room check: a reserved pod runs
    none once its last ones finish. ``fits`` (per candidate; None: all): whether the pod can take the request's
    adapter now (warm, or room in its LoRA cache); a reserved pod that cannot is no room for it, so a cache full
    of busy adapters there never makes an interactive request wait while other pods could serve it.
    """
    if not reserved:
        return frozenset()
    if batch_line:
        hidden = frozenset(pod_id for pod_id in ids if pod_id in reserved)
        # every candidate left is reserved (the others were tried): the batch line may use them
        return frozenset() if len(hidden) == len(ids) else hidden
    usable = [
        pod_id in reserved and load < room and (fits is None or fits[i])
        for i, (pod_id, load) in enumerate(zip(ids, loads, strict=True))
    ]
    if any(usable):
        return frozenset(pod_id for pod_id, ok in zip(ids, usable, strict=True) if not ok)
    return frozenset()


class InteractiveReserve:
    """One fleet's reserve: when it holds (the last interactive request this router started, on the fleet's
    clock, or another replica's in flight) and what it leaves a request to be routed among."""

    __slots__ = ("_config", "_last_interactive_s", "_mean_inflight", "_samples")

    def __init__(self, config: ReserveConfig | None = None) -> None:
        self._config = config or ReserveConfig()
        self._last_interactive_s = float("-inf")
        self._mean_inflight = 0.0
        self._samples = 0

    def started(self, request: RouteRequest, prewarm: bool, now_s: float, ready: Sequence[PodView]) -> None:
        """``request`` was sent (``Fleet.start``, which already counts it in flight). Batch lines and prewarming
        pushes are not interactive; with an auto reserve an interactive request samples the interactive load."""
        if request.background or prewarm:
            return
        self._last_interactive_s = now_s
        if request.reserve_pods == RESERVE_AUTO:
            found = sum(p.load.inflight - p.load.background + p.load.remote_inflight - p.load.remote_background
                        for p in ready) - 1  # not itself
            self._samples = min(self._samples + 1, RESERVE_SAMPLES)
            self._mean_inflight += (max(0, found) - self._mean_inflight) / self._samples

    def size(self, count: int, ready: int) -> int:
        """The pods a reserve of ``count`` holds back (before the all-but-one cap of ``ready`` pods): ``count``,
        or by the load (its search stops at the cap: one step a pod, however heavy the load)."""
        if count != RESERVE_AUTO:
            return count
        return pods_for_load(self._mean_inflight, self._config.busy_share, limit=max(1, ready - 1))

    def holds(self, now_s: float, pods: Sequence[PodView]) -> bool:
        if now_s - self._last_interactive_s <= self._config.hold_s:
            return True
        return any(pod.load.remote_inflight > pod.load.remote_background for pod in pods)

    def reserved_now(
        self, count: int, rankings: RendezvousRankings, ready: Sequence[PodView], now_s: float
    ) -> frozenset[str]:
        """The reserved pods now for a reserve of ``count`` (none while the reserve does not hold)."""
        if count == 0 or not self.holds(now_s, ready):
            return frozenset()
        return reserved_pods(rankings, [pod.pod_id for pod in ready], self.size(count, len(ready)))

    def apply(
        self,
        request: RouteRequest,
        pods: Sequence[PodT],
        loads: Sequence[int],
        rankings: RendezvousRankings,
        ready: Sequence[PodView],
        now_s: float,
    ) -> tuple[RouteRequest, list[PodT], list[int]]:
        """``request``, its candidate ``pods`` and their ``loads`` with the reserve applied: the pods it does not
        see are added to its ``exclude_pods``, which every policy reads (``RoutingContext.is_candidate``)."""
        if not request.background and not any(pod.load.background or pod.load.remote_background for pod in ready):
            return request, list(pods), list(loads)  # no batch line anywhere: the whole fleet is interactive room
        reserved = self.reserved_now(request.reserve_pods, rankings, ready, now_s)
        if not reserved:
            return request, list(pods), list(loads)
        adapter = request.adapter
        fits = None
        if adapter is not None and not request.background:
            task_id = adapter.task_id
            fits = [pod.residency.holds(task_id) or pod.residency.has_evictable_slot(adapter.pages) for pod in pods]
        ids = [pod.pod_id for pod in pods]
        hidden = hidden_pods(ids, loads, reserved, request.background, request.reserve_room, fits)
        if not hidden:
            return request, list(pods), list(loads)
        keep = [i for i, pod in enumerate(pods) if pod.pod_id not in hidden]
        return (replace(request, exclude_pods=request.exclude_pods | hidden), [pods[i] for i in keep],
                [loads[i] for i in keep])
