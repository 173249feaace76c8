"""Merge or hot-swap, measured: ``BaseModel.spec.merging`` and ``Adapter.status.merge``.

The operator reads each adapter's request rate from the routers' demand view, smooths it, and weighs it
against one pod's capacity at this BaseModel's plan (``podRequestsPerSecond``) and the LoRA step overhead a
hot-swapped adapter pays; the result is ``status.merge`` and the ``MergeRecommended`` condition on every
Adapter of the BaseModel (the ``Suggested`` column of ``kubectl get adapters``). Adapters with
``spec.mode: auto`` are switched between dynamic and merged on that advice (``status.merge.mode``), at
most ``maxMergedAdapters`` merged at once and never twice within ``minDwellSeconds``. The decision is
:func:`trtfleet.mergedecision.decide`; docs/concepts.md ("When to merge, when to hot-swap") derives it.
"""

from __future__ import annotations

from enum import StrEnum

from pydantic import Field, model_validator

from trtfleet.api.common import ApiModel

SECONDS_MAX = 7 * 86_400
MERGED_FLEET_SUFFIX = "@merged"
"""The router's fleet of a merged adapter's pods is ``<served name>@merged`` (its demand view's key too)."""
THRESHOLD_MESSAGE = "merging.unmergeBelowPodFraction must be below merging.mergeAbovePodFraction (the hysteresis band)"


class Suggestion(StrEnum):
    MERGED = "Merged"
    DYNAMIC = "Dynamic"
    UNKNOWN = "Unknown"


class MergingSpec(ApiModel):
    """When a dedicated merged Deployment pays for an adapter of this BaseModel, and how ``mode: auto``
    Adapters act on it. Changes no engine and no pod."""

    pod_requests_per_second: float | None = Field(
        default=None,
        gt=0,
        description="Requests/s one serving pod sustains at this BaseModel's plan and your request sizes "
        "(measure it, or take the step-time model's figure, docs/concepts.md). Unset: no advice "
        "(MergeRecommended Unknown, reason NoPodCapacity).",
    )
    lora_step_overhead: float = Field(
        default=0.08,
        ge=0,
        le=1,
        description="Extra step time of a hot-swapped adapter's tokens against the merged model, as a fraction "
        "(the reference engine measured 0.08; docs/concepts.md).",
    )
    merge_above_pod_fraction: float = Field(
        default=0.5,
        gt=0,
        le=64,
        description="Suggest merged once the adapter's smoothed rate keeps at least this fraction of one pod "
        "busy for sustainSeconds.",
    )
    unmerge_below_pod_fraction: float = Field(
        default=0.25,
        ge=0,
        le=64,
        description="Suggest dynamic again once it stays below this fraction for sustainSeconds; below "
        "mergeAbovePodFraction, so a rate in between changes nothing.",
    )
    sustain_seconds: int = Field(
        default=1800,
        ge=0,
        le=SECONDS_MAX,
        description="How long the rate must stay past a threshold before the suggestion changes; also the "
        "data needed for a first suggestion. The rate is smoothed with a half-life of a quarter of it.",
    )
    min_dwell_seconds: int = Field(
        default=3600,
        ge=0,
        le=SECONDS_MAX,
        description="mode: auto: the least time between two switches of one adapter.",
    )
    max_merged_adapters: int = Field(
        default=1,
        ge=0,
        le=1024,
        description="mode: auto: the most Adapters of this BaseModel served merged at once (explicit "
        "mode: merged ones count); the busiest suggested ones first.",
    )

    model_config = ApiModel.model_config | {
        "json_schema_extra": {
            "x-kubernetes-validations": [
                {
                    "rule": "self.unmergeBelowPodFraction < self.mergeAbovePodFraction",
                    "message": THRESHOLD_MESSAGE,
                    "fieldPath": ".unmergeBelowPodFraction",
                }
            ]
        }
    }

    @model_validator(mode="after")
    def _band(self) -> MergingSpec:
        if not self.unmerge_below_pod_fraction < self.merge_above_pod_fraction:
            raise ValueError(THRESHOLD_MESSAGE)
        return self


class MergeStatus(ApiModel):
    """The advice and what it remembers between readings (the operator's merge timer writes it)."""

    suggested: Suggestion = Field(
        default=Suggestion.UNKNOWN, description="Merged, Dynamic or Unknown (no signal, no capacity, too little data)."
    )
    decided: Suggestion | None = Field(
        default=None, description="The last Merged/Dynamic decision, kept while the signal is missing."
    )
    mode: str | None = Field(
        default=None, description="mode: auto: the mode the adapter is served in now (dynamic or merged)."
    )
    requests_per_second: float | None = Field(default=None, ge=0, description="Smoothed request rate.")
    pod_fraction: float | None = Field(default=None, ge=0, description="That rate over podRequestsPerSecond.")
    sampled_at: str | None = Field(default=None, description="RFC 3339 time of the last reading.")
    observing_since: str | None = Field(default=None, description="RFC 3339 time of the first reading.")
    crossing_since: str | None = Field(
        default=None, description="RFC 3339 time the rate crossed the threshold away from the decision."
    )
    switched_at: str | None = Field(default=None, description="mode: auto: RFC 3339 time of the last switch.")
