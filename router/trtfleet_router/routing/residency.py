"""Per-pod shadow LoRA caches: what the router believes each pod holds.

Nothing in Triton shows a pod's LoRA cache, but the routers are the only senders of weights, so each
keeps one :class:`trtfleet.loracache.LoraPageCache` per pod (tiers sized from the pod's
``host_pages``/``device_pages``) and feeds it what is sent: a request with weights ``put``s the
adapter (the pod does the same), every request ``acquire``s it while in flight and ``release``s it
after, so the shadow evicts exactly what TRT-LLM's LRU-among-idle evicts. With several router
replicas, each feeds the same calls with the other replicas' requests too, from their residency
events (:mod:`trtfleet_router.routing.remote`, pins kept per origin replica), so every replica's
shadow follows all the traffic a pod sees. The pod's miss error is the ground truth that corrects
it (:meth:`Residency.mark_cold`), and it is shared with the other replicas the same way.

A reverse index ``task id -> pods holding it`` makes "where is this adapter warm?" O(1).

The shadow's device tier is fed the same way: an adapter a request acquires is copied there (LRU among idle
device entries), as the pod does when it schedules that request, so :meth:`PodResidency.on_device` tells
whether a request would pay a host-to-device copy.

*Loading*: from the moment a request carrying weights is started until the pod has admitted it
(``Fleet.confirm``, or the request's end), the weights are on the wire. The shadow already holds
the adapter (the pod will store it on arrival), but an id-only request sent meanwhile can overtake
the weights and miss; policies may prefer pods where the adapter has settled.

Where the shadow can be wrong: replicas apply each other's events milliseconds late and in their
own interleaving, so two requests for different adapters on the same pod from different replicas
may be ordered differently than the pod saw them (an LRU victim chosen differently; a miss
corrects it, or re-sent weights are ignored by the pod); replicas that cannot reach each other
(no peer port, a network policy) each see only their own traffic; clients
that send to pods directly are never seen; and weights sent to a pod that failed the request may
not be stored (treated as cold).
"""

from __future__ import annotations

from collections.abc import Set

from trtfleet.loracache import LoraAdapterTooLarge, LoraCacheFull, LoraPageCache


class PodResidency:
    """The shadow cache of one pod plus the ids its miss errors made suspect."""

    __slots__ = ("cache", "evictions_total", "loading", "suspect")

    def __init__(self, host_pages: int, device_pages: int) -> None:
        self.cache = LoraPageCache(host_pages, device_pages)
        # Adapters the pod reported missing while requests of ours still pin them in the shadow:
        # treated as cold until weights are sent again or the last request ends.
        self.suspect: set[int] = set()
        self.loading: dict[int, int] = {}  # task id -> requests carrying its weights, not yet admitted
        self.evictions_total = 0

    def is_warm(self, task_id: int) -> bool:
        """Held and not suspect: a request without weights is expected to find it (loading included)."""
        return task_id in self.cache.host and task_id not in self.suspect

    def holds(self, task_id: int) -> bool:
        """In the shadow at all (suspect included): sending its weights again stores nothing new."""
        return task_id in self.cache.host

    def is_loading(self, task_id: int) -> bool:
        """Its weights are still on their way to the pod with another request."""
        return task_id in self.loading

    def on_device(self, task_id: int) -> bool:
        """The shadow's device tier holds it: a request needs no host-to-device copy (see ``Residency.acquire``)."""
        return self.cache.on_device(task_id)

    def is_active(self, task_id: int) -> bool:
        """The adapter has requests of ours in flight here (what GIE calls an active adapter)."""
        return self.cache.in_use(task_id)

    def has_evictable_slot(self, pages: int) -> bool:
        """``pages`` could be stored now, evicting idle adapters if needed (cost: the victims walked)."""
        return self.cache.can_insert(pages)

    def victims_for(self, pages: int) -> list[int] | None:
        """Task ids storing ``pages`` would evict (idle ones, least recently used first; empty when
        it fits as is), or None when it cannot be stored now.
        """
        if pages > self.cache.host.capacity:
            return None
        return self.cache.host.make_room(pages)

    def has_free_pages(self, pages: int) -> bool:
        """``pages`` fit without evicting anything."""
        host = self.cache.host
        return host.capacity - host.used >= pages

    def would_evict(self, pages: int) -> bool:
        """Storing an adapter of ``pages`` would evict at least one idle adapter."""
        host = self.cache.host
        return host.capacity - host.used < pages


class Residency:
    """All pods' shadow caches of one fleet and the reverse index of where each adapter is."""

    __slots__ = ("_pods", "_warm")

    def __init__(self) -> None:
        self._pods: dict[str, PodResidency] = {}
        self._warm: dict[int, set[str]] = {}  # task id -> pods whose shadow holds it

    # -- pods ------------------------------------------------------------------
    def reset_pod(self, pod_id: str, host_pages: int, device_pages: int) -> PodResidency:
        """A new or restarted pod: an empty cache of the given size."""
        self.drop_pod(pod_id)
        pod = PodResidency(host_pages, device_pages)
        self._pods[pod_id] = pod
        return pod

    def drop_pod(self, pod_id: str) -> None:
        old = self._pods.pop(pod_id, None)
        if old is None:
            return
        for task_id in old.cache.resident():
            self._unindex(task_id, pod_id)

    def pod(self, pod_id: str) -> PodResidency:
        return self._pods[pod_id]

    # -- queries ---------------------------------------------------------------
    def warm_pods(self, task_id: int) -> Set[str]:
        """Pods whose shadow holds ``task_id`` (suspect entries included; check ``is_warm``).

        The returned set is live: copy it to keep it.
        """
        return self._warm.get(task_id, _EMPTY)

    def is_warm(self, pod_id: str, task_id: int) -> bool:
        return self._pods[pod_id].is_warm(task_id)

    # -- updates ---------------------------------------------------------------
    def put(self, pod_id: str, task_id: int, pages: int) -> bool:
        """Weights for ``task_id`` go to the pod. False if the shadow says the pod cannot store them
        (every page busy, or a cache smaller than the adapter): the pod is expected to refuse.
        """
        pod = self._pods[pod_id]
        pod.suspect.discard(task_id)
        try:
            victims = pod.cache.put(task_id, pages)
        except (LoraCacheFull, LoraAdapterTooLarge):
            return False
        for victim in victims:
            self._unindex(victim, pod_id)
        pod.evictions_total += len(victims)
        self._warm.setdefault(task_id, set()).add(pod_id)
        return True

    def acquire(self, pod_id: str, task_id: int) -> bool:
        """Pin ``task_id`` for a request; False if the shadow does not hold it.

        The request will need the adapter on the device tier when it is scheduled, so the shadow copies it there
        now (evicting idle device entries, LRU): its device tier follows the adapters the pod's recent requests
        used. Where every device page is busy the copy waits on the pod; the shadow then leaves it host-only.
        """
        cache = self._pods[pod_id].cache
        if task_id not in cache.host:
            return False
        cache.acquire(task_id)
        try:
            cache.ensure_device(task_id)
        except LoraAdapterTooLarge:
            pass  # a device tier smaller than the adapter: the pod will refuse it, the host shadow stands
        return True

    def begin_load(self, pod_id: str, task_id: int) -> None:
        loading = self._pods[pod_id].loading
        loading[task_id] = loading.get(task_id, 0) + 1

    def end_load(self, pod_id: str, task_id: int) -> None:
        loading = self._pods[pod_id].loading
        left = loading.get(task_id, 0) - 1
        if left > 0:
            loading[task_id] = left
        else:
            loading.pop(task_id, None)

    def release(self, pod_id: str, task_id: int) -> None:
        pod = self._pods[pod_id]
        pod.cache.release(task_id)
        if task_id in pod.suspect and not pod.cache.in_use(task_id):
            pod.suspect.discard(task_id)
            self._evict(pod_id, pod, task_id)

    def mark_cold(self, pod_id: str, task_id: int) -> None:
        """The pod does not hold ``task_id`` (its miss error says so): forget it.

        If requests of ours still pin it, it becomes suspect (cold for routing) and is dropped
        when the last one is released.
        """
        pod = self._pods.get(pod_id)
        if pod is None or task_id not in pod.cache.host:
            return
        if pod.cache.in_use(task_id):
            pod.suspect.add(task_id)
        else:
            self._evict(pod_id, pod, task_id)

    def _evict(self, pod_id: str, pod: PodResidency, task_id: int) -> None:
        if pod.cache.evict(task_id):
            self._unindex(task_id, pod_id)

    def _unindex(self, task_id: int, pod_id: str) -> None:
        pods = self._warm.get(task_id)
        if pods is None:
            return
        pods.discard(pod_id)
        if not pods:
            del self._warm[task_id]

    def check_invariants(self) -> None:
        """The reverse index agrees with the caches (for tests; O(resident adapters))."""
        index: dict[int, set[str]] = {}
        for pod_id, pod in self._pods.items():
            for task_id in pod.cache.resident():
                index.setdefault(task_id, set()).add(pod_id)
        if index != self._warm:
            raise AssertionError(f"reverse index {self._warm} != caches {index}")


_EMPTY: frozenset[str] = frozenset()
