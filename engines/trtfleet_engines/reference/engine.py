"""Wire the reference engine from its settings: tiny Llama + LoRA cache + in-flight batcher.

Kept apart from the Triton model file so that tests (and benchmarks) can run the very same engine in
process, without Triton.
"""

from __future__ import annotations

import logging
from dataclasses import replace
from typing import Any, TypeVar

from numpy.typing import NDArray

from trtfleet.api.basemodel import ModelDimensions
from trtfleet_engines.reference.adapters import AdapterStore
from trtfleet_engines.reference.kv_blocks import DEFAULT_TOKENS_PER_BLOCK, BlockPool, KvCacheSettings
from trtfleet_engines.reference.kv_events import KvEventBuffer
from trtfleet_engines.reference.numpy_llama import AdapterWeights, LlamaConfig, LlamaWeights, TinyLlama
from trtfleet_engines.reference.scheduler import BatchLimits, InflightBatcher
from trtfleet_engines.reference.settings import EngineSettings
from trtfleet_engines.reference.speculation import SpeculationSettings, Speculator

logger = logging.getLogger(__name__)

H = TypeVar("H")


def model_dimensions(config: LlamaConfig) -> ModelDimensions:
    """The API's dimensions of a tiny Llama (what LoRA geometry is planned from)."""
    return ModelDimensions(
        hidden_size=config.hidden_size,
        intermediate_size=config.intermediate_size,
        num_layers=config.num_layers,
        num_attention_heads=config.num_heads,
        num_kv_heads=config.num_kv_heads,
        head_dim=config.head_dim,
        vocab_size=config.vocab_size,
    )


def build_adapter_store(settings: EngineSettings, config: LlamaConfig) -> AdapterStore | None:
    if settings.lora is None:
        return None

    def parse(weights: NDArray[Any], lora_config: NDArray[Any]) -> AdapterWeights:
        return AdapterWeights.from_trtllm(weights, lora_config, config)

    return AdapterStore(model_dimensions(config), settings.lora, parse)


def fit_limits(limits: BatchLimits, config: LlamaConfig) -> BatchLimits:
    """``limits`` with ``max_seq_len`` (and ``max_input_len``) no larger than the model's positions."""
    positions = config.max_position_embeddings
    if limits.max_seq_len <= positions:
        return limits
    logger.warning(
        "max_seq_len %d exceeds the model's max_position_embeddings %d: serving with %d",
        limits.max_seq_len,
        positions,
        positions,
    )
    return replace(limits, max_seq_len=positions, max_input_len=min(limits.max_input_len, positions - 1))


def build_block_pool(settings: KvCacheSettings | None, limits: BatchLimits) -> BlockPool:
    """The KV-cache pool (``settings`` None: ``max_batch_size x max_seq_len`` tokens, reuse on, no events)."""
    if settings is None:
        tokens = limits.max_batch_size * limits.max_seq_len
        settings = KvCacheSettings(max_blocks=-(-tokens // DEFAULT_TOKENS_PER_BLOCK))
    events = None
    if settings.event_buffer_max_size > 0:
        events = KvEventBuffer(settings.event_buffer_max_size, window_size=limits.max_seq_len)
    return BlockPool(settings, events)


def build_speculator(settings: SpeculationSettings | None) -> Speculator | None:
    """The drafter and counters of ``settings`` (None: no speculation)."""
    return None if settings is None else Speculator(settings)


def build_batcher(settings: EngineSettings, handle_type: type[H] | None = None) -> InflightBatcher[H]:
    """Load the weights from ``settings.model_dir`` and assemble the batcher (``handle_type`` types it)."""
    weights = LlamaWeights.load(settings.model_dir)
    model = TinyLlama(weights)
    limits = fit_limits(settings.limits, weights.config)
    pool = build_block_pool(settings.kv_cache, limits)
    return InflightBatcher(model, limits, build_adapter_store(settings, weights.config), pool,
                           build_speculator(settings.speculation))
