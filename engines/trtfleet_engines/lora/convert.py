"""PEFT LoRA adapter -> TensorRT-LLM runtime LoRA tensors (``model.lora_weights.npy`` + ``.lora_config.npy``).

The output is exactly what NVIDIA's ``hf_lora_convert.py`` writes and what Triton's ``tensorrt_llm``
model takes in a request's ``lora_weights`` / ``lora_config`` inputs:

* ``model.lora_weights.npy`` [1, N, W]: row i = A flattened (r x in, row-major) then B * scale
  flattened (out x r, row-major), zero-padded on the right to the longest row W, in the storage
  dtype (which must equal the engine dtype);
* ``model.lora_config.npy`` int32 [1, N, 3]: row i = [module_id, layer_idx, r].

Rows are ordered by layer, then module id. The scale (``alpha / r``, or ``alpha / sqrt(r)`` with
rslora, per module after ``rank_pattern`` / ``alpha_pattern``) multiplies B only, in float32, before
the single cast to the storage dtype.

Fused modules: ``qkv_proj`` -> ``attn_qkv`` (0), B rows [q; k; v] as in HF. ``gate_up_proj`` ->
``mlp_gate_up`` (18) for the Llama family (lora_helper's default mapping), ``mlp_h_to_4h`` (5) for Phi-3
(``Phi3ForCausalLM`` maps its fused fc layer to ``gate_up_proj``; ``examples/hf_lora_convert.py`` maps
``gate_up_proj`` -> ``mlp_h_to_4h``). Either way HF stores B rows as [gate; up] and TRT-LLM's fused layer
holds [up; gate] (its SwiGLU is ``silu(second half) * first half``; phi3/convert.py swaps the base
weight's halves the same way), so the two halves of B are swapped, as ``hf_lora_convert.py``'s
``preprocess_lora_weights`` does for every ``gate_up_proj``.

``attn_dense``: TRT-LLM's runtime sizes it hidden x hidden (``loraModule.cpp`` ``createLoraModules``), so an
``o_proj`` adapter whose input is heads x head_dim != hidden (gemma-7b: 4096 vs 3072) is refused: the runtime
would read its rows with the wrong width.

bfloat16: numpy has no bfloat16. The weights are stored as their raw 2-byte bit patterns with numpy
dtype ``|V2`` (what TRT-LLM's ``torch_to_numpy`` writes), rounded to nearest-even from float32. Read
them back with ``bits = np.load(path).view(np.uint16)`` and
``values = (bits.astype(np.uint32) << 16).view(np.float32)``; send them to Triton as a BF16 tensor
from the same bytes.

``convert_adapter`` is pure; ``convert_dir`` is the I/O shell: it writes into a temporary directory
beside ``OUT_DIR`` and renames it into place, so a failure leaves no ``OUT_DIR`` (and ``--force``
swaps an old one out only after the new one is complete). Errors: ``trtfleet_engines.lora.errors``.
"""

from __future__ import annotations

import logging
import os
import shutil
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

import numpy as np
from numpy.typing import NDArray

from trtfleet.api.basemodel import (
    DEFAULT_TARGET_MODULES,
    Architecture,
    Dtype,
    LoraModule,
    ModelDimensions,
)
from trtfleet_engines.lora.errors import (
    DtypeMismatchError,
    NonFiniteWeightsError,
    OutputExistsError,
    RankTooLargeError,
    ShapeMismatchError,
    TargetModuleError,
)
from trtfleet_engines.lora.manifest import (
    LORA_CONFIG_FILE,
    LORA_WEIGHTS_FILE,
    MANIFEST_FILE,
    build_manifest,
    write_manifest,
)
from trtfleet_engines.lora.peft import (
    ADAPTER_CONFIG,
    ADAPTER_SAFETENSORS,
    PeftAdapter,
    PeftModule,
    parse_peft_adapter,
    read_peft_dir,
    trtllm_module_name,
)
from trtfleet_engines.lora.rows import ConvertedAdapter, LoraRow

logger = logging.getLogger(__name__)

DEFAULT_MAX_RANK: Final = 64  # trtllm-build --max_lora_rank default
BFLOAT16_STORAGE: Final = np.dtype("V2")
DTYPE_BYTES: Final = 2


@dataclass(frozen=True)
class ConversionOptions:
    dtype: Dtype = Dtype.FLOAT16
    target_modules: tuple[LoraModule, ...] = DEFAULT_TARGET_MODULES
    max_rank: int = DEFAULT_MAX_RANK
    dims: ModelDimensions | None = None
    engine_dtype: Dtype | None = None
    architecture: Architecture | None = None


def float32_to_bfloat16_bits(values: NDArray[np.float32]) -> NDArray[np.uint16]:
    """Round float32 to the nearest bfloat16 (ties to even); returns the 16-bit patterns. NaN not allowed."""
    bits = np.ascontiguousarray(values, dtype=np.float32).view(np.uint32)
    rounding = ((bits >> 16) & 1) + np.uint32(0x7FFF)
    return ((bits + rounding) >> 16).astype(np.uint16)


def bfloat16_bits_to_float32(bits: NDArray[Any]) -> NDArray[np.float32]:
    """bfloat16 bit patterns (uint16 or |V2) -> float32, exactly."""
    raw = np.ascontiguousarray(bits).view(np.uint16)
    return (raw.astype(np.uint32) << 16).view(np.float32)


def stored_to_float32(weights: NDArray[Any]) -> NDArray[np.float32]:
    """Converted weights (float16 / float32 / bfloat16 bits) as float32."""
    if weights.dtype.kind == "V" or weights.dtype == np.uint16:
        return bfloat16_bits_to_float32(weights)
    values: NDArray[np.float32] = weights.astype(np.float32)
    return values


def _expected_dims(dims: ModelDimensions, module: LoraModule, hf_module: str) -> tuple[int, int]:
    """(in, out) TRT-LLM's runtime expects (loraModule.cpp ``createLoraModules``: attn_dense is hidden x hidden)."""
    q = dims.num_attention_heads * dims.head_size
    kv = dims.num_kv_heads * dims.head_size
    hidden, inter = dims.hidden_size, dims.intermediate_size
    if hf_module == "gate_up_proj":
        return hidden, 2 * inter  # fused gate and up, whichever module id it maps to
    table = {
        LoraModule.ATTN_QKV: (hidden, q + 2 * kv),
        LoraModule.ATTN_Q: (hidden, q),
        LoraModule.ATTN_K: (hidden, kv),
        LoraModule.ATTN_V: (hidden, kv),
        LoraModule.ATTN_DENSE: (hidden, hidden),
        LoraModule.MLP_H_TO_4H: (hidden, inter),
        LoraModule.MLP_GATE: (hidden, inter),
        LoraModule.MLP_4H_TO_H: (inter, hidden),
        LoraModule.MLP_GATE_UP: (hidden, 2 * inter),
    }
    return table[module]


def _check_module(module: PeftModule, options: ConversionOptions) -> LoraRow:
    trt_module = LoraModule(trtllm_module_name(module.hf_module, options.architecture))
    if trt_module not in options.target_modules:
        enabled = " ".join(m.value for m in options.target_modules)
        raise TargetModuleError(
            f"lora module {trt_module.value} ({module.path}) not enabled for this model "
            f"(engine --lora_target_modules: {enabled})"
        )
    if module.rank > options.max_rank:
        raise RankTooLargeError(
            f"{module.path}: rank {module.rank} is above the engine's max_lora_rank {options.max_rank}"
        )
    in_dim, out_dim = int(module.a.shape[1]), int(module.b.shape[0])
    if options.dims is not None:
        if module.layer >= options.dims.num_layers:
            raise ShapeMismatchError(
                f"{module.path}: layer {module.layer} but the base model has {options.dims.num_layers} layers"
            )
        expected = _expected_dims(options.dims, trt_module, module.hf_module)
        if (in_dim, out_dim) != expected:
            raise ShapeMismatchError(
                f"{module.path}: LoRA maps {in_dim} -> {out_dim} features but TRT-LLM's "
                f"{trt_module.value} for this base model maps {expected[0]} -> {expected[1]}"
                + (
                    " (TRT-LLM sizes attn_dense hidden x hidden; this model's o_proj input is heads x head_dim: "
                    "retrain without o_proj)"
                    if trt_module is LoraModule.ATTN_DENSE
                    else ""
                )
            )
    if module.hf_module == "gate_up_proj" and out_dim % 2:
        raise ShapeMismatchError(f"{module.path}: fused gate_up_proj B has an odd number of rows ({out_dim})")
    return LoraRow(trt_module, module.layer, module.rank, in_dim, out_dim)


def _row_values(module: PeftModule, row: LoraRow) -> NDArray[np.float32]:
    b = module.b * np.float32(module.scale)
    if module.hf_module == "gate_up_proj":
        half = row.out_dim // 2
        b = np.concatenate([b[half:], b[:half]])  # HF [gate; up] -> TRT-LLM [up; gate]
    values: NDArray[np.float32] = np.concatenate([module.a.reshape(-1), b.reshape(-1)]).astype(np.float32)
    if not np.isfinite(values).all():
        raise NonFiniteWeightsError(f"{module.path}: NaN or Inf in lora_A / lora_B * scale")
    return values


def convert_adapter(adapter: PeftAdapter, options: ConversionOptions) -> ConvertedAdapter:
    """The TRT-LLM tensors of a parsed PEFT adapter (pure)."""
    if options.dtype not in (Dtype.FLOAT16, Dtype.BFLOAT16):
        raise DtypeMismatchError(f"storage dtype {options.dtype} is not float16 or bfloat16")
    if options.engine_dtype is not None and options.engine_dtype != options.dtype:
        raise DtypeMismatchError(
            "Expected lora weights to be the same data type as base model: engine is "
            f"{options.engine_dtype.value}, conversion asked for {options.dtype.value} "
            "(a mismatch silently serves the base model)"
        )
    checked = [(module, _check_module(module, options)) for module in adapter.modules]
    checked.sort(key=lambda pair: (pair[1].layer, pair[1].module_id))
    width = max(row.elements for _, row in checked)
    values = np.zeros((1, len(checked), width), np.float32)
    for i, (module, row) in enumerate(checked):
        values[0, i, : row.elements] = _row_values(module, row)
    stored: NDArray[Any]
    if options.dtype is Dtype.FLOAT16:
        with np.errstate(over="ignore"):
            stored = values.astype(np.float16)
        finite = np.isfinite(stored)
    else:
        bits = float32_to_bfloat16_bits(values)
        finite = np.isfinite(bfloat16_bits_to_float32(bits))
        stored = bits.view(BFLOAT16_STORAGE)
    if not finite.all():
        row_index = int(np.argwhere(~finite)[0][1])
        bad = checked[row_index][0]
        raise NonFiniteWeightsError(f"{bad.path}: weights overflow {options.dtype.value} (|value| too large)")
    config = np.array([[[row.module_id, row.layer, row.rank] for _, row in checked]], dtype=np.int32)
    return ConvertedAdapter(stored, config, tuple(row for _, row in checked), options.dtype)


def _write_npy(path: Path, array: NDArray[Any]) -> None:
    with path.open("wb") as handle:
        np.save(handle, array, allow_pickle=False)
        handle.flush()
        os.fsync(handle.fileno())


def convert_dir(
    src_dir: Path,
    out_dir: Path,
    options: ConversionOptions,
    *,
    base_config: Path | None = None,
    replace: bool = False,
) -> ConvertedAdapter:
    """Read a PEFT directory, convert it and write ``out_dir`` atomically (with ``manifest.json``)."""
    if out_dir.exists() and not replace:
        raise OutputExistsError(f"{out_dir} exists; pass --force to replace it")
    raw_config, tensors = read_peft_dir(src_dir)
    converted = convert_adapter(parse_peft_adapter(raw_config, tensors), options)
    inputs = [src_dir / ADAPTER_CONFIG, src_dir / ADAPTER_SAFETENSORS]
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}.tmp-", dir=out_dir.parent))
    try:
        _write_npy(staging / LORA_WEIGHTS_FILE, converted.weights)
        _write_npy(staging / LORA_CONFIG_FILE, converted.config)
        manifest = build_manifest(converted, raw_config, inputs=inputs, out_dir=staging, base_config=base_config)
        write_manifest(staging / MANIFEST_FILE, manifest)
        swap_into_place(staging, out_dir)
    finally:
        if staging.exists():
            shutil.rmtree(staging)
    logger.info(
        "converted %s -> %s: %d rows, rank %d, %s, %d bytes",
        src_dir,
        out_dir,
        len(converted.rows),
        max(r.rank for r in converted.rows),
        converted.dtype.value,
        converted.weights.nbytes,
    )
    return converted


def swap_into_place(staging: Path, out_dir: Path) -> None:
    """Rename ``staging`` to ``out_dir``; an existing ``out_dir`` is moved aside first, removed after."""
    if not out_dir.exists():
        staging.rename(out_dir)
        return
    old = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}.old-", dir=out_dir.parent))
    old.rmdir()
    out_dir.rename(old)
    try:
        staging.rename(out_dir)
    except OSError:
        old.rename(out_dir)
        raise
    shutil.rmtree(old)


def parse_target_modules(names: Sequence[str]) -> tuple[LoraModule, ...]:
    """TRT-LLM module names (as for ``--lora_target_modules``) -> LoraModule, rejecting unknown ones."""
    known = {m.value: m for m in LoraModule}
    unknown = [n for n in names if n not in known]
    if unknown:
        raise TargetModuleError(f"unknown TRT-LLM lora module(s) {unknown}; known: {', '.join(known)}")
    return tuple(known[n] for n in names)
