"""``gie-lora-affinity``: the Gateway API Inference Extension's endpoint picker with LoRA affinity.

Scores (weights from config, defaults queue 2, KV cache 2, LoRA affinity 1; picker: max total,
ties uniformly at random):

* queue: ``(max - q) / (max - min)`` over the candidates (all equal: 1), ``q`` the pod's scraped
  waiting requests while fresh, else the router's in-flight count for that pod.
* KV cache: ``1 - kv_cache_used_fraction`` while fresh, 0.5 when unknown.
* LoRA affinity, GIE's ladder: 1.0 if the adapter is *active* on the pod (requests of ours in
  flight there), 0.8 if the pod has a free adapter slot (its cache could store the adapter now,
  evicting only idle ones), 0.6 if the adapter is waiting on the pod, else 0. GIE learns adapters
  only from vLLM's running/waiting lists, so an idle adapter still resident in the cache counts
  as absent (llm-d-router issue 2605); that blindness is reproduced on purpose. TRT-LLM never
  queues a request for want of an adapter slot (a full cache rejects it), so no adapter is ever
  "waiting" and the 0.6 rung cannot fire; it is kept for parity. Base-model requests: 1.0 everywhere.
"""

from __future__ import annotations

from pydantic import Field

from trtfleet.api.common import ApiModel
from trtfleet_router.routing.config import RoutingConfig
from trtfleet_router.routing.framework import (
    MaxScorePicker,
    Profile,
    RoutingContext,
    WeightedScorer,
    min_max_inverse,
)

SECTION = "gie_lora_affinity"
NAME = "gie-lora-affinity"

ACTIVE_SCORE = 1.0
FREE_SLOT_SCORE = 0.8
WAITING_SCORE = 0.6
ABSENT_SCORE = 0.0
UNKNOWN_KV_SCORE = 0.5


class QueueScorer:
    name = "queue"

    def score(self, ctx: RoutingContext, candidates: list[int]) -> list[float]:
        now_s = ctx.now_s
        queues = []
        for i in candidates:
            load = ctx.pods[i].load
            waiting = load.waiting(now_s)
            queues.append(load.inflight if waiting is None else waiting)
        return min_max_inverse(queues)


class KvCacheScorer:
    name = "kv-cache"

    def score(self, ctx: RoutingContext, candidates: list[int]) -> list[float]:
        now_s = ctx.now_s
        scores = []
        for i in candidates:
            used = ctx.pods[i].load.kv_used(now_s)
            scores.append(UNKNOWN_KV_SCORE if used is None else min(1.0, max(0.0, 1.0 - used)))
        return scores


class LoraAffinityScorer:
    name = "lora-affinity"

    def score(self, ctx: RoutingContext, candidates: list[int]) -> list[float]:
        adapter = ctx.request.adapter
        if adapter is None:
            return [ACTIVE_SCORE] * len(candidates)
        task_id, pages = adapter.task_id, adapter.pages
        scores = []
        for i in candidates:
            residency = ctx.pods[i].residency
            if residency.is_active(task_id):
                scores.append(ACTIVE_SCORE)
            elif residency.has_evictable_slot(pages):
                scores.append(FREE_SLOT_SCORE)
            else:
                scores.append(ABSENT_SCORE)
        return scores


class GieLoraAffinityConfig(ApiModel):
    """Gateway API Inference Extension scorer weights."""

    queue_weight: float = Field(default=2.0, ge=0, description="Weight of the queue-depth scorer.")
    kv_cache_weight: float = Field(default=2.0, ge=0, description="Weight of the KV-cache-use scorer.")
    lora_affinity_weight: float = Field(default=1.0, ge=0, description="Weight of the LoRA affinity scorer.")


def build(config: RoutingConfig) -> Profile:
    weights = config.section(SECTION, GieLoraAffinityConfig)
    return Profile(
        NAME,
        scorers=[
            WeightedScorer(QueueScorer(), weights.queue_weight),
            WeightedScorer(KvCacheScorer(), weights.kv_cache_weight),
            WeightedScorer(LoraAffinityScorer(), weights.lora_affinity_weight),
        ],
        picker=MaxScorePicker(),
        retry_after_s=config.no_capacity_retry_after_s,
    )
