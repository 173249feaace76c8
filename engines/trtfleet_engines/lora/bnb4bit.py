"""bitsandbytes' 4-bit weight quantization (QLoRA's base model), reproduced in numpy bit for bit.

An adapter trained with QLoRA learned against the base model as bitsandbytes quantized it: every weight
``W`` replaced by ``dequantize_4bit(quantize_4bit(W))``. Serving it on the original weights changes its
activations; serving it on that exact dequantized base does not. This module computes that base without
torch, following bitsandbytes 0.50's CPU kernels (``backends/default/ops.py`` quantize_4bit,
``backends/cpu/ops.py`` and its C library for the 8-bit blockwise statistics); tests/unit/lora/test_bnb4bit.py
proves it equal, bit for bit, to bitsandbytes' own output on committed fixtures (hack/gen_qlora_fixtures.py).

Quantization of a tensor (flattened, in blocks of ``blocksize``; a last partial block is its own block):

* ``absmax`` per block (float32); values scaled into [-1, 1] as ``x * (1 / absmax)`` (two float32
  roundings; the partial block divides once, as bitsandbytes does), then each value gets the index of the
  code-book bucket it falls in: the buckets are split at the midpoints of the sorted code book, a value on a
  midpoint goes to the lower bucket. FP4's code book is not sorted: the bucket is mapped back to its code.
  Two 4-bit indices per byte, the first in the high nibble.
* Double quantization (``bnb_4bit_use_double_quant``): the absmax values, less their mean (``offset``), are
  themselves quantized to 8 bits with bitsandbytes' dynamic code book in blocks of 256 (nearest code: the
  largest code not above the value, or the next one when strictly nearer).
* Dequantization: ``code[index] * absmax`` in float32 (absmax first dequantized, plus ``offset``), rounded
  once to the weight's dtype (float32, float16, or bfloat16 to nearest even).

The code books are facts of bitsandbytes: NF4's sixteen normal quantiles (QLoRA, arXiv 2305.14314), FP4's
sign/2-bit exponent/1-bit mantissa values divided by their maximum, the 8-bit dynamic map
(:func:`dynamic_code`, bitsandbytes' own table).

Measured against bitsandbytes 0.50.2 on the committed fixtures (48 cases: a tiny-Llama weight and an odd-sized
normal tensor, float32/float16/bfloat16, NF4/FP4, block sizes 64/128, with and without double quantization):
every case without double quantization is equal bit for bit (packed codes, absmax, dequantized weights). With
double quantization two residues remain: the mean subtracted from the absmax values is torch's float32 sum,
whose reduction order :func:`float32_mean` does not reproduce (one unit apart in some cases, which moves some
8-bit statistics codes), and bitsandbytes' C search for the nearest 8-bit code can pick the farther of two
neighbours (one code in two of the 24 cases). Errors: ``ValueError`` for an unknown quant type, block size or dtype.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Final, Literal

import numpy as np
from numpy.typing import NDArray

from trtfleet_engines.lora.convert import bfloat16_bits_to_float32, float32_to_bfloat16_bits

FloatArray = NDArray[np.float32]
QuantType = Literal["nf4", "fp4"]
BLOCK_SIZES: Final = (32, 64, 128, 256, 512, 1024, 2048, 4096)
STATISTICS_BLOCK_SIZE: Final = 256
"""Block size of the 8-bit quantization of the absmax values (double quantization)."""
_SMALLEST_ABSMAX: Final = np.float32(1e-38)

NF4_CODE: Final[FloatArray] = np.array(
    [
        -1.0, -0.6961928009986877, -0.5250730514526367, -0.39491748809814453, -0.28444138169288635,
        -0.18477343022823334, -0.09105003625154495, 0.0, 0.07958029955625534, 0.16093020141124725,
        0.24611230194568634, 0.33791524171829224, 0.44070982933044434, 0.5626170039176941, 0.7229568362236023, 1.0,
    ],
    np.float32,
)
_FP4_VALUES: Final = (0.0, 0.0625, 8.0, 12.0, 4.0, 6.0, 2.0, 3.0, 0.0, -0.0625, -8.0, -12.0, -4.0, -6.0, -2.0, -3.0)
"""Index 8 is the sign bit alone, yet bitsandbytes stores it as +0.0 (an integer ``-0`` in its table)."""


def fp4_code() -> FloatArray:
    """FP4 values in bit-pattern order, divided by the largest magnitude (float32, as bitsandbytes does)."""
    values = np.array(_FP4_VALUES, np.float32)
    code: FloatArray = values / np.abs(values).max()
    return code


def code_book(quant_type: QuantType) -> FloatArray:
    if quant_type == "nf4":
        return NF4_CODE
    if quant_type == "fp4":
        return fp4_code()
    raise ValueError(f"quant type {quant_type!r} is not nf4 or fp4")


DYNAMIC_CODE_FILE: Final = Path(__file__).resolve().parent / "bnb_dynamic_code.json"


@cache
def dynamic_code() -> FloatArray:
    """bitsandbytes' signed 8-bit dynamic map (``create_dynamic_map()``, sorted, 256 float32 values), read
    from the table hack/gen_qlora_fixtures.py wrote with bitsandbytes itself: the map comes from
    torch.linspace, whose vectorized CPU kernel rounds some entries unlike the scalar formula."""
    raw = json.loads(DYNAMIC_CODE_FILE.read_text(encoding="utf-8"))["float32_bits"]
    code: FloatArray = np.array([int(text, 16) for text in raw], np.uint32).view(np.float32)
    code.setflags(write=False)
    return code


def _check(blocksize: int) -> None:
    if blocksize not in BLOCK_SIZES:
        raise ValueError(f"block size {blocksize} is not one of {BLOCK_SIZES}")


def _blocks(values: FloatArray, blocksize: int) -> tuple[FloatArray, FloatArray]:
    """Full blocks [blocks, blocksize] and the last partial block (maybe empty)."""
    full = values.size - values.size % blocksize
    return values[:full].reshape(-1, blocksize), values[full:]


def quantize_4bit(values: FloatArray, blocksize: int, quant_type: QuantType) -> tuple[NDArray[np.uint8], FloatArray]:
    """Packed 4-bit indices (two per byte) and per-block absmax of ``values`` (float32, flattened)."""
    _check(blocksize)
    code = code_book(quant_type)
    order = np.argsort(code, kind="stable")
    bounds = (code[order[:-1]] + code[order[1:]]) / np.float32(2.0)
    flat = np.ascontiguousarray(values, np.float32).reshape(-1)
    blocks, rest = _blocks(flat, blocksize)
    absmax = np.abs(blocks).max(axis=1) if blocks.size else np.zeros(0, np.float32)
    inverse = np.float32(1.0) / np.maximum(absmax, _SMALLEST_ABSMAX)
    scaled = np.clip(blocks * inverse[:, None], -1, 1).reshape(-1)
    if rest.size:
        last = np.maximum(np.abs(rest).max(), _SMALLEST_ABSMAX)
        absmax = np.concatenate([absmax, np.array([last], np.float32)])
        scaled = np.concatenate([scaled, np.clip(rest / last, -1, 1)])
    if scaled.size % 2:
        scaled = np.concatenate([scaled, np.zeros(1, np.float32)])
    index = np.searchsorted(bounds, scaled, side="left")  # a value on a midpoint goes to the lower bucket
    nibbles = order[index].astype(np.uint8)
    packed: NDArray[np.uint8] = ((nibbles[0::2] << 4) | nibbles[1::2]).astype(np.uint8)
    return packed, absmax.astype(np.float32)


def dequantize_4bit(
    packed: NDArray[np.uint8], absmax: FloatArray, blocksize: int, quant_type: QuantType, size: int
) -> FloatArray:
    """float32 ``code[index] * absmax`` of the first ``size`` values (round to the weight dtype after)."""
    _check(blocksize)
    nibbles = np.empty(packed.size * 2, np.uint8)
    nibbles[0::2], nibbles[1::2] = packed >> 4, packed & 0xF
    values = code_book(quant_type)[nibbles[:size]]
    scale = np.repeat(absmax.astype(np.float32), blocksize)[:size]
    out: FloatArray = values * scale
    return out


def quantize_8bit(values: FloatArray, code: FloatArray, blocksize: int) -> tuple[NDArray[np.uint8], FloatArray]:
    """bitsandbytes' blockwise 8-bit quantization (its CPU kernel): absmax per block, ``x / absmax``, the
    largest code not above it, or the next when strictly nearer."""
    flat = np.ascontiguousarray(values, np.float32).reshape(-1)
    starts = range(0, flat.size, blocksize)
    absmax = np.array([np.abs(flat[s : s + blocksize]).max() for s in starts], np.float32)
    normed = flat / np.repeat(absmax, blocksize)[: flat.size]
    index = np.clip(np.searchsorted(code, normed, side="right") - 1, 0, code.size - 1)
    right = np.minimum(index + 1, code.size - 1)
    nearer = (index < code.size - 1) & (np.abs(normed - code[right]) < np.abs(normed - code[index]))
    return np.where(nearer, right, index).astype(np.uint8), absmax


def dequantize_8bit(quantized: NDArray[np.uint8], absmax: FloatArray, code: FloatArray, blocksize: int) -> FloatArray:
    out: FloatArray = code[quantized] * np.repeat(absmax, blocksize)[: quantized.size]
    return out


@dataclass(frozen=True)
class Quantized4bit:
    """One tensor as bitsandbytes stores it: packed indices and (maybe 8-bit quantized) statistics."""

    packed: NDArray[np.uint8]
    absmax: FloatArray | NDArray[np.uint8]  # float32, or the 8-bit codes with double quantization
    absmax2: FloatArray | None = None  # double quantization: the statistics' own block absmax
    offset: np.float32 | None = None  # double quantization: the mean subtracted before quantizing absmax

    def block_absmax(self) -> FloatArray:
        if self.absmax2 is None or self.offset is None:
            return self.absmax.astype(np.float32)
        restored = dequantize_8bit(self.absmax.astype(np.uint8), self.absmax2, dynamic_code(), STATISTICS_BLOCK_SIZE)
        out: FloatArray = restored + self.offset
        return out


def float32_mean(values: FloatArray) -> np.float32:
    """The float32 mean: the exact sum rounded once, then divided (torch may round its sum otherwise)."""
    return np.float32(np.float32(np.sum(values, dtype=np.float64)) / np.float32(values.size))


def quantize(
    values: FloatArray, blocksize: int, quant_type: QuantType, *, double_quant: bool, offset: np.float32 | None = None
) -> Quantized4bit:
    """``offset``: with double quantization, the mean of the absmax values to use (default: their exact mean
    rounded once; torch's float32 reduction order, which bitsandbytes inherits, can differ by one unit)."""
    packed, absmax = quantize_4bit(values, blocksize, quant_type)
    if not double_quant:
        return Quantized4bit(packed, absmax)
    offset = float32_mean(absmax) if offset is None else np.float32(offset)
    codes, absmax2 = quantize_8bit(absmax - offset, dynamic_code(), STATISTICS_BLOCK_SIZE)
    return Quantized4bit(packed, codes, absmax2, offset)


def round_to(values: FloatArray, dtype: str) -> FloatArray:
    """float32 values rounded once to ``dtype`` (float32, float16, bfloat16), returned as float32."""
    if dtype == "float32":
        return values.astype(np.float32)
    if dtype == "float16":
        return values.astype(np.float16).astype(np.float32)
    if dtype == "bfloat16":
        return bfloat16_bits_to_float32(float32_to_bfloat16_bits(values))
    raise ValueError(f"dtype {dtype!r} is not float32, float16 or bfloat16")


def quantize_dequantize(
    values: FloatArray,
    dtype: str,
    blocksize: int,
    quant_type: QuantType,
    *,
    double_quant: bool,
    offset: np.float32 | None = None,
) -> FloatArray:
    """The weight QLoRA trained against: ``values`` (already in ``dtype``, as float32) quantized and
    dequantized as bitsandbytes does, in ``dtype``, with the input's shape."""
    quantized = quantize(values, blocksize, quant_type, double_quant=double_quant, offset=offset)
    flat = dequantize_4bit(quantized.packed, quantized.block_absmax(), blocksize, quant_type, values.size)
    return round_to(flat, dtype).reshape(values.shape)
