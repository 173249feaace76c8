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

from pydantic import Field, model_validator

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


class QuantType(StrEnum):
    """bitsandbytes' 4-bit data types (``bnb_4bit_quant_type``)."""

    NF4 = "nf4"
    FP4 = "fp4"


class ComputeDtype(StrEnum):
    """``bnb_4bit_compute_dtype``: the dtype the dequantized weights are multiplied in."""

    FLOAT16 = "float16"
    BFLOAT16 = "bfloat16"
    FLOAT32 = "float32"


BlockSize = Literal[32, 64, 128, 256, 512, 1024, 2048, 4096]
"""bitsandbytes' allowed 4-bit block sizes (``bitsandbytes/_ops.py``: ``blocksize in (32, ..., 4096)``)."""
MERGED_QLORA_MESSAGE = (
    "mode merged cannot be combined with training.baseQuantization (nor mode auto, which may choose merged): "
    "a QLoRA adapter is served hot-swapped (mode dynamic) on its dequantized base variant"
)


TRAINING_IMMUTABLE_MESSAGE = (
    "training is immutable (it decides which base serves the adapter): create a new Adapter instead"
)


class BaseQuantizationSpec(ApiModel):
    """How QLoRA quantized the base model the adapter was trained on (transformers' ``BitsAndBytesConfig``)."""

    quant_type: QuantType = Field(
        description="bnb_4bit_quant_type: nf4 or fp4. Required: bitsandbytes defaults to fp4, QLoRA recipes use "
        "nf4, and serving on the wrong one changes the adapter's activations."
    )
    block_size: BlockSize = Field(
        default=64,
        description="Weights per quantization block: 32, 64, 128, 256, 512, 1024, 2048 or 4096 (bitsandbytes' "
        "default 64, what Linear4bit uses).",
    )
    double_quant: bool = Field(
        default=False,
        description="bnb_4bit_use_double_quant: the per-block absmax statistics quantized again to 8 bits "
        "(default false, as BitsAndBytesConfig).",
    )
    compute_dtype: ComputeDtype = Field(
        default=ComputeDtype.FLOAT32,
        description="bnb_4bit_compute_dtype: float16, bfloat16 or float32 (BitsAndBytesConfig's default "
        "float32). The dequantized weights are rounded to it.",
    )

    def variant_text(self) -> str:
        """The worker's ``--base-quantization`` form (``TYPE:BLOCK[:double]:DTYPE``)."""
        double = ":double" if self.double_quant else ""
        return f"{self.quant_type.value}:{self.block_size}{double}:{self.compute_dtype.value}"


class TrainingSpec(ApiModel):
    base_quantization: BaseQuantizationSpec | None = Field(
        default=None,
        description="Set for a QLoRA adapter: the base it learned against was quantized to 4 bits by "
        "bitsandbytes. trtfleet serves it on a base variant dequantized exactly that way, shared by every "
        "Adapter of the BaseModel trained with the same settings.",
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
    training: TrainingSpec | None = Field(
        default=None,
        description="How the adapter was trained, where serving depends on it (QLoRA). Immutable: it can be "
        "neither set, changed nor removed after creation.",
    )

    model_config = ApiModel.model_config | {
        "json_schema_extra": {
            "x-kubernetes-validations": [
                {
                    "rule": "!(has(self.mode) && self.mode in ['merged', 'auto'] && has(self.training) && "
                    "has(self.training.baseQuantization))",
                    "message": MERGED_QLORA_MESSAGE,
                },
                {
                    "rule": "has(self.training) == has(oldSelf.training) && "
                    "(!has(self.training) || self.training == oldSelf.training)",
                    "message": TRAINING_IMMUTABLE_MESSAGE,
                },
            ]
        }
    }

    @model_validator(mode="after")
    def _merged_qlora(self) -> AdapterSpec:
        if self.mode in (AdapterMode.MERGED, AdapterMode.AUTO) and self.base_quantization is not None:
            raise ValueError(MERGED_QLORA_MESSAGE)
        return self

    @property
    def base_quantization(self) -> BaseQuantizationSpec | None:
        return self.training.base_quantization if self.training is not None else None


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


class BaseVariantStatus(ApiModel):
    name: str | None = Field(default=None, description="The variant's Deployment and Service (<base>-q-<hash>).")
    hash: str | None = Field(default=None, description="Content hash of the variant (base identity + quantization).")
    quantization: str | None = Field(default=None, description="The quantization, as TYPE:BLOCK[:double]:DTYPE.")


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
    base_variant: BaseVariantStatus | None = Field(
        default=None, description="QLoRA adapters: the base variant whose pods serve this adapter."
    )
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
