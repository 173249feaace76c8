"""The router's routing core: pure decisions and bookkeeping, no I/O, no clock, no randomness of its own.

Entry points: :class:`Fleet` (one per base model), :func:`build_policy`, :class:`RoutingConfig`.
"""

from trtfleet_router.routing.config import RoutingConfig
from trtfleet_router.routing.fleet import Fleet
from trtfleet_router.routing.framework import Policy
from trtfleet_router.routing.policies import build_policy, load_routing_config, parse_routing_config, policy_names
from trtfleet_router.routing.types import (
    AdapterRef,
    AdapterTooLarge,
    CachesBusy,
    Decision,
    FleetSnapshot,
    NoCapacity,
    Outcome,
    PodInfo,
    PodMetrics,
    PodSnapshot,
    RouteRequest,
    RoutingConfigError,
    RoutingError,
    Ticket,
    UnknownPod,
)

__all__ = [
    "AdapterRef",
    "AdapterTooLarge",
    "CachesBusy",
    "Decision",
    "Fleet",
    "FleetSnapshot",
    "NoCapacity",
    "Outcome",
    "PodInfo",
    "PodMetrics",
    "PodSnapshot",
    "Policy",
    "RouteRequest",
    "RoutingConfig",
    "RoutingConfigError",
    "RoutingError",
    "Ticket",
    "UnknownPod",
    "build_policy",
    "load_routing_config",
    "parse_routing_config",
    "policy_names",
]
