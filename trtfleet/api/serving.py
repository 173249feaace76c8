"""The ``serving`` part of a BaseModel spec: how its serving pods run (re-exported by
:mod:`trtfleet.api.basemodel`)."""

from __future__ import annotations

from enum import StrEnum
from typing import Any, Literal

from pydantic import Field, field_validator

from trtfleet.api.common import ApiModel, Quantity


class BatchSchedulerPolicy(StrEnum):
    GUARANTEED_NO_EVICT = "guaranteedNoEvict"
    MAX_UTILIZATION = "maxUtilization"


class WaitingQueuePolicy(StrEnum):
    """How a trtllm-serve pod orders the requests it queues (``scheduler_config.waiting_queue_policy``)."""

    FCFS = "fcfs"
    """First come, first served (TRT-LLM's default)."""
    PRIORITY = "priority"
    """By each request's ``priority`` (higher first, then arrival): the router sends each request's band."""


class ServingServer(StrEnum):
    """The server a ``pytorch`` BaseModel's pods run (other runtimes always run Triton)."""

    TRTLLM_SERVE = "trtllm-serve"
    """TRT-LLM's OpenAI-compatible HTTP server."""
    TRITON = "triton"
    """Triton with TRT-LLM's Python-backend ``llmapi`` model (``tensorrt_llm``): KServe v2 HTTP/gRPC, metrics."""


class RolloutStrategy(StrEnum):
    """How a serving Deployment replaces its pods when the engine, image or a serving knob changes."""

    SURGE = "Surge"
    """New pods first (maxSurge = pods, maxUnavailable 0): full capacity throughout; needs free GPUs."""
    REPLACE = "Replace"
    """Old pods first (maxSurge 0, maxUnavailable = pods): no spare GPU needed; capacity dips meanwhile."""


class RolloutSpec(ApiModel):
    strategy: RolloutStrategy = Field(
        default=RolloutStrategy.SURGE,
        description="Surge: each step starts new pods before old ones stop; it needs pods x engine.gpu.count "
        "free GPUs on nodes the pods fit, or the new pod stays Pending and the rollout stalls (a full GPU pool). "
        "Replace: each step stops old pods first and starts their replacements in the freed GPUs; serving "
        "capacity drops by pods / replicas while a replacement loads its model (with 1 replica: an outage).",
    )
    pods: int = Field(
        default=1,
        ge=1,
        le=64,
        description="Pods added (Surge) or taken down (Replace) at once: the Deployment's maxSurge or "
        "maxUnavailable.",
    )


class FailureMode(StrEnum):
    """What a gateway does when the endpoint picker does not answer (GIE's ``endpointPickerRef.failureMode``)."""

    FAIL_OPEN = "FailOpen"
    """Route anyway, without the picker's choice (where the gateway can: see docs/gateway.md)."""
    FAIL_CLOSE = "FailClose"
    """Refuse the request (GIE's default)."""


class GatewaySpec(ApiModel):
    failure_mode: FailureMode = Field(
        default=FailureMode.FAIL_CLOSE,
        description="The InferencePool's endpointPickerRef.failureMode: what the gateway does when trtfleet's "
        "endpoint picker does not answer. FailClose (the Gateway API Inference Extension's default): the request "
        "fails. FailOpen: the gateway picks a pod itself, where it can (plain Envoy cannot under FULL_DUPLEX_STREAMED "
        "bodies; see docs/gateway.md).",
    )


class Toleration(ApiModel):
    key: str | None = Field(default=None, description="Taint key.")
    operator: Literal["Exists", "Equal"] | None = Field(default=None, description="Exists or Equal.")
    value: str | None = Field(default=None, description="Taint value for Equal.")
    effect: Literal["NoSchedule", "PreferNoSchedule", "NoExecute"] | None = Field(default=None)
    toleration_seconds: int | None = Field(default=None, description="For NoExecute: how long to stay bound.")


class Resources(ApiModel):
    requests: dict[str, Quantity] | None = Field(default=None, description="Container resource requests.")
    limits: dict[str, Quantity] | None = Field(default=None, description="Container resource limits.")


KV_FRACTION_MESSAGE = (
    "serving.kvCacheFreeGpuMemFraction must be smaller than 1.0: TRT-LLM's KV cache manager refuses 1.0 "
    "(use e.g. 0.9 and leave the rest for activations)"
)


class ServingSpec(ApiModel):
    replicas: int = Field(default=1, ge=0, le=1024, description="Serving pods (trtllm-serve or Triton) of this model.")
    server: ServingServer | None = Field(
        default=None,
        description="runtime pytorch only: trtllm-serve (the default when unset: OpenAI HTTP on 8000) or triton "
        "(tritonserver with TRT-LLM's llmapi model tensorrt_llm: HTTP 8000, gRPC 8001, metrics 8002). runtime "
        "tensorrtllm and reference always serve with Triton and refuse triton here.",
    )
    kv_cache_free_gpu_mem_fraction: float = Field(
        default=0.9,
        gt=0,
        lt=1,
        description="kv_cache_free_gpu_mem_fraction of the tensorrt_llm Triton model (tensorrtllm), "
        "kv_cache_config.free_gpu_memory_fraction (pytorch); below 1.0 (TRT-LLM's KV cache manager refuses 1.0).",
    )
    enable_kv_cache_reuse: bool | None = Field(
        default=None,
        description="enable_kv_cache_reuse (prefix caching). Unset: tensorrtllm turns it on when the engine has "
        "paged context FMHA (not with an int8 KV cache, nor an fp8 KV cache without fp8 weights); pytorch "
        "(kv_cache_config.enable_block_reuse) turns it on.",
    )
    enable_chunked_context: bool | None = Field(
        default=None,
        description="enable_chunked_context. Unset: tensorrtllm turns it on when the engine has paged context "
        "FMHA (not with an int8 KV cache, nor an fp8 KV cache without fp8 weights); pytorch "
        "(enable_chunked_prefill) turns it on.",
    )
    batch_scheduler_policy: BatchSchedulerPolicy = Field(
        default=BatchSchedulerPolicy.GUARANTEED_NO_EVICT,
        description="batch_scheduler_policy (tensorrtllm). pytorch keeps TRT-LLM's default scheduler "
        "(guaranteed no evict).",
    )
    max_queue_size: int = Field(
        default=256,
        ge=0,
        le=1_000_000,
        description="Requests queued per pod before back-pressure (0 = no limit); Triton's queue policy "
        "(tensorrtllm), the engine's own queue (reference), not passed to trtllm-serve (pytorch).",
    )
    waiting_queue_policy: WaitingQueuePolicy | None = Field(
        default=None,
        description="runtime pytorch only: scheduler_config.waiting_queue_policy of trtllm-serve. priority: the "
        "pod orders its waiting queue by each request's priority, which the router sets from the request's band "
        "(critical 1.0, interactive 0.5, sheddable 0.25, batch 0.0), so a request the pod queues keeps its band "
        "there too. Unset: fcfs (TRT-LLM's default). The router orders its own queues by band either way.",
    )
    max_queue_delay_microseconds: int = Field(
        default=100,
        ge=0,
        le=10_000_000,
        description="Triton batcher delay (tensorrtllm); not used by reference (no Triton batcher) nor "
        "pytorch.",
    )
    chat_template: str | None = Field(
        default=None,
        max_length=65536,
        description="Chat template overriding the architecture's built-in one. Placeholders: {system}, "
        "{messages} rendered per message with {role} and {content}, see docs/concepts.md.",
    )
    replaces: str | None = Field(
        default=None,
        max_length=253,
        pattern=r"^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$",
        description="Name of a BaseModel in this namespace that this one replaces (a migration, e.g. from "
        "runtime tensorrtllm to pytorch): the router answers that BaseModel's name, and the servedNames of "
        "Adapters on both, with this one whenever it has a ready pod, else with the old one; once the old "
        "BaseModel is deleted its name stays an alias of this one. See docs/operations.md.",
    )
    rollout: RolloutSpec | None = Field(
        default=None,
        description="How serving pods are replaced on a change (unset: Surge, one pod at a time). Use Replace "
        "when the GPU pool has no free GPUs for an extra pod. See docs/install-gpu.md.",
    )
    resources: Resources | None = Field(
        default=None,
        description="Resources of the serving container. Unset requests default to nvidia.com/gpu = "
        "engine.gpu.count, cpu = 2 per GPU and memory = lora.cache.hostMemoryBytes (the host LoRA tier, pinned "
        "host memory) plus 16Gi for the serving process; set them here to override.",
    )
    node_selector: dict[str, str] | None = Field(default=None, description="Node selector for serving pods.")
    tolerations: list[Toleration] | None = Field(default=None, description="Tolerations for serving pods.")
    gateway: GatewaySpec | None = Field(
        default=None,
        description="The InferencePool the operator renders for this BaseModel when the chart enables it "
        "(gateway.inferencePool.enabled) and the cluster serves inference.networking.k8s.io/v1; unset: its "
        "defaults. Changes no pod. See docs/operations.md.",
    )

    @property
    def server_or_default(self) -> ServingServer:
        """The server a ``pytorch`` pod runs: ``server``, else trtllm-serve (unset stays out of the spec hash)."""
        return self.server or ServingServer.TRTLLM_SERVE

    @field_validator("kv_cache_free_gpu_mem_fraction", mode="before")
    @classmethod
    def _kv_fraction(cls, value: Any) -> Any:
        # before the ``lt`` check, to say why in TRT-LLM's words rather than pydantic's
        if isinstance(value, int | float) and not isinstance(value, bool) and value >= 1:
            raise ValueError(KV_FRACTION_MESSAGE)
        return value
