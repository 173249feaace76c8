"""The tenant orders by name (``tenancy.order``), built in one place: trtfleet's and the ones kept for comparison."""

from __future__ import annotations

from trtfleet_router.routing.baselines.llmd_flow_control import RoundRobinOrder
from trtfleet_router.routing.fairqueue import ArrivalOrder, TenantOrder
from trtfleet_router.routing.tenancy import TenancyConfig
from trtfleet_router.routing.vtc import VirtualTokenCounters


def build_tenant_order(config: TenancyConfig) -> TenantOrder:
    """A fresh order for one base model (``config.order`` is validated when the routing file is read)."""
    if config.order == "fcfs":
        return ArrivalOrder()
    if config.order == "llmd-round-robin":
        return RoundRobinOrder()
    return VirtualTokenCounters(
        config.weights(),
        default_weight=config.default_weight,
        input_cost=config.input_token_cost,
        output_cost=config.output_token_cost,
        max_tenants=config.max_tenants,
    )
