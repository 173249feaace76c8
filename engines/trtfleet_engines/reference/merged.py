"""A merged adapter on the CPU reference engine: one model with the adapter folded into its weights.

An Adapter with ``mode: merged`` is served by pods of its own whose engine has no LoRA at all: the base
weights with, for every adapted module, ``W + scale * (B @ A)`` (PEFT's ``scale``: ``lora_alpha / r``,
``lora_alpha / sqrt(r)`` with rsLoRA, rank and alpha patterns; :mod:`trtfleet_engines.lora.peft`). The
reference engine computes in float32, so the merge keeps the base weights' float32 and sums in float64,
rounding once (``trtfleet lora merge --dtype base``); its greedy outputs equal the same adapter served
dynamically, and its logits equal the dynamic float32 ones up to summation order (tests/unit/lora).

:func:`merged_model_dir` is the worker's one step (``trtfleet worker --merged-adapter DIR``); the worker then
serves that directory with the LoRA plugin off (:func:`trtfleet_engines.plan.merged_spec`) under the
adapter's served name. Errors: :class:`~trtfleet_engines.reference.errors.RepositoryError` for an adapter
that cannot be merged into this model (the merge's own text, e.g. another base model's adapter).

:func:`base_variant_dir` (``trtfleet worker --base-quantization SPEC``) first replaces the base by the one a
QLoRA adapter was trained on: its linear weights quantized and dequantized as bitsandbytes does.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Final

from trtfleet_engines.lora.errors import LoraConversionError
from trtfleet_engines.lora.merge import merge_dir
from trtfleet_engines.reference.errors import RepositoryError

MERGED_SUBDIR: Final = "merged-model"
BASE_VARIANT_SUBDIR: Final = "base-variant"


@dataclass(frozen=True)
class MergedAdapter:
    """``trtfleet worker --merged-adapter DIR [--merged-adapter-name NAME]``: a PEFT directory and its name."""

    adapter_dir: Path
    served_name: str

    @classmethod
    def from_flags(cls, adapter_dir: Path, served_name: str | None) -> MergedAdapter:
        """The served name defaults to the adapter directory's name (as the sample adapters are named)."""
        name = served_name or adapter_dir.resolve().name
        if not name:
            raise RepositoryError(f"--merged-adapter {adapter_dir}: give the adapter's served name")
        return cls(adapter_dir, name)


def merged_model_dir(base_dir: Path, adapter: MergedAdapter, work_dir: Path) -> Path:
    """Write ``base_dir`` with ``adapter`` folded in under ``work_dir``; the model directory to serve."""
    out = work_dir / MERGED_SUBDIR
    try:
        merge_dir(base_dir, adapter.adapter_dir, out, None)
    except LoraConversionError as exc:
        raise RepositoryError(f"cannot merge adapter {adapter.served_name} ({adapter.adapter_dir}): {exc}") from exc
    return out


def base_variant_dir(base_dir: Path, spec_text: str, work_dir: Path) -> Path:
    """``base_dir`` as QLoRA trained on it (``--base-quantization SPEC``, :mod:`trtfleet_engines.lora.qlora_base`)
    under ``work_dir``: the model directory to serve or to merge into."""
    from trtfleet_engines.lora.qlora_base import BaseQuantization, write_base_variant

    out = work_dir / BASE_VARIANT_SUBDIR
    try:
        write_base_variant(base_dir, BaseQuantization.parse(spec_text), out)
    except (LoraConversionError, ValueError, OSError) as exc:
        raise RepositoryError(f"cannot build the {spec_text} base of {base_dir}: {exc}") from exc
    return out
