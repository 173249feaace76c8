"""``least-load``: the pod with the least load, adapters ignored.

Scores: least-load ``(max - load) / (max - min)`` over the candidates (weight 1), where load is the
router's in-flight count plus the pod's scraped waiting queue while the scrape is fresh. Picker:
max score, ties uniformly at random (injected rng).
"""

from __future__ import annotations

from trtfleet_router.routing.config import RoutingConfig
from trtfleet_router.routing.framework import LeastLoadScorer, MaxScorePicker, Profile, WeightedScorer

NAME = "least-load"


def build(config: RoutingConfig) -> Profile:
    return Profile(
        NAME,
        scorers=[WeightedScorer(LeastLoadScorer(), 1.0)],
        picker=MaxScorePicker(),
        retry_after_s=config.no_capacity_retry_after_s,
    )
