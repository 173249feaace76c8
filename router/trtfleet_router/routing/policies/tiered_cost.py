"""``tiered-cost``: ``ttft-cost`` priced over both LoRA tiers, and following the fleet's placement plan.

The same procedure and cost as :mod:`~trtfleet_router.routing.policies.ttft_cost`, with its tier options on:

* a pod whose host tier holds the adapter but whose device tier does not costs the host-to-device copy
  (weights / ``hostToDeviceBytesPerS``, PCIe Gen5 x16 of an H100: 50 GB/s); a cold load costs its transfer
  over the pod network (weights / ``linkBandwidthBytesPerS``) plus that copy, so a host-resident pod always
  beats one that needs a transfer unless its queue is longer by more than the difference;
* a request whose adapter is host-resident nowhere pays a transfer wherever it goes, and the transfer overlaps
  the queue wait it has there anyway: such cold loads cost ``max(link, queue)``, so it goes where the transfer
  and the queue end soonest (the transfers already on each pod's link counted);
* the pods the placement plans a host copy on (``placement:`` in the routing file) are cold candidates too, so
  the loads that still happen land where the plan keeps the adapter.

Without a placement plan (``placement.enabled: false``) it is ``ttft-cost`` with the copy priced and the
transfer overlapped. Its block is ``tieredCost:`` (``ttftCost``'s fields, these defaults).
"""

from __future__ import annotations

from pydantic import Field

from trtfleet_router.routing.config import RoutingConfig
from trtfleet_router.routing.policies.ttft_cost import TtftCostConfig, TtftCostPolicy

NAME = "tiered-cost"
SECTION = "tiered_cost"
H100_HOST_TO_DEVICE_BYTES_PER_S = 50e9
"""An H100's PCIe Gen5 x16 link: 64 GB/s each way (128 GB/s both, NVIDIA's H100 datasheet); pinned host-to-device
copies reach about 80 % of it (an estimate, not a measurement here: docs/benchmarks/adapters.md)."""


class TieredCostConfig(TtftCostConfig):
    """``ttftCost``'s parameters with the tier options on."""

    host_to_device_bytes_per_s: float | None = Field(
        default=H100_HOST_TO_DEVICE_BYTES_PER_S,
        gt=0,
        description="Bandwidth of a pod's host-to-device copy. 50 GB/s: an H100's PCIe Gen5 x16 (64 GB/s each way "
        "per NVIDIA's datasheet) at about 80 % for pinned copies. None: copies are free.",
    )
    overlap_transfer_with_queue: bool = Field(
        default=True, description="Price a cold load as max(transfer, queue) instead of their sum."
    )
    planned_homes: bool = Field(
        default=True, description="Price the pods where the placement plans a host copy as cold candidates too."
    )


def build(config: RoutingConfig) -> TtftCostPolicy:
    return TtftCostPolicy(config.section(SECTION, TieredCostConfig), config.no_capacity_retry_after_s, NAME)
