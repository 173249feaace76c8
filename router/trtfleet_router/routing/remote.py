"""Other router replicas' requests, booked from their events, in the same residency the routing uses.

:class:`RemoteBook` keeps, per origin replica, the requests it has in flight (``ticket -> pod, task,
pinned, loading``), so that:

* a remote ``put``/``acquire`` stores and pins the adapter in the pod's shadow exactly as a local
  request does (the LRU order then follows every replica's traffic, as the pod's does);
* a remote ``release`` unpins only what that remote request pinned: a local pin, or another
  origin's, can never be released by it;
* :meth:`RemoteBook.forget_origin` (a replica gone for good, or a gap in its stream) releases all
  of that origin's pins at once, so a dead replica leaves no adapter pinned;
* a remote batch line (its ``put``/``acquire`` carries the class) counts in the pod's ``remote_background`` as
  well, so an interactive request is compared without it here as on its origin (``PodLoad.foreground``); a
  snapshot names them too (``batch``, :mod:`trtfleet_router.peering.view`).

A ticket remembers the pod's epoch (``PodView.uid``) it was booked on: after the pod's shadow was
reset (restart, removal), its release finds another epoch and touches nothing, as local tickets do.
Pure: no I/O, no clock (``now_s`` is passed in).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Protocol

from trtfleet_router.routing.events import EventKind, ResidencyEvent
from trtfleet_router.routing.load import ActivityWindow, AdapterDemand, PodLoad
from trtfleet_router.routing.residency import Residency


class RemotePod(Protocol):
    """What the book reads of a pod (``Fleet``'s ``PodState``)."""

    @property
    def discovered_uid(self) -> str: ...

    @property
    def uid(self) -> str: ...

    @property
    def load(self) -> PodLoad: ...


@dataclass(slots=True)
class RemoteTicket:
    pod_id: str
    pod_epoch: str  # PodView.uid when booked
    task_id: int | None
    pinned: bool
    loading: bool
    background: bool = False  # a batch line


class RemoteBook:
    """In-flight requests of every other replica, per origin."""

    __slots__ = ("_origins",)

    def __init__(self) -> None:
        self._origins: dict[str, dict[int, RemoteTicket]] = {}

    def apply(
        self,
        event: ResidencyEvent,
        pods: Mapping[str, RemotePod],
        residency: Residency,
        demand: AdapterDemand,
        window: ActivityWindow[int | None],
        now_s: float,
    ) -> bool:
        """Apply one event of another replica (not ``pod_reset``: the fleet resets the pod itself).
        False when it was ignored (unknown pod or incarnation, unknown ticket)."""
        kind = event.kind
        if kind is EventKind.PUT or kind is EventKind.ACQUIRE:
            pod = pods.get(event.pod_id)
            if pod is None or pod.discovered_uid != event.pod_uid:
                return False
            task_id = event.task_id
            pinned = loading = False
            if task_id is not None:
                if kind is EventKind.PUT:
                    loading = residency.put(event.pod_id, task_id, event.pages)
                    if loading:
                        residency.begin_load(event.pod_id, task_id)
                pinned = residency.acquire(event.pod_id, task_id)
                demand.started(task_id, now_s)
            window.record(task_id, now_s)
            pod.load.remote_inflight += 1
            if event.background:
                pod.load.remote_background += 1
            tickets = self._origins.setdefault(event.origin, {})
            tickets[event.ticket] = RemoteTicket(event.pod_id, pod.uid, task_id, pinned, loading, event.background)
            return True
        if kind is EventKind.LOADED:
            ticket = self._origins.get(event.origin, {}).get(event.ticket)
            if ticket is None or not ticket.loading:
                return False
            ticket.loading = False
            pod = pods.get(ticket.pod_id)
            if pod is not None and pod.uid == ticket.pod_epoch and ticket.task_id is not None:
                residency.end_load(ticket.pod_id, ticket.task_id)
            return True
        if kind is EventKind.RELEASE:
            ticket = self._origins.get(event.origin, {}).pop(event.ticket, None)
            if ticket is None:
                return False
            self._release(ticket, pods, residency, demand)
            return True
        if kind is EventKind.MARK_COLD:
            pod = pods.get(event.pod_id)
            if pod is None or pod.discovered_uid != event.pod_uid or event.task_id is None:
                return False
            residency.mark_cold(event.pod_id, event.task_id)
            return True
        return False

    def forget_origin(
        self, origin: str, pods: Mapping[str, RemotePod], residency: Residency, demand: AdapterDemand
    ) -> int:
        """End every request ``origin`` has in flight (it is gone, or its stream had a gap); returns how many."""
        tickets = self._origins.pop(origin, {})
        for ticket in tickets.values():
            self._release(ticket, pods, residency, demand)
        return len(tickets)

    @staticmethod
    def _release(
        ticket: RemoteTicket, pods: Mapping[str, RemotePod], residency: Residency, demand: AdapterDemand
    ) -> None:
        task_id = ticket.task_id
        if task_id is not None:
            demand.finished(task_id)
        pod = pods.get(ticket.pod_id)
        if pod is None or pod.uid != ticket.pod_epoch:
            return  # the pod left or its shadow was reset since: nothing of this request is in it
        pod.load.remote_inflight -= 1
        if ticket.background:
            pod.load.remote_background -= 1
        if task_id is None:
            return
        if ticket.loading:
            residency.end_load(ticket.pod_id, task_id)
        if ticket.pinned:
            residency.release(ticket.pod_id, task_id)

    # -- introspection -----------------------------------------------------------------------------
    def origins(self) -> list[str]:
        return sorted(self._origins)

    def tickets(self) -> Iterator[tuple[str, int, RemoteTicket]]:
        for origin, tickets in self._origins.items():
            for ticket_id, ticket in tickets.items():
                yield origin, ticket_id, ticket

    def inflight(self, pod_id: str, pod_epoch: str) -> int:
        return sum(1 for _, _, t in self.tickets() if t.pod_id == pod_id and t.pod_epoch == pod_epoch)

    def background(self, pod_id: str, pod_epoch: str) -> int:
        return sum(1 for _, _, t in self.tickets() if t.background and t.pod_id == pod_id and t.pod_epoch == pod_epoch)

    def loading(self, pod_id: str, pod_epoch: str) -> dict[int, int]:
        counts: dict[int, int] = {}
        for _, _, t in self.tickets():
            if t.loading and t.task_id is not None and t.pod_id == pod_id and t.pod_epoch == pod_epoch:
                counts[t.task_id] = counts.get(t.task_id, 0) + 1
        return counts
