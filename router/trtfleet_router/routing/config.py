"""The router's routing configuration file (YAML), with defaults for everything.

Example (camelCase or snake_case keys; every key optional)::

    policy: ttft-cost           # trtfleet's: ttft-cost (default), tiered-cost, adapter-affinity; for comparison
                                # (routing/baselines): round-robin, least-load, gie-lora-affinity, chwbl,
                                # llmd-default, kubeai-prefix-hash, dynamo-kv, dynamo-hrw
    metricsStaleAfterS: 5
    capacityWaitS: 10           # wait for LoRA cache capacity before answering 503
    demandHalfLifeS: 60         # recent-request counts per adapter (every policy's fleet keeps them)
    placement: {enabled: true, minHostCopies: 2, prefetch: {linkShare: 0.25}}  # routing/placement.py
    prefix: {podKvBlocks: 13000}  # KV-cache blocks per pod when the capacity plan does not say
    outlierDetection: {consecutiveFailures: 3, baseEjectionTimeS: 5, maxEjectionPercent: 50}
    batchReserve: {busyShare: 0.01, holdS: 30}  # with --batch-reserve-pods (routing/reserve.py)
    streamTimeouts: {firstTokenS: 60, interTokenS: 20}
    streamTimeoutsByModel: {llama-70b: {firstTokenS: 180}}
    ttftCost:
      loadBoundInflight: 12     # keep it below the engine's max batch size (see its description)
      linkBandwidthBytesPerS: 1.25e9
      loadOverheadS: 0.005      # a cold load's fixed cost (podReadOverheadS on pytorch): python -m bench.coldload
    chwbl: {loadFactor: 1.25, virtualNodes: 256}
    gieLoraAffinity: {queueWeight: 2, kvCacheWeight: 2, loraAffinityWeight: 1}
    tenancy: {saturation: {inflightPerPod: 8}, tenants: {chat: {weight: 3, priority: critical}}}  # routing/tenancy.py

This module holds the settings every policy shares; each policy's block is its own model, in its module
under ``policies/``, and the registry (``policies/__init__.py``) validates the blocks and the policy name.
An unknown key or policy name fails when the file is loaded, i.e. at start-up.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any, Final, TypeVar

import pydantic
import yaml
from pydantic import Field, model_validator
from pydantic.alias_generators import to_snake

from trtfleet.api.common import ApiModel
from trtfleet_router.routing.outlier import OutlierDetectionConfig
from trtfleet_router.routing.placement import PlacementConfig
from trtfleet_router.routing.tenancy import TenancyConfig
from trtfleet_router.routing.types import RoutingConfigError

DEFAULT_POLICY = "ttft-cost"
SectionT = TypeVar("SectionT", bound=pydantic.BaseModel)
RESERVE_HOLD_S: Final = 30.0  # ReserveConfig.hold_s's default
RESERVE_BUSY_SHARE: Final = 0.01  # ReserveConfig.busy_share's default


class StreamTimeouts(ApiModel):
    """How long a pod may stay silent on one request before the router gives up on it there."""

    first_token_s: float = Field(
        default=60.0,
        gt=0,
        description="Longest wait for a request's first answer from its pod (queueing plus "
        "prefill). Past it the pod counts one failure and the request is retried on another pod (it has no "
        "token yet, so nothing is lost). For a unary upstream answer (no streaming) the wait is "
        "``firstTokenS + maxTokens x interTokenS``. Raise it for long prompts or deep engine queues.",
    )
    inter_token_s: float = Field(
        default=20.0,
        gt=0,
        description="Longest gap between two answers of a streamed request. Past it the pod "
        "counts one failure and the stream ends with an error event (its tokens were already sent).",
    )


class PrefixConfig(ApiModel):
    """The per-pod KV-cache prefix index every policy's fleet keeps (``routing/prefixindex.py``)."""

    pod_kv_blocks: int = Field(
        default=13_000,
        ge=0,
        description="KV-cache capacity of a pod in blocks when the BaseModel's capacity plan does not give it "
        "(status.capacity.kvCacheTokens / tokens per block). 13,000 blocks of 32 tokens: Llama-3-8B fp16 on one "
        "H100 (about 420,000 tokens). 0 turns the modelled index off (events still fill it).",
    )


class ReserveConfig(ApiModel):
    """How the reserve of ``--batch-reserve-pods`` holds and, with ``auto``, how large it is (the routing file's
    ``batchReserve``; the count itself is the router flag)."""

    busy_share: float = Field(
        default=RESERVE_BUSY_SHARE,
        gt=0,
        lt=1,
        description="With ``--batch-reserve-pods auto``: the largest share of interactive requests that may find "
        "every reserved pod busy (each of those shares a pod and waits for another request's step). Smaller "
        "reserves more pods: 0.01 keeps that tail out of the interactive p99; 0.05 would leave it in the p95.",
    )
    hold_s: float = Field(
        default=RESERVE_HOLD_S,
        ge=0,
        description="How long after the last interactive request this router started the reserve keeps holding "
        "(another replica's interactive requests in flight hold it too); past it a batch takes every pod. "
        "Longer keeps the pods free through longer pauses in interactive traffic, at the batch's cost.",
    )


class RoutingConfig(ApiModel):
    policy: str = Field(default=DEFAULT_POLICY, description="Routing policy name.")
    metrics_stale_after_s: float = Field(
        default=5.0, gt=0, description="Scraped pod metrics older than this are unknown."
    )
    cache_full_backoff_s: float = Field(
        default=2.0,
        ge=0,
        description="After a pod answers 'cache full', no cold loads go there for this long.",
    )
    no_capacity_retry_after_s: float = Field(
        default=1.0, gt=0, description="Retry-After when no pod can take a request."
    )
    capacity_wait_s: float = Field(
        default=10.0,
        ge=0,
        description="How long a request may wait in the router when every pod's LoRA cache "
        "is full of busy adapters (TRT-LLM would answer 'Cache is full'), re-routed each time a request of its "
        "base model ends, before the router answers 503. 0: answer 503 at once. Capped by the request deadline.",
    )
    capacity_queue_max: int = Field(
        default=1024,
        ge=0,
        description="Requests per base model that may wait for LoRA cache capacity at once; "
        "beyond it the router answers 503 at once.",
    )
    hold_wait_s: float = Field(
        default=0.0,
        ge=0,
        description="How long a request may be held when its base model has no ready pod (scaled to zero, or "
        "its first pods starting), released as soon as one is ready, before the router answers 503. Its held "
        "requests are the demand that scales the base model from zero. 0: answer 503 at once. Capped by the "
        "request deadline.",
    )
    hold_queue_max: int = Field(
        default=1024,
        ge=0,
        description="Requests per base model that may be held for a pod at once; beyond it the router answers "
        "503 at once.",
    )
    hold_release_per_pod: float = Field(
        default=8.0,
        ge=0,
        description="Held requests go to a base model's pods as they turn ready, oldest first, while the "
        "requests in flight there (every replica's) stay under this many per ready pod; the rest follow as "
        "requests end. A BaseModel's spec.autoscaling.targetRequestsPerPod replaces it for that base model. "
        "0: release every held request at once.",
    )
    outlier_detection: OutlierDetectionConfig = Field(
        default_factory=OutlierDetectionConfig, description="When a failing pod is ejected, and for how long."
    )
    batch_reserve: ReserveConfig = Field(
        default_factory=ReserveConfig,
        description="With ``--batch-reserve-pods``: how long the pods kept free of batch lines stay kept after "
        "the last interactive request, and how many ``auto`` keeps.",
    )
    stream_timeouts: StreamTimeouts = Field(
        default_factory=StreamTimeouts, description="First-token and inter-token timeouts of every base model."
    )
    stream_timeouts_by_model: dict[str, StreamTimeouts] = Field(
        default_factory=dict, description="Per base model (by name): timeouts that replace ``streamTimeouts``."
    )
    demand_half_life_s: float = Field(
        default=60.0, gt=0, description="Half-life of the recent-request count (per adapter, every policy)."
    )
    prefix: PrefixConfig = Field(
        default_factory=PrefixConfig, description="The per-pod KV-cache prefix index (every policy's fleet)."
    )
    placement: PlacementConfig = Field(
        default_factory=PlacementConfig,
        description="Fleet-level placement of adapters in the pods' host tiers from their demand forecast, and "
        "the prefetches that carry it out (routing/placement.py; off by default).",
    )
    tenancy: TenancyConfig = Field(
        default_factory=TenancyConfig,
        description="Tenants, their weights and bands, and when requests wait in the router (routing/tenancy.py).",
    )
    hrw_cache_entries: int = Field(
        default=16384,
        ge=16,
        description="Per-adapter rendezvous rankings kept (LRU) until the pod set changes.",
    )
    sections: dict[str, Any] = Field(
        default_factory=dict,
        description="Each policy's own block (``ttftCost:``, ``chwbl:``, ...), keyed by its snake_case name; "
        "validated by the policy registry (routing/policies/__init__.py) against the policy's model.",
    )

    @model_validator(mode="before")
    @classmethod
    def _collect_sections(cls, data: Any) -> Any:
        """Top-level keys that are not common settings are policy blocks: gather them in ``sections``."""
        if not isinstance(data, Mapping):
            return data
        common_keys = set(cls.model_fields) | {f.alias for f in cls.model_fields.values() if f.alias}
        common = {key: value for key, value in data.items() if key in common_keys}
        blocks = {to_snake(str(key)): value for key, value in data.items() if key not in common_keys}
        return {**common, "sections": {**dict(common.pop("sections", None) or {}), **blocks}}

    def timeouts_for(self, base_model: str) -> StreamTimeouts:
        return self.stream_timeouts_by_model.get(base_model, self.stream_timeouts)

    def section(self, name: str, model: type[SectionT]) -> SectionT:
        """The ``name:`` block as ``model`` (its defaults when the file has none)."""
        block = self.sections.get(name)
        return block if isinstance(block, model) else model.model_validate(block or {})


def read_routing_file(path: Path) -> Any:
    """The parsed YAML at ``path`` (validated by :func:`trtfleet_router.routing.policies.parse_routing_config`)."""
    try:
        return yaml.safe_load(path.read_text(encoding="utf-8"))
    except (OSError, yaml.YAMLError) as exc:
        raise RoutingConfigError(f"cannot read routing configuration {path}: {exc}") from exc
