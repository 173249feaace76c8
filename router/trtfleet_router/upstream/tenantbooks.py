"""Tenants' books for admission: per base model the tenant order and recent shares, and what each request pays.

:class:`TenantBooks` builds each base model's tenant order (``tenancy.order``: the virtual token counter by
default, ``routing/vtc.py``) and its :class:`~trtfleet_router.routing.tenancy.ServedShares` (what a 429 reports),
classifies requests (:func:`~trtfleet_router.routing.tenancy.classify` over the routing file's ``tenancy`` and the
InferenceObjectives discovery read), and charges tenants: the prompt when a request starts (:meth:`TenantBooks.charge`),
the output as it streams (:class:`OutputMeter`, looked up once per call so each piece costs a few dict updates).
Single-threaded, on the event loop.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Final, Protocol

from trtfleet_router.liveview import FleetSet
from trtfleet_router.metrics import RouterMetrics
from trtfleet_router.routing.fairqueue import TenantOrder
from trtfleet_router.routing.tenancy import DEFAULT_TENANT, RequestClass, ServedShares, TenancyConfig, classify
from trtfleet_router.routing.tenantorders import build_tenant_order
from trtfleet_router.upstream.call import UpstreamCall


class Tally(Protocol):
    """A counter's child: what an output meter increments."""

    def inc(self, amount: float = 1.0) -> None: ...


class OutputMeter:
    """Charges one call's tenant for its output as it streams: everything looked up once, per call."""

    __slots__ = ("_cost", "_counter", "_order", "_shares", "tenant")

    def __init__(
        self, order: TenantOrder | None, shares: ServedShares | None, counter: Tally | None, cost: float,
        tenant: str,
    ) -> None:
        self._order = order
        self._shares = shares
        self._counter = counter
        self._cost = cost
        self.tenant = tenant

    def add(self, output_tokens: int) -> None:
        """``output_tokens`` more of the answer reached its client."""
        if output_tokens <= 0 or self._order is None:
            return
        self._order.charge(self.tenant, 0, output_tokens)
        if self._shares is not None:
            self._shares.add(self.tenant, self._cost * output_tokens)
        if self._counter is not None:
            self._counter.inc(output_tokens)


NO_METER: Final = OutputMeter(None, None, None, 0.0, DEFAULT_TENANT)


class TenantBooks:
    def __init__(self, fleets: FleetSet, metrics: RouterMetrics, now: Callable[[], float] = time.monotonic) -> None:
        self.fleets = fleets
        self.metrics = metrics
        self._now = now
        self._orders: dict[str, TenantOrder] = {}
        self._shares: dict[str, ServedShares] = {}

    @property
    def tenancy(self) -> TenancyConfig:
        return self.fleets.routing_config.tenancy

    def order(self, base_model: str) -> TenantOrder:
        """The base model's tenant order (one per base model: its fleet is what the tenants share)."""
        order = self._orders.get(base_model)
        if order is None:
            order = self._orders[base_model] = build_tenant_order(self.tenancy)
        return order

    def classify(
        self,
        tenant: str,
        *,
        adapter: str | None = None,
        objective: str | None = None,
        requested: float | None = None,
        batch: bool = False,
    ) -> RequestClass:
        """The tenant and band of a request (:func:`~trtfleet_router.routing.tenancy.classify` over the routing
        file's ``tenancy`` and the InferenceObjectives read from Kubernetes)."""
        return classify(
            self.tenancy,
            tenant,
            adapter=adapter,
            objective=objective,
            objective_priorities=self.fleets.objective_priorities,
            requested=requested,
            batch=batch,
        )

    def charge(self, base_model: str, tenant: str, *, input_tokens: int = 0, output_tokens: int = 0) -> None:
        """Tokens served to ``tenant`` on ``base_model``: its counter in the tenant order, its recent share, the
        served-tokens metric."""
        if not (input_tokens or output_tokens):
            return
        self.order(base_model).charge(tenant, input_tokens, output_tokens)
        tenancy = self.tenancy
        self.shares(base_model).add(
            tenant, tenancy.input_token_cost * input_tokens + tenancy.output_token_cost * output_tokens
        )
        label = self.metrics.tenant_label(tenant)
        if input_tokens:
            self.metrics.tenant_tokens.labels(base_model, label, "input").inc(input_tokens)
        if output_tokens:
            self.metrics.tenant_tokens.labels(base_model, label, "output").inc(output_tokens)

    def shares(self, base_model: str) -> ServedShares:
        shares = self._shares.get(base_model)
        if shares is None:
            shares = self._shares[base_model] = ServedShares(self._now)
        return shares

    def meter(self, call: UpstreamCall) -> OutputMeter:
        """What charges ``call``'s tenant for its output as it streams (a prewarming call is nobody's)."""
        if call.pinned_decision is not None:
            return NO_METER
        base = call.target.base.name
        tenant = call.tenant
        counter = self.metrics.tenant_tokens.labels(base, self.metrics.tenant_label(tenant), "output")
        return OutputMeter(self.order(base), self.shares(base), counter, self.tenancy.output_token_cost, tenant)

    def over_share(self, base_model: str, tenant: str) -> tuple[float, float] | None:
        """``(served share, weight share)`` of ``tenant`` lately when it received more than its weight's share."""
        shares = self._shares.get(base_model)
        return shares.over_share(tenant, self.weight) if shares is not None else None

    def weight(self, tenant: str) -> float:
        tenancy = self.tenancy
        spec = tenancy.tenants.get(tenant)
        return spec.weight if spec is not None else tenancy.default_weight
