"""Settings of the reference ``tensorrt_llm`` model, read from its Triton model config (pure).

The config is the one the engines renderer writes for the real backend (same parameters) plus a few
``reference_*`` parameters standing in for what a real engine records at build time or reads from the
GPU. Triton hands the config to ``initialize`` as JSON; parameters are ``{"key": {"string_value": ...}}``.

=====================================  ==========================================================
parameter                              meaning
=====================================  ==========================================================
``reference_model_dir``                the tiny model (``config.json`` + ``model.safetensors``)
``exclude_input_in_output``            default for requests that do not send the input
``lora_cache_*``                       TRT-LLM's LoRA cache parameters (host bytes, gpu fraction, sizes)
``reference_dtype``                    engine dtype (``float16`` / ``bfloat16``), LoRA weights must match
``reference_max_input_len``            trtllm-build ``--max_input_len``
``reference_max_seq_len``              trtllm-build ``--max_seq_len``
``reference_max_num_tokens``           trtllm-build ``--max_num_tokens`` (tokens per step)
``reference_max_lora_rank``            trtllm-build ``--max_lora_rank``
``reference_lora_target_modules``      trtllm-build ``--lora_target_modules`` (comma-separated)
``reference_gpu_memory_bytes``         pretend free GPU memory (``lora_cache_gpu_memory_fraction`` x it)
``reference_lora_cache_device_bytes``  device tier bytes, overriding fraction x pretend GPU memory
``reference_min_step_ms``              pretend GPU step time: a step lasts at least this long (default 0)
``reference_prefill_us_per_token``     pretend prefill time: a step lasts this much longer per prompt
                                       position it computed (reused KV blocks excluded; default 0)
``enable_kv_cache_reuse``              KV-cache block reuse (TRT-LLM's parameter; true when unset, as in C++)
``max_tokens_in_paged_kv_cache``       KV-cache size in tokens (TRT-LLM's parameter; default
                                       ``max_batch_size x max_seq_len``)
``reference_tokens_per_block``         trtllm-build ``--tokens_per_block`` (default 32)
``reference_max_queue_size``           the executor's queue limit (0 = none)
``reference_speculative_config``       speculative decoding: the LLM-API ``speculative_config`` as JSON
                                       (NGram; :mod:`trtfleet_engines.reference.speculation`)
``reference_pcie_bytes_per_s``        pretend PCIe: a step copying adapters host -> device lasts their
                                       bytes over it longer (0: free; an H100: 50e9)
``reference_network_bytes_per_s``      pretend pod network: a request carrying LoRA weights is fetched once they
                                       crossed it, one after another (0: at once; 10 GbE: 1.25e9)
=====================================  ==========================================================

``max_batch_size`` is the config's own. TRT-LLM reads the executor's queue limit from
``dynamic_batching.default_queue_policy.max_queue_size``; the reference models render no Triton batcher
(:mod:`trtfleet_engines.triton.render` says why), so the limit comes from ``reference_max_queue_size``,
or from that block in a hand-written config that has one.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from trtfleet.api.basemodel import LoraModule
from trtfleet_engines.reference.adapters import LoraCacheSettings
from trtfleet_engines.reference.errors import RepositoryError
from trtfleet_engines.reference.kv_blocks import DEFAULT_TOKENS_PER_BLOCK, KvCacheSettings
from trtfleet_engines.reference.scheduler import BatchLimits
from trtfleet_engines.reference.speculation import SpeculationSettings, UnsupportedModeError

logger = logging.getLogger(__name__)

DEFAULT_GPU_MEMORY_BYTES = 4 * 1024 * 1024
"""Pretend free GPU memory of the reference engine; x ``lora_cache_gpu_memory_fraction`` = device tier."""
DEFAULT_HOST_CACHE_BYTES = 1 << 30
"""TRT-LLM's default ``lora_cache_host_memory_bytes`` (1 GiB)."""
DEFAULT_GPU_FRACTION = 0.05
CANCELLATION_CHECK_PERIOD_S = 0.1
"""How often the scheduler asks Triton whether clients cancelled (TRT-LLM: cancellation_check_period_ms)."""
STATS_PERIOD_S = 0.1
"""How often metrics are refreshed at most (TRT-LLM: stats_check_period_ms)."""


@dataclass(frozen=True)
class EngineSettings:
    model_dir: Path
    limits: BatchLimits
    exclude_input_in_output: bool
    dtype: str
    lora: LoraCacheSettings | None
    min_step_s: float = 0.0
    prefill_s_per_token: float = 0.0
    kv_cache: KvCacheSettings | None = None
    """None: a pool of ``max_batch_size x max_seq_len`` tokens with reuse on."""
    speculation: SpeculationSettings | None = None
    host_to_device_bytes_per_s: float = 0.0
    network_bytes_per_s: float = 0.0


def speculation_from_parameter(text: str) -> SpeculationSettings | None:
    """``reference_speculative_config`` (JSON of the LLM-API ``speculative_config``); None when empty."""
    if not text.strip():
        return None
    try:
        config = json.loads(text)
        if not isinstance(config, dict):
            raise ValueError("it is not a JSON object")
        return SpeculationSettings.from_config(config)
    except UnsupportedModeError as exc:
        logger.warning("%s: serving without speculation", exc)
        return None
    except ValueError as exc:
        raise RepositoryError(f"reference_speculative_config: {exc}") from exc


def parameters_of(model_config: Mapping[str, Any]) -> dict[str, str]:
    """``{key: string_value}`` of a model config's parameters."""
    raw = model_config.get("parameters") or {}
    return {key: str(value.get("string_value", "")) for key, value in raw.items()}


def _int(params: Mapping[str, str], key: str, default: int) -> int:
    value = params.get(key, "").strip()
    if not value:
        return default
    try:
        return int(float(value))
    except ValueError as exc:
        raise RepositoryError(f"parameter {key}={value!r} is not a number") from exc


def _float(params: Mapping[str, str], key: str, default: float) -> float:
    value = params.get(key, "").strip()
    try:
        return float(value) if value else default
    except ValueError as exc:
        raise RepositoryError(f"parameter {key}={value!r} is not a number") from exc


def _bool(params: Mapping[str, str], key: str, default: bool) -> bool:
    value = params.get(key, "").strip().lower()
    return default if not value else value in ("1", "true", "yes", "on")


def settings_from_model_config(model_config: Mapping[str, Any]) -> EngineSettings:
    """Read the reference engine's settings from the ``tensorrt_llm`` model config (Triton's JSON form)."""
    params = parameters_of(model_config)
    model_dir = params.get("reference_model_dir") or params.get("gpt_model_path")
    if not model_dir:
        raise RepositoryError("the tensorrt_llm config names no reference_model_dir")
    max_batch_size = int(model_config.get("max_batch_size") or 1)
    max_input_len = _int(params, "reference_max_input_len", 1024)
    queue = (model_config.get("dynamic_batching") or {}).get("default_queue_policy") or {}
    max_queue_size = _int(params, "reference_max_queue_size", int(queue.get("max_queue_size") or 0))
    limits = BatchLimits(
        max_batch_size=max_batch_size,
        max_num_tokens=_int(params, "reference_max_num_tokens", 8192),
        max_input_len=max_input_len,
        max_seq_len=_int(params, "reference_max_seq_len", max_input_len + 1024),
        max_queue_size=max(max_queue_size, 0),
    )
    dtype = params.get("reference_dtype") or "float16"
    lora: LoraCacheSettings | None = None
    if "lora_cache_host_memory_bytes" in params or "reference_lora_target_modules" in params:
        modules = [m.strip() for m in params.get("reference_lora_target_modules", "").split(",") if m.strip()]
        try:
            targets = tuple(LoraModule(m) for m in modules)
        except ValueError as exc:
            raise RepositoryError(f"reference_lora_target_modules: {exc}") from exc
        if not targets:
            raise RepositoryError("LoRA is enabled but reference_lora_target_modules is empty")
        gpu_bytes = _int(params, "reference_gpu_memory_bytes", DEFAULT_GPU_MEMORY_BYTES)
        fraction = _float(params, "lora_cache_gpu_memory_fraction", DEFAULT_GPU_FRACTION)
        lora = LoraCacheSettings(
            target_modules=targets,
            max_lora_rank=_int(params, "reference_max_lora_rank", 64),
            optimal_adapter_size=_int(params, "lora_cache_optimal_adapter_size", 8),
            max_adapter_size=_int(params, "lora_cache_max_adapter_size", 64),
            host_bytes=_int(params, "lora_cache_host_memory_bytes", DEFAULT_HOST_CACHE_BYTES),
            device_bytes=_int(params, "reference_lora_cache_device_bytes", int(fraction * gpu_bytes)),
            dtype=dtype,
        )
    tokens_per_block = _int(params, "reference_tokens_per_block", DEFAULT_TOKENS_PER_BLOCK)
    max_tokens = _int(params, "max_tokens_in_paged_kv_cache", limits.max_batch_size * limits.max_seq_len)
    try:
        kv_cache = KvCacheSettings(
            max_blocks=-(-max_tokens // max(tokens_per_block, 1)),
            tokens_per_block=tokens_per_block,
            enable_block_reuse=_bool(params, "enable_kv_cache_reuse", True),
        )
    except ValueError as exc:
        raise RepositoryError(f"KV cache parameters: {exc}") from exc
    return EngineSettings(
        model_dir=Path(model_dir),
        limits=limits,
        exclude_input_in_output=_bool(params, "exclude_input_in_output", False),
        dtype=dtype,
        lora=lora,
        min_step_s=_float(params, "reference_min_step_ms", 0.0) / 1000.0,
        prefill_s_per_token=max(0.0, _float(params, "reference_prefill_us_per_token", 0.0)) / 1e6,
        kv_cache=kv_cache,
        speculation=speculation_from_parameter(params.get("reference_speculative_config", "")),
        host_to_device_bytes_per_s=max(0.0, _float(params, "reference_pcie_bytes_per_s", 0.0)),
        network_bytes_per_s=max(0.0, _float(params, "reference_network_bytes_per_s", 0.0)),
    )
