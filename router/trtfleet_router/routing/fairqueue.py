"""Where waiting requests queue: strict priority between bands, a tenant order inside a band (pure).

A :class:`FairQueue` holds, per :class:`Priority` band, one first-in-first-out queue per tenant. The next request
to go is the head of one tenant's queue in the most important band that has any: which tenant is the
:class:`TenantOrder`'s choice (trtfleet's is the virtual token counter of ``routing/vtc.py``; :class:`ArrivalOrder`
is first come, first served, kept for comparison). Under saturation the request shed first is the newest of the
tenant the order names as most over its share, in the least important band that has any (:meth:`FairQueue.victim`).

No clock, no I/O: the asyncio :class:`~trtfleet_router.upstream.waiting.WaitLine` and the fleet simulator both
drive it.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Callable, Collection, Iterator, Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import Final, Generic, Protocol, TypeVar

T = TypeVar("T")


class Priority(StrEnum):
    """Bands, most important first. ``critical``: above ordinary traffic (an objective with a positive priority, a
    tenant or adapter so configured); ``interactive``: a client's request by default; ``sheddable``: shed first when
    the fleet is saturated (a negative objective priority); ``batch``: a line of the batch runner, never shed (it
    waits, see ``upstream/admission.py``)."""

    CRITICAL = "critical"
    INTERACTIVE = "interactive"
    SHEDDABLE = "sheddable"
    BATCH = "batch"


BANDS: Final = tuple(Priority)
"""Most important first."""
RANK: Final = {band: rank for rank, band in enumerate(BANDS)}
"""0 for the most important band."""
CLIENT_BANDS: Final = tuple(band for band in BANDS if band is not Priority.BATCH)

Eligible = Callable[[str, Priority], bool]
"""Which waiters a wake-up may go to, by ``(tenant, band)`` (a pod's reserved slots: only a request not flooding)."""

ENGINE_PRIORITY: Final = {
    Priority.CRITICAL: 1.0,
    Priority.INTERACTIVE: 0.5,
    Priority.SHEDDABLE: 0.25,
    Priority.BATCH: 0.0,
}
"""trtllm-serve's ``priority`` (a float in [0, 1], 0.5 its default) for each band: what the router sends a pod whose
waiting queue orders by priority, so the engine keeps the router's order among requests it queues itself."""


def band_of_engine_priority(value: float) -> Priority:
    """The band a request's own trtllm-serve ``priority`` names: above 0.5 critical, 0.5 interactive, below it
    sheddable (a client never names the batch runner's band)."""
    if value > ENGINE_PRIORITY[Priority.INTERACTIVE]:
        return Priority.CRITICAL
    if value == ENGINE_PRIORITY[Priority.INTERACTIVE]:
        return Priority.INTERACTIVE
    return Priority.SHEDDABLE


def more_important(a: Priority, b: Priority) -> bool:
    return RANK[a] < RANK[b]


class TenantOrder(Protocol):
    """Which tenant's oldest waiting request goes next within one band, and whose is shed first."""

    def joined(self, tenant: str, band: Priority, backlogged: Collection[str]) -> None:
        """``tenant`` had no request waiting in ``band`` and now has one; ``backlogged``: the tenants that wait
        there already."""

    def pick(self, band: Priority, heads: Mapping[str, int]) -> str:
        """The tenant whose head goes next; ``heads``: each waiting tenant's head's arrival number."""

    def admitted(self, tenant: str, band: Priority) -> None:
        """A request of ``tenant`` left ``band`` to start."""

    def victim(self, band: Priority, tails: Mapping[str, int]) -> str:
        """The tenant whose newest waiting request is shed first; ``tails``: each tenant's newest's arrival number."""

    def charge(self, tenant: str, input_tokens: int = 0, output_tokens: int = 0) -> None:
        """Tokens served to ``tenant`` (its prompt when it starts, its output as it streams)."""

    def share(self, tenant: str, backlogged: Collection[str]) -> float | None:
        """The fraction of a band's turns ``tenant`` gets while ``backlogged`` (itself included) all wait there; None:
        turns go by arrival, not by tenant."""

    def displaces(self, tenant: str, waiting: int, other: str, other_waiting: int) -> bool:
        """Whether a request of ``tenant`` (``waiting`` of its own in the band already) joining a full line may take
        the place of the newest of ``other`` (``other_waiting`` there): the newcomer would go first."""


class ArrivalOrder:
    """First come, first served across tenants (the order without tenancy, kept for comparison)."""

    def joined(self, tenant: str, band: Priority, backlogged: Collection[str]) -> None:
        return None

    def pick(self, band: Priority, heads: Mapping[str, int]) -> str:
        return min(heads, key=heads.__getitem__)

    def admitted(self, tenant: str, band: Priority) -> None:
        return None

    def victim(self, band: Priority, tails: Mapping[str, int]) -> str:
        return max(tails, key=tails.__getitem__)

    def charge(self, tenant: str, input_tokens: int = 0, output_tokens: int = 0) -> None:
        return None

    def share(self, tenant: str, backlogged: Collection[str]) -> float | None:
        return None

    def displaces(self, tenant: str, waiting: int, other: str, other_waiting: int) -> bool:
        return False


@dataclass(slots=True, eq=False)
class Entry(Generic[T]):
    item: T
    band: Priority
    tenant: str
    seq: int
    """Arrival number: ties between tenants go to the older head; a request put back at the head gets a smaller one."""


class FairQueue(Generic[T]):
    """Per band, one FIFO per tenant; :meth:`pop` takes the head the band's :class:`TenantOrder` picks."""

    __slots__ = ("_bands", "_count", "_front", "_seq", "order")

    def __init__(self, order: TenantOrder) -> None:
        self.order = order
        self._bands: dict[Priority, dict[str, deque[Entry[T]]]] = {}
        self._count = dict.fromkeys(BANDS, 0)
        self._seq = 0
        self._front = 0

    def __len__(self) -> int:
        return sum(self._count.values())

    def __bool__(self) -> bool:
        return any(self._count.values())

    def waiting(self, band: Priority | None = None) -> int:
        """Requests waiting in ``band`` (None: in every band)."""
        return len(self) if band is None else self._count[band]

    def waiting_from(self, band: Priority, eligible: Eligible | None = None) -> int:
        """Requests waiting in ``band`` and in more important bands: those a newcomer of ``band`` may wait behind
        (``eligible``: only those of tenants and bands it accepts)."""
        rank = RANK[band]
        if eligible is None:
            return sum(count for other, count in self._count.items() if RANK[other] <= rank)
        return sum(
            len(queue)
            for other in BANDS[: rank + 1]
            for tenant, queue in self._bands.get(other, {}).items()
            if eligible(tenant, other)
        )

    def tenants(self, band: Priority) -> Collection[str]:
        """Tenants with a request waiting in ``band``."""
        return self._bands.get(band, {}).keys()

    def waiting_of(self, tenant: str, band: Priority) -> int:
        queue = self._bands.get(band, {}).get(tenant)
        return len(queue) if queue is not None else 0

    def push(self, item: T, band: Priority, tenant: str, *, first: bool = False) -> Entry[T]:
        """Queue ``item``; ``first``: at the head of its tenant's queue and ahead of every tenant's head in a tie
        (a request that was let go but found no room either)."""
        tenants = self._bands.setdefault(band, {})
        queue = tenants.get(tenant)
        if queue is None:
            self.order.joined(tenant, band, tenants.keys())
            queue = tenants[tenant] = deque()
        if first:
            self._front -= 1
            entry = Entry(item, band, tenant, self._front)
            queue.appendleft(entry)
        else:
            self._seq += 1
            entry = Entry(item, band, tenant, self._seq)
            queue.append(entry)
        self._count[band] += 1
        return entry

    def passed(self, tenant: str, band: Priority) -> None:
        """A request of ``tenant`` started without waiting: to the order it joined and left at once (so a tenant
        whose requests never wait is lifted as one that returns)."""
        tenants = self._bands.get(band)
        if tenants is None or tenant not in tenants:
            self.order.joined(tenant, band, tenants.keys() if tenants is not None else ())
        self.order.admitted(tenant, band)

    def peek(self, eligible: Eligible | None = None) -> Entry[T] | None:
        """The entry :meth:`pop` would take."""
        found = self._next(eligible)
        return found[1][found[2]][0] if found is not None else None

    def pop(self, eligible: Eligible | None = None) -> Entry[T] | None:
        """Take the next entry: the most important band with any, the head of the tenant the order picks
        (``eligible``: among the tenants and bands it accepts only)."""
        found = self._next(eligible)
        if found is None:
            return None
        band, tenants, tenant = found
        entry = tenants[tenant].popleft()
        self._drop(entry, tenants)
        self.order.admitted(tenant, band)
        return entry

    def _next(self, eligible: Eligible | None) -> tuple[Priority, dict[str, deque[Entry[T]]], str] | None:
        """The band, its tenants' queues and the tenant whose head goes next."""
        for band in BANDS:
            tenants = self._bands.get(band)
            if not tenants:
                continue
            if eligible is None:
                return band, tenants, self._pick(band, tenants)
            accepted = {name: queue for name, queue in tenants.items() if eligible(name, band)}
            if accepted:
                return band, tenants, self._pick(band, accepted)
        return None

    def remove(self, entry: Entry[T]) -> bool:
        """Take ``entry`` out (it gave up or was cancelled); False when it is no longer queued."""
        tenants = self._bands.get(entry.band)
        queue = tenants.get(entry.tenant) if tenants is not None else None
        if queue is None or tenants is None:
            return False
        try:
            queue.remove(entry)
        except ValueError:
            return False
        self._drop(entry, tenants)
        return True

    def victim(self, below: Priority | None = None) -> Entry[T] | None:
        """The entry shed first: in the least important band with any (strictly below ``below`` when given; batch
        lines are never shed), the newest of the tenant the order names."""
        for band in reversed(CLIENT_BANDS):
            if below is not None and not more_important(below, band):
                return None
            tenants = self._bands.get(band)
            if tenants:
                tenant = self.order.victim(band, {name: queue[-1].seq for name, queue in tenants.items()})
                return tenants[tenant][-1]
        return None

    def displaceable(self, band: Priority, tenant: str) -> Entry[T] | None:
        """In a full line: the entry a newcomer of ``tenant`` takes the place of (a less important band's shed first,
        else in its own band the newest of the most-over-share other tenant, when the order would start the newcomer
        before it)."""
        lower = self.victim(band)
        if lower is not None:
            return lower
        tenants = self._bands.get(band)
        if not tenants or band is Priority.BATCH:
            return None
        others = {name: queue[-1].seq for name, queue in tenants.items() if name != tenant}
        if not others:
            return None
        other = self.order.victim(band, others)
        if self.order.displaces(tenant, self.waiting_of(tenant, band), other, len(tenants[other])):
            return tenants[other][-1]
        return None

    def ahead(self, band: Priority, tenant: str) -> int:
        """How many waiting requests would go before a new one of ``tenant`` in ``band`` (the order's share of turns
        applied to its own queue; every one of the band under arrival order)."""
        higher = self.waiting_from(band) - self._count[band]
        total = self._count[band]
        tenants = self._bands.get(band)
        if not tenants:
            return higher
        backlogged = tenants.keys() | {tenant}
        share = self.order.share(tenant, backlogged)
        if share is None or share <= 0:
            return higher + total
        own = self.waiting_of(tenant, band)
        return higher + min(total, math.ceil((own + 1) / share) - 1)

    def __iter__(self) -> Iterator[Entry[T]]:
        for band in BANDS:
            for queue in self._bands.get(band, {}).values():
                yield from queue

    def _pick(self, band: Priority, tenants: dict[str, deque[Entry[T]]]) -> str:
        if len(tenants) == 1:
            return next(iter(tenants))
        return self.order.pick(band, {name: queue[0].seq for name, queue in tenants.items()})

    def _drop(self, entry: Entry[T], tenants: dict[str, deque[Entry[T]]]) -> None:
        self._count[entry.band] -= 1
        if not tenants[entry.tenant]:
            del tenants[entry.tenant]
            if not tenants:
                del self._bands[entry.band]
