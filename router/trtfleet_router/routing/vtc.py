"""Weighted fair sharing by tokens served: the Virtual Token Counter (Sheng et al., OSDI 2024) as a tenant order.

Each tenant has a counter of the service it received, in weighted tokens: ``input_cost`` per prompt token when a
request starts and ``output_cost`` per output token as it streams, divided by the tenant's weight. The next
request to go is the oldest of the tenant with the smallest counter among those waiting, so, while tenants stay
backlogged, each receives tokens in proportion to its weight.

**Counter lift.** A tenant that had nothing waiting in a band and now has (:meth:`joined`) is raised to the
smallest counter of the tenants waiting there, or, when none waits, to the counter of the tenant that last left the
band to start (the paper's rule). Service received while the others were not competing is not held against a
tenant, and a tenant that was idle cannot bank credit: once lifted, it runs ahead of a backlogged tenant by at most
what one admission and the tokens then in flight cost (the paper's bound, ``2 x max(input_cost x L_in, output_cost
x M)`` between two backlogged tenants). The lift is also why forgetting an idle tenant is safe: it returns at 0 and
is lifted at once.

Adapted to a router: counters are kept per base model (its fleet is the shared resource), per router replica (each
sees the requests the Service sends it), and a request whose tenant has nothing waiting starts at once while the
fleet has room (:meth:`FairQueue.passed` lifts it all the same).
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from typing import Final

from trtfleet_router.routing.fairqueue import Priority

INPUT_COST_DEFAULT: Final = 1.0
OUTPUT_COST_DEFAULT: Final = 2.0
"""The paper's weights: an output token costs twice a prompt token (decode dominates a pod's time per token)."""
MAX_TENANTS_DEFAULT: Final = 10_000


class VirtualTokenCounters:
    """A :class:`~trtfleet_router.routing.fairqueue.TenantOrder` over weighted token counters (one base model)."""

    __slots__ = ("_last", "counters", "default_weight", "input_cost", "max_tenants", "output_cost", "weights")

    def __init__(
        self,
        weights: Mapping[str, float] | None = None,
        *,
        default_weight: float = 1.0,
        input_cost: float = INPUT_COST_DEFAULT,
        output_cost: float = OUTPUT_COST_DEFAULT,
        max_tenants: int = MAX_TENANTS_DEFAULT,
    ) -> None:
        self.weights = dict(weights or {})
        self.default_weight = default_weight
        self.input_cost = input_cost
        self.output_cost = output_cost
        self.max_tenants = max_tenants
        self.counters: dict[str, float] = {}
        self._last: dict[Priority, float] = {}

    def weight(self, tenant: str) -> float:
        return self.weights.get(tenant, self.default_weight)

    def counter(self, tenant: str) -> float:
        return self.counters.get(tenant, 0.0)

    def joined(self, tenant: str, band: Priority, backlogged: Collection[str]) -> None:
        counters = self.counters
        if backlogged:
            floor = min(counters.get(other, 0.0) for other in backlogged)
        else:
            floor = self._last.get(band, 0.0)
        current = counters.get(tenant)
        if current is None:
            if len(counters) >= self.max_tenants:
                self._forget(backlogged)
            counters[tenant] = floor
        elif current < floor:
            counters[tenant] = floor

    def pick(self, band: Priority, heads: Mapping[str, int]) -> str:
        counters = self.counters
        return min(heads, key=lambda tenant: (counters.get(tenant, 0.0), heads[tenant]))

    def admitted(self, tenant: str, band: Priority) -> None:
        self._last[band] = self.counters.get(tenant, 0.0)

    def victim(self, band: Priority, tails: Mapping[str, int]) -> str:
        counters = self.counters
        return max(tails, key=lambda tenant: (counters.get(tenant, 0.0), tails[tenant]))

    def charge(self, tenant: str, input_tokens: int = 0, output_tokens: int = 0) -> None:
        cost = self.input_cost * input_tokens + self.output_cost * output_tokens
        if cost:
            weight = self.weights.get(tenant, self.default_weight)
            self.counters[tenant] = self.counters.get(tenant, 0.0) + cost / weight

    def share(self, tenant: str, backlogged: Collection[str]) -> float | None:
        weights = self.weights
        default = self.default_weight
        total = sum(weights.get(other, default) for other in backlogged)
        return weights.get(tenant, default) / total if total > 0 else None

    def displaces(self, tenant: str, waiting: int, other: str, other_waiting: int) -> bool:
        """Fair sharing starts the ``waiting + 1``-th request of ``tenant`` before the ``other_waiting``-th of
        ``other`` when it has fewer waiting per weight (their counters meet once both are backlogged)."""
        return (waiting + 1) / self.weight(tenant) < other_waiting / self.weight(other)

    def _forget(self, keep: Collection[str]) -> None:
        """Make room for a new tenant: drop the least served one not waiting (it is lifted when it returns)."""
        idle = [name for name in self.counters if name not in keep]
        if idle:
            del self.counters[min(idle, key=self.counters.__getitem__)]
