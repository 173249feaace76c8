"""The ``lora`` part of a BaseModel spec: TRT-LLM's LoRA module names and the LoRA cache settings
(re-exported by :mod:`trtfleet.api.basemodel`)."""

from __future__ import annotations

from enum import StrEnum

from pydantic import Field, model_validator

from trtfleet.api.common import ApiModel, Quantity, parse_quantity


class LoraModule(StrEnum):
    """TRT-LLM LoRA module names (``--lora_target_modules``) with their runtime module ids."""

    ATTN_QKV = "attn_qkv"
    ATTN_Q = "attn_q"
    ATTN_K = "attn_k"
    ATTN_V = "attn_v"
    ATTN_DENSE = "attn_dense"
    MLP_H_TO_4H = "mlp_h_to_4h"
    MLP_4H_TO_H = "mlp_4h_to_h"
    MLP_GATE = "mlp_gate"
    MLP_GATE_UP = "mlp_gate_up"

    @property
    def module_id(self) -> int:
        return LORA_MODULE_IDS[self]


LORA_MODULE_IDS: dict[LoraModule, int] = {
    LoraModule.ATTN_QKV: 0,
    LoraModule.ATTN_Q: 1,
    LoraModule.ATTN_K: 2,
    LoraModule.ATTN_V: 3,
    LoraModule.ATTN_DENSE: 4,
    LoraModule.MLP_H_TO_4H: 5,
    LoraModule.MLP_4H_TO_H: 6,
    LoraModule.MLP_GATE: 7,
    LoraModule.MLP_GATE_UP: 18,
}

DEFAULT_TARGET_MODULES: tuple[LoraModule, ...] = (
    LoraModule.ATTN_Q,
    LoraModule.ATTN_K,
    LoraModule.ATTN_V,
    LoraModule.ATTN_DENSE,
    LoraModule.MLP_H_TO_4H,
    LoraModule.MLP_4H_TO_H,
    LoraModule.MLP_GATE,
)


class LoraCacheSpec(ApiModel):
    gpu_memory_fraction: float = Field(
        default=0.05,
        gt=0,
        le=0.5,
        description="Share of free GPU memory for the device tier. tensorrtllm: lora_cache_gpu_memory_fraction of "
        "the Triton model. pytorch: the budget the operator turns into lora_config.max_loras (adapters of "
        "lora.maxRank; status.capacity.maxLoras).",
    )
    host_memory_bytes: Quantity = Field(
        default="1Gi",
        description="Host memory for the host tier. tensorrtllm: lora_cache_host_memory_bytes. pytorch: the "
        "budget the operator turns into lora_config.max_cpu_loras (status.capacity.maxCpuLoras).",
    )
    optimal_adapter_size: int = Field(
        default=8, ge=1, le=1024, description="Rank used for page geometry: "
        "lora_cache_optimal_adapter_size (tensorrtllm), peft_cache_config.optimal_adapter_size (pytorch)."
    )
    max_adapter_size: int = Field(
        default=64, ge=1, le=1024, description="Largest rank one page must "
        "hold: lora_cache_max_adapter_size (tensorrtllm), peft_cache_config.max_adapter_size (pytorch)."
    )

    @property
    def host_bytes(self) -> int:
        return parse_quantity(self.host_memory_bytes)


_POWERS_OF_TWO = [1, 2, 4, 8, 16, 32, 64, 128, 256]


class LoraSpec(ApiModel):
    enabled: bool = Field(default=True, description="Multi-LoRA serving. tensorrtllm: build "
        "the engine with the LoRA plugin. pytorch: start trtllm-serve with lora_config (a server without it "
        "ignores lora_request and answers from the base model).")
    max_rank: int = Field(default=64, ge=1, le=256, description="trtllm-build --max_lora_rank "
        "(tensorrtllm), lora_config.max_lora_rank (pytorch); a power of two.")
    target_modules: list[LoraModule] = Field(
        default_factory=lambda: list(DEFAULT_TARGET_MODULES),
        min_length=1,
        max_length=9,
        description="TRT-LLM module names adapters may target (--lora_target_modules; "
        "lora_config.lora_target_modules on pytorch).",
        json_schema_extra={"x-kubernetes-list-type": "set"},
    )
    cache: LoraCacheSpec = Field(default_factory=LoraCacheSpec, description="TRT-LLM LoRA cache sizing.")

    model_config = ApiModel.model_config | {
        "json_schema_extra": {
            "x-kubernetes-validations": [
                {
                    "rule": f"self.maxRank in {_POWERS_OF_TWO}",
                    "message": "lora.maxRank must be a power of two from 1 to 256",
                    "fieldPath": ".maxRank",
                }
            ]
        }
    }

    @model_validator(mode="after")
    def _rank(self) -> LoraSpec:
        if self.max_rank not in _POWERS_OF_TWO:
            raise ValueError("lora.maxRank must be a power of two from 1 to 256")
        if len(set(self.target_modules)) != len(self.target_modules):
            raise ValueError("lora.targetModules lists a module twice")
        return self
