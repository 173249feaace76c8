"""``llmd-default``: llm-d's default scheduling profile, re-implemented (a baseline for the prefix benchmark).

Source: the default ``EndpointPickerConfig`` of llm-d's endpoint picker (``default-plugins.yaml`` of the Gateway
API Inference Extension picker that moved to llm-d/llm-d-router), as mirrored verbatim at
otterscale ``modelservice`` (file id 53133309779 in the code index): profile ``default`` with
``queue-scorer`` weight 2, ``kv-cache-utilization-scorer`` weight 2, ``prefix-cache-scorer`` weight 3 and a
max-score picker; the LoRA-affinity scorer is not in the default profile (weight 0 here, settable).

Scores, each in [0, 1], summed with their weights; the highest total wins (ties at random):

* queue: min-max inverse of the scraped waiting queue (the router's in-flight count when not scraped);
* KV-cache use: ``1 - used fraction`` (0.5 when unknown);
* prefix: the share of the request's blocks the pod holds as a prefix, from the same per-pod prefix index
  every policy's fleet keeps (llm-d's approximate prefix scorer learns from its own routing as well);
* LoRA affinity (weight 0 by default): GIE's 1.0 active / 0.8 free slot / 0 absent.
"""

from __future__ import annotations

from pydantic import Field

from trtfleet.api.common import ApiModel
from trtfleet_router.routing.baselines.gie_lora_affinity import KvCacheScorer, LoraAffinityScorer, QueueScorer
from trtfleet_router.routing.config import RoutingConfig
from trtfleet_router.routing.framework import MaxScorePicker, Profile, RoutingContext, WeightedScorer

SECTION = "llmd_default"
NAME = "llmd-default"


class PrefixShareScorer:
    """Leading blocks of the request the pod holds over the request's blocks (0 without blocks)."""

    name = "prefix-cache"

    def score(self, ctx: RoutingContext, candidates: list[int]) -> list[float]:
        total = len(ctx.request.blocks.hashes)
        if not total:
            return [0.0] * len(candidates)
        matches = ctx.prefix_matches()
        return [matches.get(ctx.pods[i].pod_id, 0) / total for i in candidates]


class LlmdDefaultConfig(ApiModel):
    """Scorer weights of llm-d's default profile."""

    queue_weight: float = Field(default=2.0, ge=0, description="Weight of the queue scorer.")
    kv_cache_weight: float = Field(default=2.0, ge=0, description="Weight of the KV-cache-use scorer.")
    prefix_weight: float = Field(default=3.0, ge=0, description="Weight of the prefix-cache scorer.")
    lora_affinity_weight: float = Field(default=0.0, ge=0, description="Weight of the LoRA affinity scorer.")


def build(config: RoutingConfig) -> Profile:
    weights = config.section(SECTION, LlmdDefaultConfig)
    return Profile(
        NAME,
        scorers=[
            WeightedScorer(QueueScorer(), weights.queue_weight),
            WeightedScorer(KvCacheScorer(), weights.kv_cache_weight),
            WeightedScorer(PrefixShareScorer(), weights.prefix_weight),
            WeightedScorer(LoraAffinityScorer(), weights.lora_affinity_weight),
        ],
        picker=MaxScorePicker(),
        retry_after_s=config.no_capacity_retry_after_s,
        uses_prefix=True,
    )
