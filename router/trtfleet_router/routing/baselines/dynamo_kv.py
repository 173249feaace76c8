"""``dynamo-kv``: NVIDIA Dynamo's KV-router cost, re-implemented (a baseline).

Source: Dynamo's router docs ``docs/router/kv_cache_routing.md`` (ai-dynamo/dynamo, read at the fork
wxsms/dynamo@4f6996c7335ad8f9fbe9b6ec9a145f086d5d0d51): per worker,
``logit = overlap_score_weight x prefill_blocks + decode_blocks``, where ``prefill_blocks`` are the request's
blocks the worker does not hold (its new blocks to compute) and ``decode_blocks`` the blocks of the requests
active on the worker; the lowest logit wins at ``router_temperature`` 0 (the default; ties at random).
``overlap_score_weight`` defaults to 1. Dynamo's router is not adapter-aware for TensorRT-LLM (LoRA "not yet
supported" there), so adapters do not enter the cost; KV blocks are keyed by adapter as everywhere here.

Active blocks are estimated as ``load x mean_active_blocks`` (the routing core counts requests, not their
blocks; ``meanActiveBlocks`` 64 = 2,048 tokens per active request), the request's own blocks from its block
hashes (a request without blocks counts one).
"""

from __future__ import annotations

from collections.abc import Iterable

from pydantic import Field

from trtfleet.api.common import ApiModel
from trtfleet_router.routing.config import RoutingConfig
from trtfleet_router.routing.framework import Choice, RoutingContext
from trtfleet_router.routing.types import NoCapacity

SECTION = "dynamo_kv"
NAME = "dynamo-kv"


class DynamoKvConfig(ApiModel):
    """Dynamo KV-router cost parameters."""

    overlap_score_weight: float = Field(default=1.0, ge=0, description="Weight of the blocks to prefill.")
    mean_active_blocks: float = Field(default=64.0, gt=0, description="KV blocks of one active request.")


class DynamoKvPolicy:
    uses_prefix = True
    def __init__(self, config: DynamoKvConfig) -> None:
        self._config = config

    @property
    def name(self) -> str:
        return NAME

    def pods_changed(self, pod_ids: object) -> None:
        return None

    def choose(self, ctx: RoutingContext) -> Choice:
        return Choice(ctx.pods[lowest_kv_cost(ctx, range(len(ctx.pods)), self._config)], "kv-cost")


def lowest_kv_cost(ctx: RoutingContext, candidates: Iterable[int], config: DynamoKvConfig) -> int:
    """The candidate (index into ``ctx.pods``) with the lowest KV-router logit; ties at random."""
    blocks = max(1, len(ctx.request.blocks.hashes))
    matches = ctx.prefix_matches()
    indices = list(candidates)
    if not indices:
        raise NoCapacity("no candidate pod", 1.0)
    logits = [
        config.overlap_score_weight * (blocks - matches.get(ctx.pods[i].pod_id, 0))
        + ctx.loads[i] * config.mean_active_blocks
        for i in indices
    ]
    low = min(logits)
    tied = [i for i, logit in zip(indices, logits, strict=True) if logit <= low + 1e-9]
    return tied[0] if len(tied) == 1 else tied[ctx.rng.randrange(len(tied))]


def build(config: RoutingConfig) -> DynamoKvPolicy:
    return DynamoKvPolicy(config.section(SECTION, DynamoKvConfig))
