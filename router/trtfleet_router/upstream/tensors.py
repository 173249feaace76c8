"""Triton tensor encodings (pure): raw little-endian bytes <-> typed contents <-> JSON data.

Triton's raw form is little-endian, row-major; a ``BYTES`` element is a 4-byte little-endian length
followed by the bytes. Requests sent upstream always use ``raw_input_contents`` (Triton forbids mixing
raw and typed inputs in one request, and LoRA weights only travel raw), so typed gRPC requests from
clients are normalised with :func:`normalize_to_raw` first.
"""

from __future__ import annotations

import struct
from collections.abc import Iterable, Sequence
from typing import Any, Final

import numpy as np
from tritonclient.grpc import service_pb2

from trtfleet_router.errors import MalformedRequest

InferInputTensor = Any  # service_pb2.ModelInferRequest.InferInputTensor (no type stubs)

NUMPY_DTYPES: Final[dict[str, Any]] = {
    "BOOL": np.dtype(np.bool_),
    "UINT8": np.dtype("<u1"),
    "UINT16": np.dtype("<u2"),
    "UINT32": np.dtype("<u4"),
    "UINT64": np.dtype("<u8"),
    "INT8": np.dtype("<i1"),
    "INT16": np.dtype("<i2"),
    "INT32": np.dtype("<i4"),
    "INT64": np.dtype("<i8"),
    "FP16": np.dtype("<f2"),
    "FP32": np.dtype("<f4"),
    "FP64": np.dtype("<f8"),
    "BF16": np.dtype("<u2"),  # carried as raw 2-byte words; never decoded by the router
}

# InferTensorContents field holding each datatype when a client sends typed contents.
CONTENTS_FIELD: Final[dict[str, str]] = {
    "BOOL": "bool_contents",
    "UINT8": "uint_contents",
    "UINT16": "uint_contents",
    "UINT32": "uint_contents",
    "UINT64": "uint64_contents",
    "INT8": "int_contents",
    "INT16": "int_contents",
    "INT32": "int_contents",
    "INT64": "int64_contents",
    "FP32": "fp32_contents",
    "FP64": "fp64_contents",
    "BYTES": "bytes_contents",
}

_U32 = struct.Struct("<I")
_I32 = struct.Struct("<i")
_U64 = struct.Struct("<Q")
_F32 = struct.Struct("<f")


def encode_bytes(items: Iterable[bytes]) -> bytes:
    """``BYTES`` elements -> Triton's raw form."""
    return b"".join(_U32.pack(len(item)) + item for item in items)


def decode_bytes(raw: bytes) -> list[bytes]:
    """Triton's raw ``BYTES`` form -> elements."""
    items, offset, end = [], 0, len(raw)
    while offset < end:
        if offset + 4 > end:
            raise MalformedRequest("truncated BYTES tensor: a length prefix is cut off")
        (length,) = _U32.unpack_from(raw, offset)
        offset += 4
        if offset + length > end:
            raise MalformedRequest("truncated BYTES tensor: an element is shorter than its length prefix")
        items.append(raw[offset : offset + length])
        offset += length
    return items


def raw_int32(value: int) -> bytes:
    return _I32.pack(value)


def raw_uint64(value: int) -> bytes:
    return _U64.pack(value)


def raw_fp32(value: float) -> bytes:
    return _F32.pack(value)


def raw_bool(value: bool) -> bytes:
    return b"\x01" if value else b"\x00"


def element_count(shape: Sequence[int]) -> int:
    count = 1
    for dim in shape:
        if dim < 0:
            raise MalformedRequest(f"tensor shape {list(shape)} has a negative dimension")
        count *= dim
    return count


def contents_to_raw(tensor: InferInputTensor) -> bytes:
    """A typed gRPC input -> raw bytes."""
    datatype = tensor.datatype
    if datatype == "BYTES":
        return encode_bytes(tensor.contents.bytes_contents)
    field = CONTENTS_FIELD.get(datatype)
    if field is None:
        raise MalformedRequest(f"input '{tensor.name}': datatype {datatype} must be sent as raw contents")
    values = list(getattr(tensor.contents, field))
    if len(values) != element_count(tensor.shape):
        raise MalformedRequest(f"input '{tensor.name}': {len(values)} values for shape {list(tensor.shape)}")
    return np.asarray(values, dtype=NUMPY_DTYPES[datatype]).tobytes()


def normalize_to_raw(request: service_pb2.ModelInferRequest) -> None:
    """Move typed ``contents`` of every input into ``raw_input_contents`` (in place)."""
    if request.raw_input_contents:
        if len(request.raw_input_contents) != len(request.inputs):
            raise MalformedRequest(f"{len(request.raw_input_contents)} raw contents for {len(request.inputs)} inputs")
        return
    raws = [contents_to_raw(tensor) for tensor in request.inputs]
    for tensor in request.inputs:
        tensor.ClearField("contents")
    request.raw_input_contents.extend(raws)


def json_to_raw(name: str, datatype: str, shape: Sequence[int], data: Any) -> bytes:
    """KServe v2 JSON ``data`` (nested or flat list, or a scalar) -> raw bytes."""
    count = element_count(shape)
    flat = _flatten(data)
    if len(flat) != count:
        raise MalformedRequest(f"input '{name}': {len(flat)} values for shape {list(shape)}")
    if datatype == "BYTES":
        return encode_bytes(v.encode("utf-8") if isinstance(v, str) else _bytes_value(name, v) for v in flat)
    dtype = NUMPY_DTYPES.get(datatype)
    if dtype is None or datatype in ("FP16", "BF16"):
        raise MalformedRequest(f"input '{name}': datatype {datatype} cannot travel as JSON; send it binary")
    if np.dtype(dtype).kind in "iu":  # numpy would wrap an out-of-range integer (with a warning), not refuse it
        limits = np.iinfo(dtype)
        for value in flat:
            if isinstance(value, int) and not limits.min <= value <= limits.max:
                raise MalformedRequest(f"input '{name}': {value} does not fit {datatype}")
    try:
        return np.asarray(flat, dtype=dtype).tobytes()
    except (TypeError, ValueError, OverflowError) as exc:
        raise MalformedRequest(f"input '{name}': values do not fit {datatype}: {exc}") from exc


def _bytes_value(name: str, value: Any) -> bytes:
    if isinstance(value, bool | int | float):
        return str(value).encode()
    raise MalformedRequest(f"input '{name}': BYTES elements must be strings")


def _flatten(data: Any) -> list[Any]:
    if not isinstance(data, list):
        return [data]
    flat: list[Any] = []
    stack = [iter(data)]
    while stack:
        for item in stack[-1]:
            if isinstance(item, list):
                stack.append(iter(item))
                break
            flat.append(item)
        else:
            stack.pop()
    return flat


def raw_to_json(datatype: str, raw: bytes) -> list[Any]:
    """Raw bytes -> a flat JSON list (BYTES as UTF-8 text, invalid sequences replaced)."""
    if datatype == "BYTES":
        return [item.decode("utf-8", errors="replace") for item in decode_bytes(raw)]
    dtype = NUMPY_DTYPES.get(datatype)
    if dtype is None:
        raise MalformedRequest(f"unknown datatype {datatype}")
    values: list[Any] = np.frombuffer(raw, dtype=dtype).tolist()
    return values
