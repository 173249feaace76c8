"""The ``BaseModel`` custom resource: one base LLM, how TRT-LLM runs it, and its serving fleet.

``spec.runtime`` picks the backend: ``tensorrtllm`` (TRT-LLM's TensorRT-engine flow, built with
``trtllm-build`` and served by Triton; TRT-LLM <= 1.3.0rc20), ``pytorch`` (TRT-LLM's PyTorch backend: the HF
checkpoint staged once and served by ``trtllm-serve``; every TRT-LLM release) or ``reference`` (trtfleet's
CPU engine). Rules that hold for one runtime only are CEL rules on :class:`BaseModelSpec`
(:data:`RUNTIME_RULES`).

``spec`` says what to build and serve; ``status`` is written only by the operator.
Python-side validators mirror the CEL rules of the CRD so that the same spec is
rejected with the same words by ``kubectl apply`` and by ``trtfleet engines``.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from typing import Any, Literal

from pydantic import Field, model_validator

from trtfleet.api.autoscaling import REPLICAS_RANGE_MESSAGE, REPLICAS_RANGE_RULE
from trtfleet.api.autoscaling import AutoscalingSpec as AutoscalingSpec
from trtfleet.api.autoscaling import AutoscalingStatus as AutoscalingStatus
from trtfleet.api.common import ApiModel, Condition, Source
from trtfleet.api.dimensions import ModelDimensions as ModelDimensions
from trtfleet.api.lora import DEFAULT_TARGET_MODULES as DEFAULT_TARGET_MODULES
from trtfleet.api.lora import LORA_MODULE_IDS as LORA_MODULE_IDS
from trtfleet.api.lora import LoraCacheSpec as LoraCacheSpec
from trtfleet.api.lora import LoraModule as LoraModule
from trtfleet.api.lora import LoraSpec as LoraSpec
from trtfleet.api.merging import MergingSpec as MergingSpec
from trtfleet.api.serving import KV_FRACTION_MESSAGE as KV_FRACTION_MESSAGE
from trtfleet.api.serving import BatchSchedulerPolicy as BatchSchedulerPolicy
from trtfleet.api.serving import FailureMode as FailureMode
from trtfleet.api.serving import GatewaySpec as GatewaySpec
from trtfleet.api.serving import Resources as Resources
from trtfleet.api.serving import RolloutSpec as RolloutSpec
from trtfleet.api.serving import RolloutStrategy as RolloutStrategy
from trtfleet.api.serving import ServingServer as ServingServer
from trtfleet.api.serving import ServingSpec as ServingSpec
from trtfleet.api.serving import Toleration as Toleration
from trtfleet.api.serving import WaitingQueuePolicy as WaitingQueuePolicy
from trtfleet.api.speculative import SPEC_RULES as SPECULATIVE_SPEC_RULES
from trtfleet.api.speculative import SpeculativeMode as SpeculativeMode
from trtfleet.api.speculative import SpeculativeSpec as SpeculativeSpec
from trtfleet.api.speculative import check_speculative


class Architecture(StrEnum):
    """Model families whose TRT-LLM checkpoint converters trtfleet drives."""

    LLAMA = "llama"
    MISTRAL = "mistral"
    MIXTRAL = "mixtral"
    QWEN2 = "qwen2"
    GEMMA = "gemma"
    PHI3 = "phi3"


class Dtype(StrEnum):
    FLOAT16 = "float16"
    BFLOAT16 = "bfloat16"


class QuantizationMode(StrEnum):
    NONE = "none"
    INT8_WEIGHT_ONLY = "int8_weight_only"
    INT4_WEIGHT_ONLY = "int4_weight_only"
    INT4_AWQ = "int4_awq"
    FP8 = "fp8"


class KvCacheDtype(StrEnum):
    AUTO = "auto"
    INT8 = "int8"
    FP8 = "fp8"


class Runtime(StrEnum):
    TENSORRTLLM = "tensorrtllm"
    """The TensorRT-engine backend (engine build + Triton); upstream removed it after 1.3.0rc20."""
    PYTORCH = "pytorch"
    """TRT-LLM's PyTorch backend: ``trtllm-serve`` on the staged HF checkpoint."""
    REFERENCE = "reference"


class Phase(StrEnum):
    PENDING = "Pending"
    BUILDING = "Building"
    READY = "Ready"
    DEGRADED = "Degraded"
    FAILED = "Failed"


class Quantization(ApiModel):
    mode: QuantizationMode = Field(
        default=QuantizationMode.NONE,
        description="Weight quantization. fp8 needs Hopper or newer; int4_awq and fp8 run the quantization script.",
    )
    kv_cache_dtype: KvCacheDtype = Field(
        default=KvCacheDtype.AUTO, description="KV-cache storage type; auto keeps the model dtype."
    )

    model_config = ApiModel.model_config | {
        "json_schema_extra": {
            "x-kubernetes-validations": [
                {
                    "rule": "!(self.mode == 'fp8' && self.kvCacheDtype == 'int8')",
                    "message": "quantization.mode fp8 cannot use an int8 KV cache: use kvCacheDtype fp8 or auto",
                }
            ]
        }
    }

    @model_validator(mode="after")
    def _fp8_kv(self) -> Quantization:
        if self.mode is QuantizationMode.FP8 and self.kv_cache_dtype is KvCacheDtype.INT8:
            raise ValueError("quantization.mode fp8 cannot use an int8 KV cache: use kvCacheDtype fp8 or auto")
        return self


class Parallelism(ApiModel):
    tensor: int = Field(default=1, ge=1, le=64, description="Tensor-parallel size (GPUs per pipeline stage).")
    pipeline: int = Field(default=1, ge=1, le=64, description="Pipeline-parallel size.")


class Gpu(ApiModel):
    product: str = Field(
        default="H100-80GB",
        min_length=1,
        max_length=63,
        description="GPU product the engine is built for and scheduled on (e.g. L4, A100-80GB, H100-80GB, H200). "
        "Engines only run on the GPU architecture that built them.",
    )
    count: int = Field(default=1, ge=1, le=64, description="GPUs per serving pod; must equal tensor * pipeline.")


class EngineSpec(ApiModel):
    max_batch_size: int = Field(
        default=64,
        ge=1,
        le=4096,
        description="trtllm-build --max_batch_size (tensorrtllm); max_batch_size and the CUDA-graph batch limit "
        "of the LLM-API options (pytorch).",
    )
    max_input_len: int = Field(
        default=2048,
        ge=1,
        le=1_048_576,
        description="trtllm-build --max_input_len (tensorrtllm). pytorch has no such limit (prompts are bounded "
        "by maxNumTokens without chunked prefill, and by maxSeqLen); it is still checked against maxSeqLen and "
        "bounds prompts at the router.",
    )
    max_seq_len: int = Field(
        default=4096,
        ge=2,
        le=1_048_576,
        description="trtllm-build --max_seq_len (tensorrtllm), max_seq_len (pytorch): prompt plus output.",
    )
    max_num_tokens: int = Field(
        default=8192,
        ge=1,
        le=1_048_576,
        description="trtllm-build --max_num_tokens (tensorrtllm), max_num_tokens (pytorch): tokens per scheduler "
        "step.",
    )
    image: str = Field(
        default="nvcr.io/nvidia/tritonserver:25.12-trtllm-python-py3",
        min_length=1,
        max_length=512,
        description="tensorrtllm: the tritonserver TRT-LLM image that builds and serves the engine; its tag is "
        "part of the engine identity. pytorch: the TRT-LLM image that runs trtllm-serve and the prepare Job "
        "(with ModelOpt when quantization.mode is not none; then its tag is part of the checkpoint identity).",
    )
    gpu: Gpu = Field(default_factory=Gpu, description="Target GPU.")

    model_config = ApiModel.model_config | {
        "json_schema_extra": {
            "x-kubernetes-validations": [
                {
                    "rule": "self.maxInputLen < self.maxSeqLen",
                    "message": "engine.maxInputLen must be smaller than engine.maxSeqLen (the sequence holds the "
                    "prompt plus at least one output token)",
                    "fieldPath": ".maxInputLen",
                }
            ]
        }
    }

    @model_validator(mode="after")
    def _lengths(self) -> EngineSpec:
        if self.max_input_len >= self.max_seq_len:
            raise ValueError(
                "engine.maxInputLen must be smaller than engine.maxSeqLen (the sequence holds the prompt plus "
                "at least one output token)"
            )
        return self


@dataclass(frozen=True)
class RuntimeFieldRule:
    """A value of one spec field that one runtime cannot serve: a CEL rule of the CRD and the same check in
    Python, with one message for both."""

    runtime: Runtime
    group: str
    field: str
    value: str
    message: str
    optional: bool = False
    """The field has no default, so the CEL rule tests ``has()`` before reading it."""

    @property
    def field_path(self) -> str:
        return f"{self.group}.{self.field}"

    def to_cel(self) -> dict[str, str]:
        present = f"has(self.{self.field_path}) && " if self.optional else ""
        return {
            "rule": f"!(self.runtime == '{self.runtime.value}' && {present}self.{self.field_path} == '{self.value}')",
            "message": self.message,
            "fieldPath": f".{self.field_path}",
        }

    def holds(self, spec: BaseModelSpec) -> bool:
        if spec.runtime is not self.runtime:
            return True
        group: ApiModel = getattr(spec, self.group)  # groups are one-word fields: quantization, lora, ...
        return bool(group.to_wire().get(self.field) != self.value)


RUNTIME_RULES: tuple[RuntimeFieldRule, ...] = (
    RuntimeFieldRule(
        Runtime.PYTORCH,
        "quantization",
        "kvCacheDtype",
        KvCacheDtype.INT8.value,
        "quantization.kvCacheDtype int8 is for runtime tensorrtllm only: the PyTorch backend's "
        "kv_cache_config.dtype takes auto or fp8 (use fp8 or auto)",
    ),
    RuntimeFieldRule(
        Runtime.PYTORCH,
        "quantization",
        "mode",
        QuantizationMode.INT4_WEIGHT_ONLY.value,
        "quantization.mode int4_weight_only is for runtime tensorrtllm only: ModelOpt exports no HF checkpoint "
        "of it for the PyTorch backend (use int4_awq, int8_weight_only or fp8)",
    ),
    *(
        RuntimeFieldRule(
            runtime,
            "serving",
            "server",
            ServingServer.TRITON.value,
            f"serving.server triton is for runtime pytorch only (TRT-LLM's llmapi model in Triton): runtime "
            f"{runtime.value} pods always run Triton with their own model repository (leave serving.server unset)",
            optional=True,
        )
        for runtime in (Runtime.TENSORRTLLM, Runtime.REFERENCE)
    ),
    *(
        RuntimeFieldRule(
            runtime,
            "serving",
            "waitingQueuePolicy",
            WaitingQueuePolicy.PRIORITY.value,
            f"serving.waitingQueuePolicy priority is for runtime pytorch only (trtllm-serve's request priority): "
            f"runtime {runtime.value} pods run Triton's tensorrt_llm model, which takes no request priority (the "
            f"router orders its own queues by band either way; leave serving.waitingQueuePolicy unset)",
            optional=True,
        )
        for runtime in (Runtime.TENSORRTLLM, Runtime.REFERENCE)
    ),
)
"""Field values refused for one runtime; the checks in ``trtfleet_engines.pytorch`` refuse the same."""

_SPEC_CEL_RULES: list[Any] = [
    {
        "rule": "self.parallelism.tensor * self.parallelism.pipeline == self.engine.gpu.count",
        "message": "parallelism.tensor * parallelism.pipeline must equal engine.gpu.count",
    },
    *(rule.to_cel() for rule in RUNTIME_RULES),
    {"rule": REPLICAS_RANGE_RULE, "message": REPLICAS_RANGE_MESSAGE, "fieldPath": ".serving.replicas"},
    *(rule.to_cel() for rule in SPECULATIVE_SPEC_RULES),
]


class BaseModelSpec(ApiModel):
    source: Source = Field(description="Where the HuggingFace checkpoint comes from.")
    architecture: Architecture = Field(description="Model family; picks the TRT-LLM checkpoint converter.")
    dtype: Dtype = Field(default=Dtype.FLOAT16, description="Engine dtype; LoRA weights must use the same.")
    quantization: Quantization = Field(default_factory=Quantization, description="Quantization settings.")
    parallelism: Parallelism = Field(default_factory=Parallelism, description="Tensor and pipeline parallelism.")
    engine: EngineSpec = Field(default_factory=EngineSpec, description="trtllm-build limits, image and GPU.")
    lora: LoraSpec = Field(default_factory=LoraSpec, description="Multi-LoRA settings.")
    serving: ServingSpec = Field(default_factory=ServingSpec, description="Serving pods: how many, how they roll.")
    runtime: Runtime = Field(
        default=Runtime.PYTORCH,
        description="tensorrtllm: TRT-LLM's TensorRT-engine backend (trtllm-build, served by Triton), for "
        "TRT-LLM releases up to 1.3.0rc20, the last with that backend. pytorch: TRT-LLM's PyTorch backend "
        "(the HF checkpoint is staged once, optionally quantized with ModelOpt, and served by trtllm-serve), "
        "for every release. reference: trtfleet's CPU reference engine (same Triton tensors and LoRA cache "
        "behaviour, no GPU). The default is pytorch, the backend every current TRT-LLM release ships.",
    )
    dimensions: ModelDimensions | None = Field(
        default=None,
        description="Model dimensions for capacity planning when the operator cannot read config.json.",
    )
    autoscaling: AutoscalingSpec | None = Field(
        default=None,
        description="Demand-driven sizing; when set, serving.replicas is the operator's to set. Unset: "
        "serving.replicas is fixed by hand or by whatever drives the scale subresource (kubectl scale, an HPA, "
        "a KEDA ScaledObject).",
    )
    merging: MergingSpec | None = Field(
        default=None,
        description="Whether a dedicated merged Deployment pays per adapter (status.merge and the MergeRecommended "
        "condition of its Adapters), and how mode: auto Adapters act on it. Unset: the defaults, with no pod "
        "capacity, so no advice.",
    )
    speculative: SpeculativeSpec | None = Field(
        default=None,
        description="Speculative decoding: mode, draft length, the draft checkpoint (staged like the base one) and "
        "the runtime controls. Unset: no speculation. See docs/speculative-decoding.md.",
    )

    model_config = ApiModel.model_config | {"json_schema_extra": {"x-kubernetes-validations": _SPEC_CEL_RULES}}

    @model_validator(mode="after")
    def _gpus(self) -> BaseModelSpec:
        if self.parallelism.tensor * self.parallelism.pipeline != self.engine.gpu.count:
            raise ValueError("parallelism.tensor * parallelism.pipeline must equal engine.gpu.count")
        for rule in RUNTIME_RULES:
            if not rule.holds(self):
                raise ValueError(rule.message)
        scaling = self.autoscaling
        if scaling is not None and not scaling.min_replicas <= self.serving.replicas <= scaling.max_replicas:
            raise ValueError(REPLICAS_RANGE_MESSAGE)
        check_speculative(self)
        return self


class EngineStatus(ApiModel):
    hash: str | None = Field(
        default=None,
        description="Content address of the engine (tensorrtllm) or of the staged checkpoint (pytorch: the "
        "prepare hash).",
    )
    uri: str | None = Field(
        default=None,
        description="Where the built engine and model repository live (tensorrtllm), or the staged checkpoint "
        "directory trtllm-serve loads (pytorch).",
    )
    image: str | None = Field(default=None, description="Image that built or prepared it.")
    built_at: str | None = Field(default=None, description="RFC 3339 time the engine or checkpoint was published.")
    build_job: str | None = Field(
        default=None, description="Name of the engine-build Job (tensorrtllm) or prepare Job (pytorch), while one runs."
    )


class CapacityStatus(ApiModel):
    weights_bytes: int | None = Field(default=None, description="Weight bytes per GPU.")
    kv_cache_tokens: int | None = Field(default=None, description="KV-cache tokens per pod.")
    lora_host_adapters: int | None = Field(default=None, description="Max-rank adapters the host tier holds.")
    lora_device_adapters: int | None = Field(default=None, description="Max-rank adapters the device tier holds.")
    lora_page_width: int | None = Field(default=None, description="LoRA cache page width (elements).")
    lora_slots_per_page: int | None = Field(default=None, description="LoRA cache slots per page.")
    lora_host_pages: int | None = Field(default=None, description="Pages in the host tier.")
    lora_device_pages: int | None = Field(default=None, description="Pages in the device tier.")
    max_loras: int | None = Field(
        default=None,
        description="runtime pytorch: lora_config.max_loras, the device tier in adapters of lora.maxRank (its "
        "pages may hold more; see loraDeviceAdapters).",
    )
    max_cpu_loras: int | None = Field(
        default=None,
        description="runtime pytorch: lora_config.max_cpu_loras, the host tier in adapters of lora.maxRank.",
    )
    kv_bytes_per_token: int | None = Field(
        default=None,
        description="KV-cache bytes one token takes per GPU (the draft model's included): with weightsBytes and "
        "memoryBandwidthBytesPerSecond what the router's model bandwidth utilisation (MBU) is computed from.",
    )
    memory_bandwidth_bytes_per_second: float | None = Field(
        default=None,
        description="The GPU's peak memory bandwidth (datasheet figure), the denominator of MBU.",
    )
    draft_weights_bytes: int | None = Field(
        default=None,
        description="With speculative: the draft model's (or heads') weight bytes per GPU, taken from the memory "
        "before the KV cache is sized.",
    )
    draft_kv_cache_tokens: int | None = Field(
        default=None,
        description="With speculative: KV-cache slots the draft tokens of a full batch hold (engine.maxBatchSize x "
        "speculative.maxDraftLen); kvCacheTokens counts them among its own.",
    )
    decode_requests_per_step: int | None = Field(
        default=None,
        description="With speculative: requests one step can verify within engine.maxNumTokens when each brings "
        "1 + maxDraftLen tokens (at most engine.maxBatchSize).",
    )


class BaseModelStatus(ApiModel):
    phase: Phase = Field(default=Phase.PENDING, description="Pending, Building, Ready, Degraded or Failed.")
    observed_generation: int | None = Field(default=None, description="Generation the status describes.")
    conditions: list[Condition] | None = Field(
        default=None,
        description="Kubernetes-style conditions.",
        json_schema_extra={"x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["type"]},
    )
    engine: EngineStatus | None = Field(default=None, description="The engine being served or built.")
    capacity: CapacityStatus | None = Field(default=None, description="Planned capacity per pod.")
    replicas: int | None = Field(default=None, description="Desired serving pods.")
    ready_replicas: int | None = Field(default=None, description="Ready serving pods.")
    next_task_id: int | None = Field(
        default=None,
        ge=1,
        description="Next LoRA task id to hand out; only grows (compare-and-swap on resourceVersion).",
    )
    service: str | None = Field(default=None, description="Headless Service of the serving pods.")
    selector: str | None = Field(
        default=None, description="Label selector of the serving pods (the scale subresource's labelSelectorPath)."
    )
    autoscaling: AutoscalingStatus | None = Field(
        default=None, description="The autoscaler's last decision and the history it needs; see spec.autoscaling."
    )


class BaseModel(ApiModel):
    """The whole BaseModel object as stored by Kubernetes."""

    api_version: Literal["trtfleet.io/v1alpha1"] = Field(default="trtfleet.io/v1alpha1")
    kind: Literal["BaseModel"] = "BaseModel"
    metadata: dict[str, Any] = Field(default_factory=dict)
    spec: BaseModelSpec
    status: BaseModelStatus | None = None

    model_config = ApiModel.model_config | {"extra": "ignore"}
