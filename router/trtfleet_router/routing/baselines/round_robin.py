"""``round-robin``: what a plain Kubernetes Service does, the baseline that knows nothing.

Scores: none. Picker: the next candidate in rotation (a counter over the candidate list), ignoring
adapters and load. Weights are sent whenever the pod's shadow cache says the adapter is cold
(the fleet decides that for every policy).
"""

from __future__ import annotations

from trtfleet_router.routing.config import RoutingConfig
from trtfleet_router.routing.framework import Profile, RoutingContext

NAME = "round-robin"


class RoundRobinPicker:
    name = "rotation"

    def __init__(self) -> None:
        self._next = 0

    def pick(self, ctx: RoutingContext, candidates: list[int], scores: list[float]) -> int:
        position = self._next % len(candidates)
        self._next = position + 1
        return position


def build(config: RoutingConfig) -> Profile:
    return Profile(NAME, picker=RoundRobinPicker(), retry_after_s=config.no_capacity_retry_after_s)
