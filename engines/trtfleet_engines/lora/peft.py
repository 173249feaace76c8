"""Reading HuggingFace PEFT LoRA adapters without torch.

``read_peft_dir`` (I/O) loads ``adapter_config.json`` and ``adapter_model.safetensors``;
``parse_peft_adapter`` (pure) validates them and resolves, per (layer, module), the rank and the
scale PEFT itself would use:

* ``r`` / ``lora_alpha`` from ``rank_pattern`` / ``alpha_pattern`` when a pattern key matches the
  module's path, with PEFT's rule: the first key ``k`` (in the file's order) for which
  ``re.match(rf"(.*\\.)?({k})$", path)`` succeeds, ``path`` being the name inside the base model
  (``model.layers.3.self_attn.q_proj``);
* scale = ``alpha / r``, or ``alpha / sqrt(r)`` with ``use_rslora``.

Safetensors are parsed here (a JSON header and raw little-endian data: F32, F16, BF16, F64), so
bfloat16 adapters need neither torch nor a numpy bfloat16 type. ``adapter_model.bin`` is a torch
pickle, and loading a pickle can execute arbitrary code: it is refused with ``AdapterFormatError``
(convert it once with ``safetensors.torch.save_file`` in a trusted environment).

Errors: see ``trtfleet_engines.lora.errors``.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

import numpy as np
from numpy.typing import NDArray

from trtfleet.api.basemodel import Architecture
from trtfleet_engines.lora.errors import (
    AdapterFormatError,
    DoraNotSupportedError,
    EmbeddingTargetError,
    ModulesToSaveError,
    ShapeMismatchError,
    UnknownModuleError,
    UnsupportedAdapterError,
)
from trtfleet_engines.lora.safetensors_io import read_raw

FloatArray = NDArray[np.float32]

ADAPTER_CONFIG: Final = "adapter_config.json"
ADAPTER_SAFETENSORS: Final = "adapter_model.safetensors"
ADAPTER_BIN: Final = "adapter_model.bin"

# HF module name -> TRT-LLM LoRA module name: the Llama family (lora_helper's default
# get_default_trtllm_modules_to_hf_modules, which maps mlp_gate_up <-> gate_up_proj); architectures whose TRT-LLM
# model maps a module elsewhere override it in ARCHITECTURE_MODULES.
HF_TO_TRTLLM: Final[dict[str, str]] = {
    "q_proj": "attn_q",
    "k_proj": "attn_k",
    "v_proj": "attn_v",
    "o_proj": "attn_dense",
    "gate_proj": "mlp_h_to_4h",
    "up_proj": "mlp_gate",
    "down_proj": "mlp_4h_to_h",
    "qkv_proj": "attn_qkv",
    "gate_up_proj": "mlp_gate_up",
}
ARCHITECTURE_MODULES: Final[dict[Architecture, dict[str, str]]] = {
    # Phi3ForCausalLM.trtllm_modules_to_hf_modules (tensorrt_llm/models/phi3/model.py@c4dc529f) maps
    # mlp_h_to_4h <-> gate_up_proj, and examples/hf_lora_convert.py maps gate_up_proj -> mlp_h_to_4h (5):
    # Phi-3's fused gate_up is its h_to_4h ("fc") layer, whose weight phi3/convert.py@89fd9b74 stores as [up; gate].
    Architecture.PHI3: {"gate_up_proj": "mlp_h_to_4h"},
}


def trtllm_module_name(hf_module: str, architecture: Architecture | None = None) -> str:
    """The TRT-LLM LoRA module an HF module maps to for ``architecture`` (None: the Llama-family default)."""
    if architecture is not None and hf_module in ARCHITECTURE_MODULES.get(architecture, {}):
        return ARCHITECTURE_MODULES[architecture][hf_module]
    return HF_TO_TRTLLM[hf_module]


EMBEDDING_MODULES: Final = frozenset({"embed_tokens", "lm_head", "wte", "embed_in", "embed_out"})

_SAFETENSORS_DTYPES: Final[dict[str, np.dtype[Any]]] = {
    "F64": np.dtype("<f8"),
    "F32": np.dtype("<f4"),
    "F16": np.dtype("<f2"),
    "BF16": np.dtype("<u2"),
}
_LORA_KEY: Final = re.compile(
    r"^(?:base_model\.model\.)?(?P<path>(?:.*\.)?layers\.(?P<layer>\d+)\.(?:\w+\.)?(?P<module>[A-Za-z_]\w*))"
    r"\.lora_(?P<which>A|B)(?:\.[A-Za-z0-9_-]+)?\.weight$"
)


@dataclass(frozen=True)
class PeftModule:
    """One (layer, module) of an adapter: ``a`` [r, in], ``b`` [out, r] (float32, unscaled)."""

    layer: int
    hf_module: str
    path: str
    a: FloatArray
    b: FloatArray
    scale: float

    @property
    def rank(self) -> int:
        return int(self.a.shape[0])

    @property
    def trtllm_module(self) -> str:
        return HF_TO_TRTLLM[self.hf_module]


@dataclass(frozen=True)
class PeftAdapter:
    config: Mapping[str, Any]
    modules: tuple[PeftModule, ...]

    @property
    def max_rank(self) -> int:
        return max(m.rank for m in self.modules)


def read_safetensors(path: Path) -> dict[str, FloatArray]:
    """All tensors of a safetensors file as float32 (bfloat16 widened exactly)."""
    tensors: dict[str, FloatArray] = {}
    for name, raw in read_raw(path, AdapterFormatError)[0].items():
        dtype = _SAFETENSORS_DTYPES.get(raw.dtype)
        if dtype is None:
            raise AdapterFormatError(
                f"{path}: tensor {name} is {raw.dtype}; LoRA weights must be F32, F16, BF16 or F64"
            )
        values = np.frombuffer(raw.data, dtype=dtype).reshape(raw.shape)
        if raw.dtype == "BF16":
            tensors[name] = (values.astype(np.uint32) << 16).view(np.float32)
        else:
            tensors[name] = values.astype(np.float32)
    return tensors


def read_peft_dir(src_dir: Path) -> tuple[dict[str, Any], dict[str, FloatArray]]:
    """The raw ``adapter_config.json`` mapping and tensors of a PEFT adapter directory."""
    config_file = src_dir / ADAPTER_CONFIG
    if not src_dir.is_dir():
        raise AdapterFormatError(f"{src_dir} is not a directory")
    try:
        config = json.loads(config_file.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise AdapterFormatError(f"cannot read {config_file}: {exc}") from exc
    if not isinstance(config, dict):
        raise AdapterFormatError(f"{config_file} is not a JSON object")
    weights = src_dir / ADAPTER_SAFETENSORS
    if not weights.is_file():
        if (src_dir / ADAPTER_BIN).is_file():
            raise AdapterFormatError(
                f"{src_dir / ADAPTER_BIN} is a torch pickle, which cannot be loaded without executing code; "
                "save the adapter as adapter_model.safetensors (model.save_pretrained(dir, "
                "safe_serialization=True), or safetensors.torch.save_file in a trusted environment)"
            )
        raise AdapterFormatError(f"{src_dir} has no {ADAPTER_SAFETENSORS}")
    return config, read_safetensors(weights)


def pattern_key(patterns: Mapping[str, Any], path: str) -> str | None:
    """PEFT's ``get_pattern_key``: the first pattern key matching ``path`` as a dotted suffix."""
    for key in patterns:
        if re.match(rf"(.*\.)?({key})$", path):
            return key
    return None


def _check_config(config: Mapping[str, Any]) -> None:
    peft_type = str(config.get("peft_type", "LORA")).upper()
    if peft_type != "LORA":
        raise UnsupportedAdapterError(f"peft_type {peft_type} is not LoRA; TRT-LLM serves LoRA adapters only")
    if config.get("use_dora"):
        raise DoraNotSupportedError(
            "use_dora=true: DoRA adapters are not supported (Triton's lora_config is [N, 3]; the DoRA "
            "magnitude column of newer converters is rejected by the tensorrt_llm model)"
        )
    if config.get("modules_to_save"):
        raise ModulesToSaveError(
            f"modules_to_save={config['modules_to_save']!r}: the adapter carries full trained copies of "
            "layers, which TRT-LLM's runtime LoRA cannot load; retrain without modules_to_save"
        )
    if config.get("trainable_token_indices"):
        raise ModulesToSaveError("trainable_token_indices: trained embedding rows cannot be served as LoRA")
    if config.get("lora_bias"):
        raise UnsupportedAdapterError("lora_bias=true: LoRA B biases are not supported by TRT-LLM")
    if config.get("target_parameters"):
        raise UnsupportedAdapterError("target_parameters (LoRA on raw parameters) is not supported by TRT-LLM")
    targets = config.get("target_modules") or []
    if isinstance(targets, str):
        targets = [targets]
    embedded = sorted(t for t in targets if t.split(".")[-1] in EMBEDDING_MODULES)
    if embedded:
        raise EmbeddingTargetError(f"target_modules {embedded}: LoRA on embeddings / lm_head is not supported")


def _config_number(config: Mapping[str, Any], key: str) -> float:
    value = config.get(key)
    if isinstance(value, bool) or not isinstance(value, int | float) or value <= 0:
        raise AdapterFormatError(f"adapter_config.json: {key} must be a positive number, got {value!r}")
    return float(value)


def parse_peft_adapter(config: Mapping[str, Any], tensors: Mapping[str, FloatArray]) -> PeftAdapter:
    """Validate a PEFT LoRA adapter and resolve each module's rank and scale (pure)."""
    _check_config(config)
    default_r = _config_number(config, "r")
    default_alpha = _config_number(config, "lora_alpha")
    rank_pattern: Mapping[str, Any] = config.get("rank_pattern") or {}
    alpha_pattern: Mapping[str, Any] = config.get("alpha_pattern") or {}
    use_rslora = bool(config.get("use_rslora", False))

    pairs: dict[str, dict[str, FloatArray]] = {}
    layers: dict[str, int] = {}
    for key, value in tensors.items():
        if "lora_magnitude_vector" in key or "weight_m_wdecomp" in key:
            raise DoraNotSupportedError(f"{key}: DoRA magnitude vectors are not supported")
        if "modules_to_save" in key or "trainable_tokens" in key:
            raise ModulesToSaveError(f"{key}: full-weight copies (modules_to_save) cannot be served as LoRA")
        if "lora_embedding_" in key or any(f".{m}." in f".{key}" for m in EMBEDDING_MODULES):
            raise EmbeddingTargetError(f"{key}: LoRA on embeddings / lm_head is not supported")
        match = _LORA_KEY.match(key)
        if match is None:
            raise AdapterFormatError(f"unsupported key {key} in the adapter weights")
        module = match["module"]
        if module not in HF_TO_TRTLLM:
            raise UnknownModuleError(
                f"{key}: module {module} has no TRT-LLM LoRA equivalent (supported: {', '.join(HF_TO_TRTLLM)})"
            )
        pairs.setdefault(match["path"], {})[match["which"]] = value
        layers[match["path"]] = int(match["layer"])
    if not pairs:
        raise AdapterFormatError("the adapter has no LoRA weights")

    modules = []
    for path, pair in pairs.items():
        if set(pair) != {"A", "B"}:
            raise AdapterFormatError(f"{path}: needs both lora_A and lora_B, found only lora_{''.join(pair)}")
        a, b = pair["A"], pair["B"]
        if a.ndim != 2 or b.ndim != 2 or a.shape[0] != b.shape[1] or a.shape[0] < 1:
            raise ShapeMismatchError(f"{path}: lora_A {a.shape} and lora_B {b.shape} are not [r, in] / [out, r]")
        r_key, alpha_key = pattern_key(rank_pattern, path), pattern_key(alpha_pattern, path)
        r = float(rank_pattern[r_key]) if r_key is not None else default_r
        alpha = float(alpha_pattern[alpha_key]) if alpha_key is not None else default_alpha
        if int(r) != a.shape[0]:
            raise ShapeMismatchError(
                f"{path}: adapter_config.json gives rank {int(r)} (r / rank_pattern) but lora_A has {a.shape[0]} rows"
            )
        scale = alpha / math.sqrt(r) if use_rslora else alpha / r
        hf_module = path.rsplit(".", 1)[-1]
        modules.append(PeftModule(layers[path], hf_module, path, a, b, scale))
    order = list(HF_TO_TRTLLM)
    modules.sort(key=lambda m: (m.layer, order.index(m.hf_module)))
    return PeftAdapter(dict(config), tuple(modules))
