"""``trtfleet lora merge``: fold a PEFT LoRA adapter into its base model's weights.

An Adapter with ``mode: merged`` is served by its own engine, built without the LoRA plugin from
base weights that already contain the adapter: for every adapted module

    W' = W + scale * (B @ A)        W [out, in], A [r, in], B [out, r]

with PEFT's own ``scale`` (``alpha / r``, ``alpha / sqrt(r)`` with rsLoRA, rank/alpha patterns; read by
:mod:`.peft`, which also refuses what TRT-LLM could not serve: DoRA, ``modules_to_save``, embeddings).
The product is computed in float32 and rounded once, to ``dtype`` (the engine's dtype: the checkpoint
converter casts every weight to it anyway). ``dtype=None`` keeps each weight's own float dtype and
computes in float64 (one rounding of the exact sum): the CPU reference engine, which computes in
float32, serves merged models this way (:mod:`trtfleet_engines.reference.merged`). Every other tensor
and every other file of the base directory (config, tokenizer, generation config) is copied unchanged,
byte for byte; sharded checkpoints keep their shards and get an updated ``model.safetensors.index.json``.

The base model must be safetensors (``pytorch_model*.bin`` is a torch pickle: loading it can run code,
so it is refused). Every adapted module must exist in the base model with the adapter's shape, else
:class:`~.errors.BaseModelMismatchError` (usually an adapter trained on another base model). The result
is written to a staging directory next to ``out_dir`` and renamed into place; ``merge.json`` in it
records what was merged. One shard is held in memory at a time.
"""

from __future__ import annotations

import json
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

import numpy as np
from numpy.typing import NDArray

from trtfleet.api.basemodel import Dtype
from trtfleet_engines.lora import safetensors_io
from trtfleet_engines.lora.convert import bfloat16_bits_to_float32, float32_to_bfloat16_bits, swap_into_place
from trtfleet_engines.lora.errors import (
    BaseModelFormatError,
    BaseModelMismatchError,
    NonFiniteWeightsError,
    OutputExistsError,
)
from trtfleet_engines.lora.manifest import sha256_file
from trtfleet_engines.lora.peft import (
    ADAPTER_CONFIG,
    ADAPTER_SAFETENSORS,
    PeftModule,
    parse_peft_adapter,
    read_peft_dir,
)
from trtfleet_engines.lora.safetensors_io import RawTensor

SAFETENSORS_FILE: Final = "model.safetensors"
SAFETENSORS_INDEX: Final = "model.safetensors.index.json"
MERGE_RECORD: Final = "merge.json"
KEEP_BASE_DTYPE: Final = "base"
"""`trtfleet lora merge --dtype base`: keep each weight's own dtype (``merge_dir(..., dtype=None)``)."""
_CODES: Final[dict[Dtype, str]] = {Dtype.FLOAT16: "F16", Dtype.BFLOAT16: "BF16"}


@dataclass(frozen=True)
class MergeResult:
    modules: int
    changed: tuple[str, ...]  # weight names rewritten
    shards: tuple[str, ...]
    dtype: Dtype | None  # None: each weight kept its own dtype


def read_safetensors_raw(path: Path) -> tuple[dict[str, RawTensor], dict[str, str] | None]:
    return safetensors_io.read_raw(path, BaseModelFormatError)


write_safetensors = safetensors_io.write


def to_float32(name: str, tensor: RawTensor) -> NDArray[np.float32]:
    if tensor.dtype == "BF16":
        return bfloat16_bits_to_float32(np.frombuffer(tensor.data, np.uint16)).reshape(tensor.shape)
    dtypes: dict[str, np.dtype[Any]] = {"F16": np.dtype("<f2"), "F32": np.dtype("<f4"), "F64": np.dtype("<f8")}
    if tensor.dtype not in dtypes:
        raise BaseModelFormatError(f"base weight {name} is {tensor.dtype}: only float weights can take a LoRA delta")
    values: NDArray[np.float32] = np.frombuffer(tensor.data, dtypes[tensor.dtype]).astype(np.float32)
    return values.reshape(tensor.shape)


_NUMPY_FLOATS: Final[dict[str, str]] = {"F16": "<f2", "F32": "<f4", "F64": "<f8"}


def _to_float64(name: str, tensor: RawTensor) -> NDArray[np.float64]:
    """A float weight widened to float64 (exact for F16, F32 and F64)."""
    if tensor.dtype not in _NUMPY_FLOATS:
        raise BaseModelFormatError(
            f"base weight {name} is {tensor.dtype}: keeping the base dtype needs F16, F32 or F64 "
            "(merge a BF16 model with --dtype bfloat16)"
        )
    values: NDArray[np.float64] = np.frombuffer(tensor.data, _NUMPY_FLOATS[tensor.dtype]).astype(np.float64)
    return values.reshape(tensor.shape)


def _from_float32(values: NDArray[np.float32], dtype: Dtype) -> RawTensor:
    if dtype is Dtype.BFLOAT16:
        data = float32_to_bfloat16_bits(values).tobytes()
    else:
        data = values.astype("<f2").tobytes()
    return RawTensor(_CODES[dtype], tuple(values.shape), data)


def merged_weight(name: str, base: RawTensor, modules: list[PeftModule], dtype: Dtype | None) -> RawTensor:
    """``base`` plus the deltas of ``modules`` (all adapting this weight), rounded once to ``dtype``
    (None: to the base weight's own dtype, the sum computed in float64)."""
    if dtype is None:
        return _merged_in_float64(name, base, modules)
    weight = to_float32(name, base).copy()
    _check_shapes(name, weight.shape, modules)
    for module in modules:
        weight += np.float32(module.scale) * (module.b @ module.a)
    if not np.isfinite(weight).all():
        raise NonFiniteWeightsError(f"{name}: the merged weight has NaN or infinite values")
    return _from_float32(weight, dtype)


def _merged_in_float64(name: str, base: RawTensor, modules: list[PeftModule]) -> RawTensor:
    weight = _to_float64(name, base)
    _check_shapes(name, weight.shape, modules)
    for module in modules:
        weight += module.scale * (module.b.astype(np.float64) @ module.a.astype(np.float64))
    with np.errstate(over="ignore"):
        rounded = weight.astype(_NUMPY_FLOATS[base.dtype])  # the one rounding
    if not np.isfinite(rounded).all():
        raise NonFiniteWeightsError(f"{name}: the merged weight has NaN or values beyond {base.dtype}")
    return RawTensor(base.dtype, tuple(rounded.shape), rounded.tobytes())


def _check_shapes(name: str, shape: tuple[int, ...], modules: list[PeftModule]) -> None:
    for module in modules:
        expected = (module.b.shape[0], module.a.shape[1])
        if shape != expected:
            raise BaseModelMismatchError(
                f"{module.path}: the adapter's lora_B @ lora_A is {list(expected)} but the base weight {name} is "
                f"{list(shape)}; is the adapter trained on another base model?"
            )


def weight_files(base_dir: Path) -> tuple[dict[str, str], dict[str, Any] | None]:
    """weight name -> shard file name, and the index document when the checkpoint is sharded."""
    index_file = base_dir / SAFETENSORS_INDEX
    if index_file.is_file():
        try:
            index = json.loads(index_file.read_text(encoding="utf-8"))
            weight_map = {str(k): str(v) for k, v in index["weight_map"].items()}
        except (OSError, ValueError, KeyError, AttributeError) as exc:
            raise BaseModelFormatError(f"cannot read {index_file}: {exc}") from exc
        return weight_map, index
    single = base_dir / SAFETENSORS_FILE
    if single.is_file():
        tensors, _ = read_safetensors_raw(single)
        return {name: SAFETENSORS_FILE for name in tensors}, None
    pickles = sorted(p.name for p in base_dir.glob("*.bin"))
    if pickles:
        raise BaseModelFormatError(
            f"{base_dir} holds {', '.join(pickles)}: torch pickles, which cannot be loaded without executing "
            "code; save the model as safetensors (save_pretrained(dir, safe_serialization=True))"
        )
    raise BaseModelFormatError(f"{base_dir} has neither {SAFETENSORS_FILE} nor {SAFETENSORS_INDEX}")


def merge_dir(
    base_dir: Path, adapter_dir: Path, out_dir: Path, dtype: Dtype | None, *, replace: bool = False
) -> MergeResult:
    """Write ``base_dir`` with the adapter of ``adapter_dir`` merged in to ``out_dir`` (atomically)."""
    if out_dir.exists() and not replace:
        raise OutputExistsError(f"{out_dir} exists; pass --force to replace it")
    if not base_dir.is_dir():
        raise BaseModelFormatError(f"{base_dir} is not a directory")
    raw_config, adapter_tensors = read_peft_dir(adapter_dir)
    adapter = parse_peft_adapter(raw_config, adapter_tensors)
    weight_map, index = weight_files(base_dir)
    by_weight: dict[str, list[PeftModule]] = {}
    for module in adapter.modules:
        name = f"{module.path}.weight"
        if name not in weight_map:
            raise BaseModelMismatchError(
                f"the adapter adapts {module.path}, but the base model has no weight {name}; "
                "is the adapter trained on another base model?"
            )
        by_weight.setdefault(name, []).append(module)
    shards = sorted(set(weight_map.values()))
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}.tmp-", dir=out_dir.parent))
    try:
        for entry in sorted(base_dir.iterdir()):
            if entry.name in shards or entry.name == SAFETENSORS_INDEX:
                continue
            if entry.is_dir():
                shutil.copytree(entry, staging / entry.name)
            else:
                shutil.copy2(entry, staging / entry.name)
        total = 0
        for shard in shards:
            tensors, metadata = read_safetensors_raw(base_dir / shard)
            for name in [n for n in tensors if n in by_weight]:
                tensors[name] = merged_weight(name, tensors[name], by_weight[name], dtype)
            total += write_safetensors(staging / shard, tensors, metadata)
        if index is not None:
            index = {**index, "metadata": {**(index.get("metadata") or {}), "total_size": total}}
            (staging / SAFETENSORS_INDEX).write_text(json.dumps(index, indent=2) + "\n", encoding="utf-8")
        record = {
            "adapter": {
                "dir": str(adapter_dir),
                "sha256": {f: sha256_file(adapter_dir / f) for f in (ADAPTER_CONFIG, ADAPTER_SAFETENSORS)},
                "rank": adapter.max_rank,
            },
            "dtype": dtype.value if dtype is not None else "base",
            "merged_weights": sorted(by_weight),
        }
        (staging / MERGE_RECORD).write_text(json.dumps(record, indent=2) + "\n", encoding="utf-8")
        staging.chmod(0o755)  # mkdtemp makes it 0700; the result is an ordinary model directory
        swap_into_place(staging, out_dir)
    finally:
        if staging.exists():
            shutil.rmtree(staging)
    return MergeResult(len(adapter.modules), tuple(sorted(by_weight)), tuple(shards), dtype)
