"""``chwbl``: KubeAI's consistent hashing with bounded loads (``loadBalancing: PrefixHash``).

Scores: none; the picker walks a hash ring. Each pod owns ``virtual_nodes`` (256) points at
BLAKE2b-64 of ``pod_id + str(i)``; the request's key is the adapter's name (KubeAI adds the first
100 prompt characters, which the router does not see, so: the adapter alone; base-model requests
hash the empty key). From the key's point clockwise, take the first candidate pod whose load is
acceptable: ``inflight + 1 <= load_factor x (total_inflight + 1) / pods`` (the "+1"s count the new
request; everything is acceptable while nothing is in flight), with in-flight the router's own
count. If none is acceptable, the first candidate on the ring (KubeAI's default endpoint).
KubeAI loads every adapter on every pod, so every pod "has" the adapter; here a pod without it
simply gets the weights.
"""

from __future__ import annotations

import bisect
from collections.abc import Sequence

from pydantic import Field

from trtfleet.api.common import ApiModel
from trtfleet_router.routing.config import RoutingConfig
from trtfleet_router.routing.framework import Profile, RoutingContext
from trtfleet_router.routing.hashing import stable_hash64

SECTION = "chwbl"
NAME = "chwbl"


class BoundedLoadRingPicker:
    name = "bounded-load-ring"

    def __init__(self, load_factor: float, virtual_nodes: int) -> None:
        self._load_factor = load_factor
        self._virtual_nodes = virtual_nodes
        self._points: list[int] = []  # sorted ring positions
        self._owners: list[str] = []  # pod owning each position
        self._pod_count = 0

    def pods_changed(self, pod_ids: Sequence[str]) -> None:
        ring = sorted(
            (stable_hash64(f"{pod_id}{replica}"), pod_id)
            for pod_id in pod_ids
            for replica in range(self._virtual_nodes)
        )
        self._points = [point for point, _pod in ring]
        self._owners = [pod for _point, pod in ring]
        self._pod_count = len(pod_ids)

    def key(self, ctx: RoutingContext) -> str:
        """The request's point on the ring: the adapter's name (the empty key for the base model)."""
        adapter = ctx.request.adapter
        return "" if adapter is None else adapter.name

    def pick(self, ctx: RoutingContext, candidates: list[int], scores: list[float]) -> int:
        position_of = {ctx.pods[i].pod_id: position for position, i in enumerate(candidates)}
        key = self.key(ctx)
        ready = [pod for pod in ctx.by_id.values() if pod.ready]  # KubeAI's endpoints: the ready pods
        total = sum(pod.load.inflight for pod in ready)
        threshold = self._load_factor * (total + 1) / max(1, len(ready))
        points, owners = self._points, self._owners
        size = len(points)
        start = bisect.bisect_left(points, stable_hash64(key)) % size
        default: int | None = None
        seen: set[str] = set()
        for step in range(size):
            owner = owners[(start + step) % size]
            if owner in seen:
                continue
            seen.add(owner)
            position = position_of.get(owner)
            if position is not None:
                if default is None:
                    default = position
                if total == 0 or ctx.by_id[owner].load.inflight + 1 <= threshold:
                    return position
            if len(seen) == self._pod_count:
                break
        return default if default is not None else 0


class ChwblConfig(ApiModel):
    """KubeAI-style consistent hashing with bounded loads."""

    load_factor: float = Field(default=1.25, ge=1.0, description="Bound: in-flight <= factor x mean.")
    virtual_nodes: int = Field(default=256, ge=1, le=4096, description="Ring points per pod.")


def build(config: RoutingConfig) -> Profile:
    ring = config.section(SECTION, ChwblConfig)
    return Profile(
        NAME,
        picker=BoundedLoadRingPicker(ring.load_factor, ring.virtual_nodes),
        retry_after_s=config.no_capacity_retry_after_s,
    )
