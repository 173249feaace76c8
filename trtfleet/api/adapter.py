"""The ``Adapter`` custom resource: one LoRA adapter served on a BaseModel's fleet.

The operator validates it against its BaseModel, converts the PEFT weights into
TRT-LLM's two-tensor format (runtime ``pytorch``: validates them the same way and
stages the PEFT directory itself, which the pods read), and allocates a ``taskId``
(TRT-LLM's only name for an adapter). The router reads ``spec.servedName``,
``status.taskId`` and ``status.artifact`` to route requests and push weights to pods
(or, on ``pytorch``, sends ``status.artifact.path`` as ``lora_path``).
"""

from __future__ import annotations

from enum import StrEnum
from typing import Any, Literal

from pydantic import Field

from trtfleet.api.common import ApiModel, Condition, Source
from trtfleet.api.merging import MergeStatus


class AdapterFormat(StrEnum):
    PEFT = "peft"


class AdapterMode(StrEnum):
    DYNAMIC = "dynamic"
    MERGED = "merged"
    AUTO = "auto"


class AdapterPhase(StrEnum):
    PENDING = "Pending"
    CONVERTING = "Converting"
    READY = "Ready"
    FAILED = "Failed"


SERVED_NAME_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._:/-]{0,252}$"


class WarmSpec(ApiModel):
    min_pods: int = Field(
        default=0, ge=0, le=1024, description="Pods the router keeps this adapter warm on (prewarming)."
    )


class AdapterSpec(ApiModel):
    base_model: str = Field(
        min_length=1,
        max_length=253,
        description="Name of the BaseModel in the same namespace. Immutable.",
        json_schema_extra={
            "x-kubernetes-validations": [
                {"rule": "self == oldSelf", "message": "baseModel is immutable: create a new Adapter instead"}
            ]
        },
    )
    source: Source = Field(description="Where the PEFT adapter (adapter_config.json + weights) comes from.")
    format: AdapterFormat = Field(default=AdapterFormat.PEFT, description="Adapter format; peft today.")
    mode: AdapterMode = Field(
        default=AdapterMode.DYNAMIC,
        description="dynamic: hot-swapped on the shared base engine through the LoRA cache. merged: merged into "
        "the base weights in an engine and Deployment of its own. auto: starts dynamic; the operator switches "
        "it to merged and back as its BaseModel's spec.merging advises (status.merge.mode).",
    )
    warm: WarmSpec = Field(default_factory=WarmSpec, description="Prewarming.")
    served_name: str | None = Field(
        default=None,
        pattern=SERVED_NAME_PATTERN,
        description="Model name clients send (OpenAI `model`, Triton model name). Default: the object name.",
    )


class ArtifactStatus(ApiModel):
    uri: str | None = Field(
        default=None,
        description="Directory of the staged adapter: model.lora_weights.npy, model.lora_config.npy and "
        "manifest.json (runtime tensorrtllm, reference), or the validated PEFT directory (runtime pytorch).",
    )
    path: str | None = Field(
        default=None,
        description="runtime pytorch: the directory inside every serving pod that holds the PEFT adapter; the "
        "router sends it as lora_request.lora_path (with lora_int_id = taskId).",
    )
    sha256: str | None = Field(default=None, description="sha256 of the manifest's output files, as in manifest.json.")
    bytes: int | None = Field(default=None, ge=0, description="Size of the weights tensor in bytes.")
    rank: int | None = Field(default=None, ge=1, description="Largest LoRA rank in the adapter.")
    modules: list[str] | None = Field(default=None, description="TRT-LLM modules the adapter targets.")


class AdapterStatus(ApiModel):
    phase: AdapterPhase = Field(default=AdapterPhase.PENDING, description="Pending, Converting, Ready or Failed.")
    observed_generation: int | None = Field(default=None, description="Generation the status describes.")
    conditions: list[Condition] | None = Field(
        default=None,
        description="Kubernetes-style conditions.",
        json_schema_extra={"x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["type"]},
    )
    task_id: int | None = Field(
        default=None,
        ge=1,
        description="TRT-LLM lora_task_id (lora_request.lora_int_id on runtime pytorch), unique per "
        "BaseModel and never reused.",
    )
    source_key: str | None = Field(
        default=None, description="Digest of the source the taskId was allocated for; a new source, a new id."
    )
    served_name: str | None = Field(default=None, description="Resolved served name.")
    artifact: ArtifactStatus | None = Field(default=None, description="The converted adapter.")
    merge: MergeStatus | None = Field(
        default=None,
        description="Whether a merged Deployment would pay (BaseModel spec.merging), and mode: auto's choice.",
    )


def effective_mode(mode: AdapterMode, chosen: str | None) -> AdapterMode:
    """How the adapter is served now: its ``spec.mode``, or for ``auto`` the operator's choice ``chosen``
    (``status.merge.mode``; dynamic until it switches)."""
    if mode is not AdapterMode.AUTO:
        return mode
    return AdapterMode.MERGED if chosen == AdapterMode.MERGED.value else AdapterMode.DYNAMIC


def chosen_mode(status: Any) -> str | None:
    """``status.merge.mode`` of a raw (dict) status, or None."""
    merge = status.get("merge") if isinstance(status, dict) else None
    mode = merge.get("mode") if isinstance(merge, dict) else None
    return mode if isinstance(mode, str) else None


class Adapter(ApiModel):
    """The whole Adapter object as stored by Kubernetes."""

    api_version: Literal["trtfleet.io/v1alpha1"] = Field(default="trtfleet.io/v1alpha1")
    kind: Literal["Adapter"] = "Adapter"
    metadata: dict[str, Any] = Field(default_factory=dict)
    spec: AdapterSpec
    status: AdapterStatus | None = None

    model_config = ApiModel.model_config | {"extra": "ignore"}
