"""The values the in-flight batcher takes and gives: requests, responses, limits and its stats snapshot.

Kept apart from :mod:`~trtfleet_engines.reference.scheduler` (which re-exports them) so the batcher module
holds only the executor's logic.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

from numpy.typing import NDArray

from trtfleet_engines.reference.kv_blocks import DEFAULT_TOKENS_PER_BLOCK
from trtfleet_engines.reference.sampling import SamplingParams

H = TypeVar("H")

KV_TOKENS_PER_BLOCK = DEFAULT_TOKENS_PER_BLOCK
"""TRT-LLM's default ``tokens_per_block``."""
DEFAULT_REQUEST_PRIORITY = 0.5
"""TRT-LLM's ``DEFAULT_REQUEST_PRIORITY`` (``executor/request.py``): a request that names none."""


@dataclass(frozen=True, eq=False)
class LoraInputs:
    """``lora_task_id``, ``lora_weights`` [1, N, W], ``lora_config`` [1, N, 3] as received (each optional)."""

    task_id: int | None
    weights: NDArray[Any] | None = None
    config: NDArray[Any] | None = None


@dataclass(frozen=True)
class GenerationRequest:
    """One request to the ``tensorrt_llm`` model, already decoded from its tensors."""

    prompt: tuple[int, ...]
    max_new_tokens: int
    end_id: int | None = None
    pad_id: int | None = None
    streaming: bool = False
    exclude_input_in_output: bool = False
    sampling: SamplingParams = field(default_factory=SamplingParams)
    stop_words: tuple[tuple[int, ...], ...] = ()
    lora: LoraInputs | None = None
    user_id: str = ""
    """Triton's request id (what a ``stop`` request names)."""
    arrives_at_s: float = -math.inf
    """When the request has fully arrived on the engine's clock (its LoRA weights over the pod's link): the
    executor does not fetch it before (``EngineLoop`` sets it when a pretend network bandwidth is given)."""
    priority: float = DEFAULT_REQUEST_PRIORITY
    """trtllm-serve's request priority in [0, 1]: orders the waiting queue under ``waiting_queue_policy: priority``."""


@dataclass(frozen=True)
class EngineResponse(Generic[H]):
    """One response to send: tokens, or an error; ``final`` closes the request's stream."""

    handle: H
    request_id: int
    output_ids: tuple[int, ...]
    final: bool
    error: str | None = None
    cached_tokens: int = 0
    """On the final response: prompt tokens whose K/V came from reused blocks (``cached_tokens`` in usage)."""
    draft_tokens: int = 0
    """On the final response: draft tokens the request verified (speculative decoding)."""
    accepted_draft_tokens: int = 0
    """On the final response: those the model accepted."""


@dataclass(frozen=True)
class BatchLimits:
    max_batch_size: int
    max_num_tokens: int
    max_input_len: int
    max_seq_len: int
    max_queue_size: int = 0
    """Waiting requests beyond which ``submit`` refuses (0: no limit)."""


@dataclass(frozen=True)
class BatcherStats:
    """A snapshot for the ``nv_trt_llm_*`` metrics."""

    active_requests: int
    max_active_requests: int
    scheduled_requests: int
    context_requests: int
    generation_requests: int
    waiting_requests: int
    paused_requests: int
    context_tokens: int
    iterations: int
    kv_max_blocks: int
    kv_used_blocks: int
    kv_tokens_per_block: int = KV_TOKENS_PER_BLOCK
    kv_reused_blocks: int = 0
    """Cumulative, like ``KvCacheStats.reusedBlocks`` (one per matched block per request)."""
    kv_missed_blocks: int = 0
    kv_alloc_total_blocks: int = 0
    kv_alloc_new_blocks: int = 0
    kv_cache_hit_rate: float = 0.0
    prefill_tokens_computed: int = 0
    """Cumulative prompt positions the model computed (reused positions are not)."""
    prompt_tokens: int = 0
    """Cumulative prompt positions of the requests that started prefill."""
    request_steps: int = 0
    """Cumulative steps that gave a finished request tokens (its prefill included)."""
    output_tokens: int = 0
    """Cumulative tokens generated."""
    avg_decoded_tokens_per_iter: float = 0.0
    """The last iteration's tokens per generation request (``avgNumDecodedTokensPerIter``)."""
    speculative: bool = False
    spec_draft_tokens: int = 0
    """Cumulative draft tokens verified (``trtllm_spec_decode_num_draft_tokens_total``)."""
    spec_accepted_tokens: int = 0
    """Cumulative draft tokens accepted (``trtllm_spec_decode_num_accepted_tokens_total``)."""
    spec_steps_with_drafts: int = 0
    """Cumulative (request, step) pairs that verified a draft."""
    spec_iter_draft_tokens: int = 0
    spec_iter_accepted_tokens: int = 0
    spec_iter_requests_with_drafts: int = 0
    spec_by_adapter: tuple[tuple[int, int, int], ...] = ()
    """Cumulative (LoRA task id, 0 for the base model; drafted; accepted)."""

    @property
    def spec_acceptance_length(self) -> float:
        """The last iteration's tokens per step of a request that drafted (upstream's ``acceptanceLength``)."""
        if not self.spec_iter_requests_with_drafts:
            return 1.0
        return 1.0 + self.spec_iter_accepted_tokens / self.spec_iter_requests_with_drafts


