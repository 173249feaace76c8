"""Safetensors files without torch: an 8-byte little-endian header length, a JSON header (name ->
dtype, shape, data offsets; optional ``__metadata__``), then the raw little-endian tensor data.

Used to read PEFT adapters (:mod:`.peft`) and to read and write base model shards (:mod:`.merge`);
tensors stay raw bytes of any dtype here, so bfloat16 needs no numpy bfloat16 type.
"""

from __future__ import annotations

import json
import math
import os
import struct
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

from trtfleet_engines.lora.errors import LoraConversionError

_HEADER_LIMIT: Final = 100 * 1024 * 1024
ITEM_BYTES: Final[dict[str, int]] = {
    "F64": 8, "F32": 4, "F16": 2, "BF16": 2, "I64": 8, "I32": 4, "I16": 2, "I8": 1, "U8": 1, "BOOL": 1,
}  # fmt: skip


@dataclass(frozen=True)
class RawTensor:
    """One safetensors entry, kept as its raw little-endian bytes."""

    dtype: str  # safetensors code: F16, BF16, F32, ...
    shape: tuple[int, ...]
    data: bytes | memoryview


def read_raw(path: Path, error: type[LoraConversionError]) -> tuple[dict[str, RawTensor], dict[str, str] | None]:
    """The tensors of ``path`` in file order and its ``__metadata__``; problems raise ``error``."""
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise error(f"cannot read {path}: {exc}") from exc
    if len(data) < 8:
        raise error(f"{path} is not a safetensors file (too short)")
    (header_len,) = struct.unpack("<Q", data[:8])
    if header_len > min(_HEADER_LIMIT, len(data) - 8):
        raise error(f"{path} is not a safetensors file (bad header length {header_len})")
    try:
        header = json.loads(data[8 : 8 + header_len])
    except ValueError as exc:
        raise error(f"{path} has an unreadable safetensors header: {exc}") from exc
    if not isinstance(header, dict):
        raise error(f"{path} has an unreadable safetensors header")
    body = memoryview(data)[8 + header_len :]
    metadata = header.pop("__metadata__", None)
    tensors: dict[str, RawTensor] = {}
    for name, info in header.items():
        try:
            code = str(info["dtype"])
            shape = tuple(int(d) for d in info["shape"])
            start, end = (int(x) for x in info["data_offsets"])
        except (KeyError, TypeError, ValueError) as exc:
            raise error(f"{path}: tensor {name} has an unreadable entry {info!r}") from exc
        size = ITEM_BYTES.get(code)
        if not 0 <= start <= end <= len(body) or (size is not None and end - start != math.prod(shape) * size):
            raise error(f"{path}: tensor {name} has inconsistent data offsets")
        tensors[name] = RawTensor(code, shape, body[start:end])
    return tensors, metadata


def write(path: Path, tensors: Mapping[str, RawTensor], metadata: Mapping[str, str] | None) -> int:
    """Write ``tensors`` (in the given order) to ``path`` and fsync it; returns the data bytes."""
    header: dict[str, Any] = {}
    if metadata is not None:
        header["__metadata__"] = dict(metadata)
    offset = 0
    for name, tensor in tensors.items():
        size = len(tensor.data)
        header[name] = {"dtype": tensor.dtype, "shape": list(tensor.shape), "data_offsets": [offset, offset + size]}
        offset += size
    encoded = json.dumps(header, separators=(",", ":")).encode("utf-8")
    encoded += b" " * (-len(encoded) % 8)  # the data starts 8-byte aligned
    with path.open("wb") as handle:
        handle.write(struct.pack("<Q", len(encoded)))
        handle.write(encoded)
        for tensor in tensors.values():
            handle.write(tensor.data)
        handle.flush()
        os.fsync(handle.fileno())
    return offset
