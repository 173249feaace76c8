"""The base a QLoRA adapter was trained on: each linear weight quantized and dequantized as bitsandbytes does.

``BaseQuantization.parse("nf4:64:double:bfloat16")`` names a variant (quant type, block size, double
quantization of the statistics, the compute dtype the dequantized weights are used in).
:func:`write_base_variant` writes ``base_dir`` with the linear weights of the decoder layers
(``*_proj.weight``: what transformers replaces by ``Linear4bit``; embeddings, norms and ``lm_head`` stay as
they are) replaced by :func:`~trtfleet_engines.lora.bnb4bit.quantize_dequantize` of them, cast to the compute
dtype. ``trtfleet worker --base-quantization SPEC`` serves it; a merged adapter is then folded into this
variant, not into the original base. Errors: ``ValueError`` for a spec it cannot parse;
:class:`~trtfleet_engines.lora.errors.BaseModelFormatError` for a model it cannot take (no linear weights, a
weight dtype bitsandbytes does not quantize).
"""

from __future__ import annotations

import json
import shutil
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Final, Literal, cast

from trtfleet_engines.lora import safetensors_io
from trtfleet_engines.lora.bnb4bit import BLOCK_SIZES, QuantType, quantize_dequantize, round_to
from trtfleet_engines.lora.errors import BaseModelFormatError
from trtfleet_engines.lora.merge import SAFETENSORS_INDEX, read_safetensors_raw, to_float32, weight_files
from trtfleet_engines.lora.safetensors_io import RawTensor

ComputeDtype = Literal["float32", "float16", "bfloat16"]
VARIANT_RECORD: Final = "base_quantization.json"
_CODES: Final[dict[str, str]] = {"F32": "float32", "F16": "float16", "BF16": "bfloat16"}
_COMPUTE_DTYPES: Final = ("float32", "float16", "bfloat16")


@dataclass(frozen=True)
class BaseQuantization:
    """How QLoRA's base was quantized (bitsandbytes ``BitsAndBytesConfig``: ``bnb_4bit_quant_type``, its block
    size, ``bnb_4bit_use_double_quant``, ``bnb_4bit_compute_dtype``)."""

    quant_type: QuantType = "nf4"
    blocksize: int = 64
    double_quant: bool = False
    compute_dtype: ComputeDtype = "bfloat16"

    @classmethod
    def parse(cls, text: str) -> BaseQuantization:
        """``TYPE[:BLOCK][:double][:DTYPE]``, e.g. ``nf4``, ``fp4:128``, ``nf4:64:double:bfloat16``."""
        parts = [p for p in text.strip().lower().split(":") if p]
        if not parts or parts[0] not in ("nf4", "fp4"):
            raise ValueError(f"base quantization {text!r}: start with nf4 or fp4")
        spec = cls(quant_type=cast(QuantType, parts[0]))
        for part in parts[1:]:
            if part.isdigit() and int(part) in BLOCK_SIZES:
                spec = BaseQuantization(spec.quant_type, int(part), spec.double_quant, spec.compute_dtype)
            elif part == "double":
                spec = BaseQuantization(spec.quant_type, spec.blocksize, True, spec.compute_dtype)
            elif part in _COMPUTE_DTYPES:
                spec = BaseQuantization(spec.quant_type, spec.blocksize, spec.double_quant, cast(ComputeDtype, part))
            else:
                raise ValueError(f"base quantization {text!r}: {part!r} is no block size {BLOCK_SIZES}, "
                                 "'double' or a dtype (float32, float16, bfloat16)")
        return spec


def _variant(name: str, tensor: RawTensor, spec: BaseQuantization) -> RawTensor:
    """Dequantized in the weight's dtype, then ``.to(compute_dtype)`` (bitsandbytes' matmul), stored as float32
    (exact for values of any of the three dtypes; the reference engine computes in float32)."""
    if tensor.dtype not in _CODES:
        raise BaseModelFormatError(f"{name} is {tensor.dtype}: bitsandbytes quantizes float32, float16 or bfloat16")
    values = quantize_dequantize(to_float32(name, tensor), _CODES[tensor.dtype], spec.blocksize, spec.quant_type,
                                 double_quant=spec.double_quant)
    return RawTensor("F32", tensor.shape, round_to(values, spec.compute_dtype).astype("<f4").tobytes())


def write_base_variant(base_dir: Path, spec: BaseQuantization, out_dir: Path) -> tuple[str, ...]:
    """``base_dir`` (``model.safetensors``, or shards with ``model.safetensors.index.json``, one shard in memory at
    a time) with its linear weights replaced; the names replaced. Sharded checkpoints keep their shards and get an
    index with the new total size."""
    weight_map, index = weight_files(base_dir)
    replaced = tuple(sorted(n for n in weight_map if n.startswith("model.layers.") and n.endswith("_proj.weight")))
    if not replaced:
        raise BaseModelFormatError(f"{base_dir}: no decoder linear weights (model.layers.*_proj.weight)")
    shards = sorted(set(weight_map.values()))
    out_dir.mkdir(parents=True, exist_ok=False)
    for entry in base_dir.iterdir():
        if entry.name not in shards and entry.name != SAFETENSORS_INDEX and entry.is_file():
            shutil.copy2(entry, out_dir / entry.name)
    wanted, total = set(replaced), 0
    for shard in shards:
        tensors, metadata = read_safetensors_raw(base_dir / shard)
        total += safetensors_io.write(out_dir / shard, {n: (_variant(n, t, spec) if n in wanted else t)
                                                        for n, t in tensors.items()}, metadata)
    if index is not None:
        index = {**index, "metadata": {**(index.get("metadata") or {}), "total_size": total}}
        (out_dir / SAFETENSORS_INDEX).write_text(json.dumps(index, indent=2) + "\n", encoding="utf-8")
    record = {"baseQuantization": asdict(spec), "replaced": list(replaced)}
    (out_dir / VARIANT_RECORD).write_text(json.dumps(record, indent=2) + "\n", encoding="utf-8")
    return replaced
