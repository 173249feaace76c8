"""The tiny model's sample adapters, converted to TRT-LLM tensors, for the reference worker's tests."""

from __future__ import annotations

import itertools
from functools import cache

from trtfleet_engines.lora.convert import ConversionOptions, convert_adapter
from trtfleet_engines.lora.peft import parse_peft_adapter, read_peft_dir
from trtfleet_engines.reference.engine import model_dimensions
from trtfleet_engines.reference.numpy_llama import (
    SAMPLE_ADAPTER_NAMES,
    SAMPLE_ADAPTERS_DIR,
    TINY_LLAMA_DIR,
    LlamaConfig,
)
from trtfleet_engines.reference.repository import default_reference_spec

from tests.integration.reference.triton_client import Adapter

_task_ids = itertools.count(1001)


def new_task_id() -> int:
    """A task id no other test used (tests of a module share one worker and its cache)."""
    return next(_task_ids)


@cache
def sample_adapters() -> dict[str, Adapter]:
    """``upper``, ``reverse`` and ``json`` as ``trtfleet lora convert`` would write them (in memory)."""
    spec = default_reference_spec()
    dims = model_dimensions(LlamaConfig.from_hf_config(TINY_LLAMA_DIR))
    options = ConversionOptions(dims=dims, max_rank=spec.lora.max_rank, target_modules=tuple(spec.lora.target_modules))
    adapters = {}
    for name in SAMPLE_ADAPTER_NAMES:
        converted = convert_adapter(parse_peft_adapter(*read_peft_dir(SAMPLE_ADAPTERS_DIR / name)), options)
        adapters[name] = Adapter(name, converted.weights, converted.config)
    return adapters
