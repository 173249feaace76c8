"""Errors of LoRA adapter conversion and inspection.

Every failure of ``trtfleet lora`` is a ``LoraConversionError`` (an ``EnginesError`` of
``trtfleet_engines.errors``); the CLI prints its message and exits with status 1. One class per case,
so callers (the operator's adapter pipeline, tests) can tell them apart without parsing text::

    LoraConversionError
    ├── AdapterFormatError          missing/unreadable files, unsafe .bin pickles, malformed keys or config
    ├── UnsupportedAdapterError     PEFT features TRT-LLM cannot serve
    │   ├── DoraNotSupportedError         use_dora
    │   ├── ModulesToSaveError            modules_to_save / trainable tokens (full weights, not LoRA)
    │   ├── EmbeddingTargetError          embed_tokens / lm_head targets
    │   └── UnknownModuleError            a module with no TRT-LLM LoRA equivalent
    ├── TargetModuleError           a module the engine was not built to adapt (--lora_target_modules)
    ├── RankTooLargeError           rank above the engine's max_lora_rank
    ├── NonFiniteWeightsError       NaN or Inf in A or B (or after scaling and the dtype cast)
    ├── ShapeMismatchError          A/B shapes that do not fit the base model's dimensions
    ├── DtypeMismatchError          storage dtype differs from the engine's (TRT-LLM would silently
    │                               serve the base model, or reject the request)
    ├── OutputExistsError           the output directory exists and replacing it was not asked for
    └── ManifestMismatchError       a converted directory whose files no longer match manifest.json
"""

from __future__ import annotations

from trtfleet_engines.errors import EnginesError


class LoraConversionError(EnginesError):
    """Base class of every ``trtfleet lora`` failure."""


class AdapterFormatError(LoraConversionError):
    pass


class UnsupportedAdapterError(LoraConversionError):
    pass


class DoraNotSupportedError(UnsupportedAdapterError):
    pass


class ModulesToSaveError(UnsupportedAdapterError):
    pass


class EmbeddingTargetError(UnsupportedAdapterError):
    pass


class UnknownModuleError(UnsupportedAdapterError):
    pass


class TargetModuleError(LoraConversionError):
    pass


class RankTooLargeError(LoraConversionError):
    pass


class NonFiniteWeightsError(LoraConversionError):
    pass


class ShapeMismatchError(LoraConversionError):
    pass


class DtypeMismatchError(LoraConversionError):
    pass


class OutputExistsError(LoraConversionError):
    pass


class ManifestMismatchError(LoraConversionError):
    pass


class BaseModelMismatchError(LoraConversionError):
    """``trtfleet lora merge``: the adapter adapts a weight the base model lacks or shapes differently."""


class BaseModelFormatError(LoraConversionError):
    """``trtfleet lora merge``: the base model directory cannot be read (no safetensors, a torch pickle, ...)."""
