"""The ``autoscaling`` part of a BaseModel spec and status (re-exported by :mod:`trtfleet.api.basemodel`).

With ``spec.autoscaling`` set, ``spec.serving.replicas`` is the operator's to set: every decision writes
it (through the same field the ``scale`` subresource exposes), within ``[minReplicas, maxReplicas]``. The
decision itself is :func:`trtfleet.autoscaling.decide`; ``status.autoscaling`` keeps what it needs across
operator restarts (the recent recommendations of the stabilisation windows).
"""

from __future__ import annotations

from pydantic import Field, model_validator

from trtfleet.api.common import ApiModel

REPLICAS_MAX = 1024
TARGET_REQUESTS_PER_POD_DEFAULT = 8.0
WINDOW_SECONDS_MAX = 86_400
RANGE_MESSAGE = "autoscaling.minReplicas must not exceed autoscaling.maxReplicas"
REPLICAS_RANGE_MESSAGE = (
    "with autoscaling set, serving.replicas is the operator's to set and must lie within "
    "[autoscaling.minReplicas, autoscaling.maxReplicas]: write a value in that range (or leave it to the operator)"
)
REPLICAS_RANGE_RULE = (
    "!has(self.autoscaling) || (self.serving.replicas >= self.autoscaling.minReplicas && "
    "self.serving.replicas <= self.autoscaling.maxReplicas)"
)


class AutoscalingSpec(ApiModel):
    """Demand-driven sizing of the serving fleet; every target is per pod, over the summed signals of all
    router replicas and serving pods (see docs/operations.md, "Autoscaling")."""

    min_replicas: int = Field(
        default=1,
        ge=0,
        le=REPLICAS_MAX,
        description="Fewest serving pods. 0 allows scale to zero: the router holds requests while no pod is "
        "ready and the operator scales from zero on any held request.",
    )
    max_replicas: int = Field(ge=1, le=REPLICAS_MAX, description="Most serving pods.")
    target_requests_per_pod: float = Field(
        default=TARGET_REQUESTS_PER_POD_DEFAULT,
        gt=0,
        le=100_000,
        description="Requests in flight or waiting (in the routers, held for a pod, or queued in a pod) per pod.",
    )
    target_kv_cache_fraction: float | None = Field(
        default=0.8,
        gt=0,
        le=1,
        description="KV-cache blocks in use per pod, as a fraction of its blocks (from the pods' own metrics); "
        "unset: not a target.",
    )
    adapter_working_set: bool = Field(
        default=True,
        description="Keep enough pods that the LoRA cache pages the adapters in flight need fit in the pods' "
        "device tiers (pages per pod from status.capacity.loraDevicePages): each adapter's pages weighted by "
        "how likely it is in flight, from its share of the requests in the router's window.",
    )
    scale_up_stabilization_seconds: int = Field(
        default=0,
        ge=0,
        le=WINDOW_SECONDS_MAX,
        description="Scale up only to the lowest recommendation of this window (0: at once).",
    )
    scale_down_stabilization_seconds: int = Field(
        default=300,
        ge=0,
        le=WINDOW_SECONDS_MAX,
        description="Scale down only to the highest recommendation of this window, so a noisy signal does not "
        "flap the fleet.",
    )
    scale_to_zero_after_seconds: int = Field(
        default=600,
        ge=0,
        le=WINDOW_SECONDS_MAX,
        description="With minReplicas 0: go to zero pods after this long without any demand (nothing in "
        "flight, waiting or held).",
    )

    model_config = ApiModel.model_config | {
        "json_schema_extra": {
            "x-kubernetes-validations": [
                {"rule": "self.minReplicas <= self.maxReplicas", "message": RANGE_MESSAGE, "fieldPath": ".minReplicas"}
            ]
        }
    }

    @model_validator(mode="after")
    def _range(self) -> AutoscalingSpec:
        if self.min_replicas > self.max_replicas:
            raise ValueError(RANGE_MESSAGE)
        return self


class Recommendation(ApiModel):
    """One change of the raw recommendation: from ``time`` on, ``replicas`` pods were recommended."""

    time: str = Field(description="RFC 3339 time of the change.")
    replicas: int = Field(ge=0, description="Pods the signals asked for from then on (0: no demand at all).")


class DemandStatus(ApiModel):
    """The signals of the last decision (summed over router replicas and serving pods)."""

    requests: float = Field(ge=0, description="Requests in flight, waiting or held.")
    held_requests: float = Field(default=0, ge=0, description="Of them, held in routers for want of a ready pod.")
    kv_cache_fraction: float | None = Field(default=None, ge=0, description="Mean KV-cache use of ready pods.")
    active_adapter_pages: int | None = Field(
        default=None, ge=0, description="LoRA cache pages the adapters in flight need (demand-weighted)."
    )
    sources: int = Field(default=0, ge=0, description="Router replicas and pods whose metrics were read.")


class AutoscalingStatus(ApiModel):
    desired_replicas: int | None = Field(default=None, ge=0, description="Pods the last decision asked for.")
    current_replicas: int | None = Field(default=None, ge=0, description="Pods running when it was taken.")
    last_scale_time: str | None = Field(default=None, description="RFC 3339 time replicas last changed.")
    last_demand: DemandStatus | None = Field(default=None, description="The signals of the last decision.")
    scale_up_time: str | None = Field(
        default=None,
        description="RFC 3339 time of the scale-up decision whose first new pod is not ready yet (cleared when "
        "one is, or when a scale-down to the ready pods makes the wait moot).",
    )
    last_cold_start_seconds: float | None = Field(
        default=None,
        ge=0,
        description="Cold start of the last scale-up: seconds from the decision to the first pod that turned "
        "ready after it (its Ready condition's lastTransitionTime).",
    )
    recommendations: list[Recommendation] | None = Field(
        default=None,
        max_length=256,
        description="Recent raw recommendations (changes only), what the stabilisation windows and the "
        "scale-to-zero delay read; kept here so an operator restart loses nothing.",
    )
