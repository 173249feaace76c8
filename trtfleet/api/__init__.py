"""trtfleet's API: the pydantic models behind the ``BaseModel`` and ``Adapter`` CRDs.

These types are the only thing the operator, the router and the engine tooling
share; everything else they exchange travels through Kubernetes objects.
"""

from trtfleet.api.adapter import (
    Adapter,
    AdapterMode,
    AdapterPhase,
    AdapterSpec,
    AdapterStatus,
    ArtifactStatus,
    BaseQuantizationSpec,
    BaseVariantStatus,
    ComputeDtype,
    QuantType,
    TrainingSpec,
    chosen_mode,
    effective_mode,
)
from trtfleet.api.basemodel import (
    DEFAULT_TARGET_MODULES,
    LORA_MODULE_IDS,
    Architecture,
    AutoscalingSpec,
    AutoscalingStatus,
    BaseModel,
    BaseModelSpec,
    BaseModelStatus,
    BatchSchedulerPolicy,
    CapacityStatus,
    Dtype,
    EngineSpec,
    EngineStatus,
    KvCacheDtype,
    LoraModule,
    LoraSpec,
    ModelDimensions,
    Phase,
    QuantizationMode,
    Runtime,
)
from trtfleet.api.batch import Batch, BatchEndpoint, BatchPhase, BatchSpec, BatchStatus
from trtfleet.api.common import (
    API_VERSION,
    GROUP,
    VERSION,
    Condition,
    ConditionStatus,
    Source,
    parse_quantity,
)
from trtfleet.api.merging import MergeStatus, MergingSpec, Suggestion

__all__ = [
    "API_VERSION", "DEFAULT_TARGET_MODULES", "GROUP", "LORA_MODULE_IDS", "VERSION",
    "Adapter", "AdapterMode", "AdapterPhase", "AdapterSpec", "AdapterStatus", "Architecture", "ArtifactStatus",
    "AutoscalingSpec", "AutoscalingStatus",
    "BaseModel", "BaseModelSpec", "BaseModelStatus", "BatchSchedulerPolicy", "CapacityStatus", "Condition",
    "ConditionStatus", "Dtype", "EngineSpec", "EngineStatus", "KvCacheDtype", "LoraModule", "LoraSpec",
    "ModelDimensions", "Phase", "QuantizationMode", "Runtime", "Source", "parse_quantity",
    "Batch", "BatchEndpoint", "BatchPhase", "BatchSpec", "BatchStatus",
    "BaseQuantizationSpec", "BaseVariantStatus", "ComputeDtype", "QuantType", "TrainingSpec",
    "MergeStatus", "MergingSpec", "Suggestion", "chosen_mode", "effective_mode",
]
