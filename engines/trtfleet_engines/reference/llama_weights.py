"""The tiny reference Llama's configuration and base weights, loaded with numpy (no torch).

``LlamaConfig.from_hf_config`` reads an HF ``config.json`` (transformers 4.x ``rope_theta`` or 5.x
``rope_parameters``) and refuses what the numpy forward does not implement (other activations, RoPE
scaling, biases). ``LlamaWeights.load`` reads ``model.safetensors`` (HF names) into float32 arrays,
pre-transposed and fused (q|k|v, gate|up) for the forward pass.

Errors: ``ValueError`` for a config or checkpoint this forward cannot run; ``OSError`` from reading.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

import numpy as np
from numpy.typing import NDArray
from safetensors.numpy import load_file

FloatArray = NDArray[np.float32]

ASSETS_DIR: Final[Path] = Path(__file__).resolve().parent / "assets"
TINY_LLAMA_DIR: Final[Path] = ASSETS_DIR / "tiny-llama"
SAMPLE_ADAPTERS_DIR: Final[Path] = ASSETS_DIR / "adapters"
SAMPLE_ADAPTER_NAMES: Final = ("upper", "reverse", "json")


@dataclass(frozen=True)
class LlamaConfig:
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    vocab_size: int
    rope_theta: float
    rms_norm_eps: float
    max_position_embeddings: int

    @classmethod
    def from_hf_config(cls, path: Path | str) -> LlamaConfig:
        """Read an HF ``config.json`` (or the directory holding it) of a plain Llama model."""
        file = Path(path)
        if file.is_dir():
            file = file / "config.json"
        return cls.from_hf_dict(json.loads(file.read_text(encoding="utf-8")))

    @classmethod
    def from_hf_dict(cls, raw: Mapping[str, Any]) -> LlamaConfig:
        # transformers >= 5 writes rope_parameters {rope_theta, rope_type}; older: rope_theta, rope_scaling.
        rope = raw.get("rope_parameters") or {}
        unsupported = {
            "hidden_act": (raw.get("hidden_act", "silu"), "silu"),
            "rope_scaling": (raw.get("rope_scaling"), None),
            "rope_type": (rope.get("rope_type", "default"), "default"),
            "attention_bias": (bool(raw.get("attention_bias", False)), False),
            "mlp_bias": (bool(raw.get("mlp_bias", False)), False),
        }
        for key, (value, wanted) in unsupported.items():
            if value != wanted:
                raise ValueError(f"config.json: {key}={value!r} is not supported (need {wanted!r})")
        hidden = int(raw["hidden_size"])
        heads = int(raw["num_attention_heads"])
        head_dim = raw.get("head_dim")
        return cls(
            hidden_size=hidden,
            intermediate_size=int(raw["intermediate_size"]),
            num_layers=int(raw["num_hidden_layers"]),
            num_heads=heads,
            num_kv_heads=int(raw.get("num_key_value_heads") or heads),
            head_dim=int(head_dim) if head_dim else hidden // heads,
            vocab_size=int(raw["vocab_size"]),
            rope_theta=float(raw.get("rope_theta", rope.get("rope_theta", 10000.0))),
            rms_norm_eps=float(raw.get("rms_norm_eps", 1e-6)),
            max_position_embeddings=int(raw.get("max_position_embeddings", 2048)),
        )

    @property
    def q_size(self) -> int:
        return self.num_heads * self.head_dim

    @property
    def kv_size(self) -> int:
        return self.num_kv_heads * self.head_dim

    def module_dims(self, module_id: int) -> tuple[int, int]:
        """(in, out) features of a TRT-LLM LoRA module id on this model (full, unsharded)."""
        hidden, inter = self.hidden_size, self.intermediate_size
        dims = {
            0: (hidden, self.q_size + 2 * self.kv_size),
            1: (hidden, self.q_size),
            2: (hidden, self.kv_size),
            3: (hidden, self.kv_size),
            4: (self.q_size, hidden),
            5: (hidden, inter),
            6: (inter, hidden),
            7: (hidden, inter),
            18: (hidden, 2 * inter),
        }
        if module_id not in dims:
            raise ValueError(f"lora module id {module_id} is not supported by the reference engine")
        return dims[module_id]


@dataclass(frozen=True)
class LayerWeights:
    """One decoder layer, pre-transposed for ``x @ w``; ``gate_up_t`` columns are [gate | up]."""

    input_norm: FloatArray
    qkv_t: FloatArray
    o_t: FloatArray
    post_norm: FloatArray
    gate_up_t: FloatArray
    down_t: FloatArray


class LlamaWeights:
    """All base weights, float32 in memory."""

    def __init__(
        self,
        config: LlamaConfig,
        embed: FloatArray,
        layers: Sequence[LayerWeights],
        final_norm: FloatArray,
        lm_head_t: FloatArray,
    ) -> None:
        self.config = config
        self.embed = embed
        self.layers = tuple(layers)
        self.final_norm = final_norm
        self.lm_head_t = lm_head_t

    @classmethod
    def load(cls, model_dir: Path | str = TINY_LLAMA_DIR) -> LlamaWeights:
        """Load ``config.json`` + ``model.safetensors`` (HF names) from ``model_dir``."""
        model_dir = Path(model_dir)
        config = LlamaConfig.from_hf_config(model_dir / "config.json")
        tensors = load_file(str(model_dir / "model.safetensors"))
        return cls.from_hf_state_dict(config, tensors)

    @classmethod
    def from_hf_state_dict(cls, config: LlamaConfig, tensors: Mapping[str, NDArray[Any]]) -> LlamaWeights:
        def get(name: str) -> FloatArray:
            if name not in tensors:
                raise ValueError(f"model.safetensors has no tensor {name}")
            return np.ascontiguousarray(tensors[name], dtype=np.float32)

        layers = []
        for i in range(config.num_layers):
            p = f"model.layers.{i}."
            qkv = np.concatenate(
                [
                    get(p + "self_attn.q_proj.weight"),
                    get(p + "self_attn.k_proj.weight"),
                    get(p + "self_attn.v_proj.weight"),
                ]
            )
            gate_up = np.concatenate([get(p + "mlp.gate_proj.weight"), get(p + "mlp.up_proj.weight")])
            layers.append(
                LayerWeights(
                    input_norm=get(p + "input_layernorm.weight"),
                    qkv_t=np.ascontiguousarray(qkv.T),
                    o_t=np.ascontiguousarray(get(p + "self_attn.o_proj.weight").T),
                    post_norm=get(p + "post_attention_layernorm.weight"),
                    gate_up_t=np.ascontiguousarray(gate_up.T),
                    down_t=np.ascontiguousarray(get(p + "mlp.down_proj.weight").T),
                )
            )
        embed = get("model.embed_tokens.weight")
        lm_head = get("lm_head.weight") if "lm_head.weight" in tensors else embed  # tied embeddings
        expected = (config.vocab_size, config.hidden_size)
        if embed.shape != expected or lm_head.shape != expected:
            raise ValueError(f"embedding shape {embed.shape} / lm_head {lm_head.shape} != {expected}")
        return cls(config, embed, layers, get("model.norm.weight"), np.ascontiguousarray(lm_head.T))
