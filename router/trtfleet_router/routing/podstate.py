"""One pod as the fleet tracks it: identity, readiness, load, shadow LoRA cache, counters, KV-event state."""

from __future__ import annotations

import math

from trtfleet_router.routing.kvevents import PodEventState
from trtfleet_router.routing.load import PodLoad
from trtfleet_router.routing.residency import PodResidency
from trtfleet_router.routing.types import PodInfo


class PodState:
    """One pod as the fleet tracks it (a :class:`~trtfleet_router.routing.framework.PodView`)."""

    __slots__ = (
        "address",
        "cache_full_total",
        "cache_full_until_s",
        "cold_loads_total",
        "device_pages",
        "discovered_uid",
        "kv_events",
        "failures_total",
        "host_pages",
        "load",
        "misses_total",
        "pod_id",
        "ready",
        "reset_at_s",
        "residency",
        "uid",
        "unready_at_s",
        "warm_routes_total",
    )

    def __init__(self, info: PodInfo, residency: PodResidency) -> None:
        self.pod_id = info.pod_id
        self.address = info.address
        self.discovered_uid = info.uid
        self.uid = info.uid  # identity of this shadow: tickets of an earlier one are ignored
        self.ready = info.ready
        self.host_pages = info.host_pages
        self.device_pages = info.device_pages
        self.residency = residency
        self.reset_at_s = -math.inf  # when its view was last emptied
        self.unready_at_s = -math.inf  # when it last went from ready to not ready
        self.load = PodLoad()
        self.cache_full_until_s = -math.inf
        self.warm_routes_total = 0
        self.cold_loads_total = 0
        self.misses_total = 0
        self.cache_full_total = 0
        self.failures_total = 0
        self.kv_events = PodEventState()
