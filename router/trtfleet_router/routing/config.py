"""The router's routing configuration file (YAML), with defaults for everything.

Example (camelCase or snake_case keys; every key optional)::

    policy: trtfleet            # round-robin | least-load | gie-lora-affinity | chwbl | trtfleet
    metricsStaleAfterS: 5
    capacityWaitS: 10           # wait for LoRA cache capacity before answering 503
    outlierDetection: {consecutiveFailures: 3, baseEjectionTimeS: 5, maxEjectionPercent: 50}
    streamTimeouts: {firstTokenS: 60, interTokenS: 20}
    streamTimeoutsByModel: {llama-70b: {firstTokenS: 180}}
    trtfleet:
      loadBoundInflight: 12     # keep it below the engine's max batch size (see its description)
      linkBandwidthBytesPerS: 1.25e9
    chwbl: {loadFactor: 1.25, virtualNodes: 256}
    gieLoraAffinity: {queueWeight: 2, kvCacheWeight: 2, loraAffinityWeight: 1}

An unknown key or policy name fails when the file is loaded, i.e. at start-up.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml
from pydantic import Field, ValidationError, field_validator

from trtfleet.api.common import ApiModel
from trtfleet_router.routing.outlier import OutlierDetectionConfig
from trtfleet_router.routing.types import RoutingConfigError

DEFAULT_POLICY = "trtfleet"


class TrtfleetPolicyConfig(ApiModel):
    """Parameters of the default ``trtfleet`` policy (see ``policies/trtfleet.py``)."""

    load_bound_inflight: int = Field(
        default=12,
        ge=0,
        description="A warm pod is preferred while its load exceeds the least-loaded "
        "candidate's by at most this many requests (in-flight + scraped waiting). Keep it well below the engine's "
        "max batch size: beyond it requests queue behind a full batch for a whole service time (12 suits batches "
        "of 64 and more; the real-run benchmark with max batch 8 uses 4).",
    )
    link_bandwidth_bytes_per_s: float = Field(
        default=1.25e9,
        gt=0,
        description="Assumed bandwidth of a cold load. Weights travel router -> pod "
        "inside the gRPC request over the pod network (10 GbE = 1.25 GB/s, and about what Python protobuf "
        "serialisation sustains); the pod's pinned-host -> GPU copy over PCIe (~25 GB/s) is never the "
        "narrow link, so the network is what a cold load costs.",
    )
    pod_read_bytes_per_s: float = Field(
        default=5e8,
        gt=0,
        description="Assumed speed of a cold load on runtime pytorch, where the pod reads the adapter's PEFT "
        "directory from its volume (nothing travels with the request): a shared volume (NFS, a PVC) read plus "
        "the PEFT-to-TRT-LLM conversion on the pod, about 0.5 GB/s.",
    )
    queue_delay_per_inflight_s: float = Field(
        default=0.05,
        gt=0,
        description="Delay one more request ahead on a pod adds to a new one: about a "
        "request's service time (~6 s) over the batch it shares (~128) in in-flight batching.",
    )
    hot_spread_inflight_per_pod: int = Field(
        default=4,
        ge=1,
        description="When an adapter's own in-flight requests per warm pod reach this, "
        "the next pod in its rendezvous ranking may take it (cold) if that is cheaper.",
    )
    home_pods: int = Field(
        default=2,
        ge=1,
        description="Pods at the head of an adapter's rendezvous ranking (among those "
        "that can take it now) where a cold load may go if it evicts nothing more popular.",
    )
    rare_recent_requests: float = Field(
        default=2.0,
        ge=0,
        description="An adapter with fewer decayed recent requests than this is rare: any cold load may evict it.",
    )
    demand_half_life_s: float = Field(default=60.0, gt=0, description="Half-life of the recent-request count.")
    churn_pod_fraction: float = Field(
        default=0.25,
        gt=0,
        le=1,
        description="Share of pods (at least one) that take rare adapters' cold "
        "loads, chosen by rendezvous hashing so every replica picks the same ones.",
    )
    hrw_cache_entries: int = Field(
        default=16384,
        ge=16,
        description="Per-adapter rendezvous rankings kept (LRU) until the pod set changes.",
    )


class ChwblConfig(ApiModel):
    """KubeAI-style consistent hashing with bounded loads."""

    load_factor: float = Field(default=1.25, ge=1.0, description="Bound: in-flight <= factor x mean.")
    virtual_nodes: int = Field(default=256, ge=1, le=4096, description="Ring points per pod.")


class GieLoraAffinityConfig(ApiModel):
    """Gateway API Inference Extension scorer weights."""

    queue_weight: float = Field(default=2.0, ge=0, description="Weight of the queue-depth scorer.")
    kv_cache_weight: float = Field(default=2.0, ge=0, description="Weight of the KV-cache-use scorer.")
    lora_affinity_weight: float = Field(default=1.0, ge=0, description="Weight of the LoRA affinity scorer.")


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
    outlier_detection: OutlierDetectionConfig = Field(
        default_factory=OutlierDetectionConfig, description="When a failing pod is ejected, and for how long."
    )
    stream_timeouts: StreamTimeouts = Field(
        default_factory=StreamTimeouts, description="First-token and inter-token timeouts of every base model."
    )
    stream_timeouts_by_model: dict[str, StreamTimeouts] = Field(
        default_factory=dict, description="Per base model (by name): timeouts that replace ``streamTimeouts``."
    )
    trtfleet: TrtfleetPolicyConfig = Field(default_factory=TrtfleetPolicyConfig)
    chwbl: ChwblConfig = Field(default_factory=ChwblConfig)
    gie_lora_affinity: GieLoraAffinityConfig = Field(default_factory=GieLoraAffinityConfig)

    def timeouts_for(self, base_model: str) -> StreamTimeouts:
        return self.stream_timeouts_by_model.get(base_model, self.stream_timeouts)

    @field_validator("policy")
    @classmethod
    def _known_policy(cls, name: str) -> str:
        from trtfleet_router.routing.framework import policy_names  # the registry imports this module

        if name not in policy_names():
            raise ValueError(f"unknown routing policy {name!r}; known: {', '.join(policy_names())}")
        return name


def parse_routing_config(data: Any) -> RoutingConfig:
    """A config from parsed YAML/JSON (None or empty: all defaults)."""
    try:
        return RoutingConfig.model_validate(data or {})
    except ValidationError as exc:
        raise RoutingConfigError(f"invalid routing configuration: {exc}") from exc


def load_routing_config(path: Path) -> RoutingConfig:
    """Read and validate the YAML file at ``path``."""
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
    except (OSError, yaml.YAMLError) as exc:
        raise RoutingConfigError(f"cannot read routing configuration {path}: {exc}") from exc
    return parse_routing_config(data)
