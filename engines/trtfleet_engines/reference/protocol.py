"""TRT-LLM's ``tensorrt_llm`` tensors <-> the batcher's requests and responses (pure, numpy only).

Inputs arrive with Triton's batch dimension (``input_ids`` [1, L], scalars [1, 1], ``lora_weights``
[1, N, W], ``lora_config`` [1, N, 3]); one Triton request is one sequence here (batch 1, beam 1).
Outputs mirror the C++ backend: ``output_ids`` INT32 [1, beam, tokens] and ``sequence_length`` INT32
[1, beam] (the number of tokens in that response); any other output the caller asks for (an ensemble asks
for all of them) gets a well-formed placeholder, as the backend's optional outputs do when not computed.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

import numpy as np
from numpy.typing import NDArray

from trtfleet_engines.reference.errors import EnqueueRejected
from trtfleet_engines.reference.sampling import DEFAULT_SEED, SamplingParams
from trtfleet_engines.reference.scheduler import GenerationRequest, LoraInputs

TensorGetter = Callable[[str], NDArray[Any] | None]
"""Returns an input tensor by name as numpy, or None when the request does not carry it."""


def _scalar(get: TensorGetter, name: str) -> Any | None:
    value = get(name)
    if value is None or value.size == 0:
        return None
    return value.reshape(-1)[0].item()


def is_stop_request(get: TensorGetter) -> bool:
    """A request with ``stop`` = true cancels the requests that share its Triton request id."""
    return bool(_scalar(get, "stop"))


def parse_stop_words(value: NDArray[Any] | None) -> tuple[tuple[int, ...], ...]:
    """TRT-LLM's ``stop_words_list`` [1, 2, L]: row 0 the ids, row 1 the end offsets (-1 padded)."""
    if value is None or value.size == 0:
        return ()
    table = value.reshape(-1, 2, value.shape[-1])[0]
    ids, offsets = table[0].tolist(), [o for o in table[1].tolist() if o >= 0]
    words, start = [], 0
    for end in offsets:
        if end > start:
            words.append(tuple(int(i) for i in ids[start:end]))
        start = end
    return tuple(words)


def parse_request(get: TensorGetter, *, user_id: str, exclude_input_default: bool) -> GenerationRequest:
    """Decode one ``tensorrt_llm`` request. Raises EnqueueRejected for what the backend refuses up front."""
    input_ids = get("input_ids")
    if input_ids is None:
        raise EnqueueRejected("input_ids is required")
    if input_ids.ndim >= 2 and input_ids.shape[0] != 1:
        raise EnqueueRejected("the reference engine serves one sequence per request (batch size 1)")
    tokens = input_ids.reshape(-1)
    length = _scalar(get, "input_lengths")
    if length is not None:
        tokens = tokens[: int(length)]
    output_len = _scalar(get, "request_output_len")
    if output_len is None:
        raise EnqueueRejected("request_output_len is required")
    beam_width = _scalar(get, "beam_width")
    if beam_width is not None and int(beam_width) > 1:
        raise EnqueueRejected("beam search is not supported by the reference engine (max_beam_width 1)")
    exclude = _scalar(get, "exclude_input_in_output")
    temperature, top_k, top_p, seed = (
        _scalar(get, n) for n in ("temperature", "runtime_top_k", "runtime_top_p", "seed")
    )
    sampling = SamplingParams(
        temperature=1.0 if temperature is None else float(temperature),
        top_k=0 if top_k is None else int(top_k),
        top_p=0.0 if top_p is None else float(top_p),
        seed=DEFAULT_SEED if seed is None else int(seed),
    )
    task_id = _scalar(get, "lora_task_id")
    weights, config = get("lora_weights"), get("lora_config")
    lora = None
    if task_id is not None or weights is not None or config is not None:
        lora = LoraInputs(None if task_id is None else int(task_id), weights, config)
    end_id, pad_id = _scalar(get, "end_id"), _scalar(get, "pad_id")
    return GenerationRequest(
        prompt=tuple(int(t) for t in tokens),
        max_new_tokens=int(output_len),
        end_id=None if end_id is None else int(end_id),
        pad_id=None if pad_id is None else int(pad_id),
        streaming=bool(_scalar(get, "streaming")),
        exclude_input_in_output=exclude_input_default if exclude is None else bool(exclude),
        sampling=sampling,
        stop_words=parse_stop_words(get("stop_words_list")),
        lora=lora,
        user_id=user_id,
    )


_PLACEHOLDERS: dict[str, tuple[type, tuple[int, ...]]] = {
    "cum_log_probs": (np.float32, (1, 1)),
    "context_logits": (np.float32, (1, 1, 1)),
    "generation_logits": (np.float32, (1, 1, 1, 1)),
    "batch_index": (np.int32, (1, 1)),
    "sequence_index": (np.int32, (1, 1)),
    "context_phase_params": (np.uint8, (1, 1)),
    "kv_cache_alloc_new_blocks": (np.int32, (1, 1)),
    "kv_cache_reused_blocks": (np.int32, (1, 1)),
    "kv_cache_alloc_total_blocks": (np.int32, (1, 1)),
    "arrival_time_ns": (np.int64, (1, 1)),
    "first_scheduled_time_ns": (np.int64, (1, 1)),
    "first_token_time_ns": (np.int64, (1, 1)),
    "last_token_time_ns": (np.int64, (1, 1)),
    "acceptance_rate": (np.float32, (1, 1)),
    "total_accepted_draft_tokens": (np.int32, (1, 1)),
    "total_draft_tokens": (np.int32, (1, 1)),
}


SPECULATION_OUTPUTS = ("acceptance_rate", "total_accepted_draft_tokens", "total_draft_tokens")
"""Per-request speculative-decoding outputs of TRT-LLM's ``tensorrt_llm`` model (tensorrtllm_backend
``docs/model_config.md``@0b9d7d5): filled from the request's drafts when it speculated."""


def output_tensors(
    output_ids: tuple[int, ...], requested: Iterable[str], *, num_input_tokens: int = 0, draft_tokens: int = 0,
    accepted_draft_tokens: int = 0,
) -> dict[str, NDArray[Any]]:
    """The tensors of one response: ``output_ids`` [1, 1, n], ``sequence_length`` [1, 1], the request's
    speculation counts (on its final response) and placeholders."""
    ids = np.asarray(output_ids, dtype=np.int32).reshape(1, 1, len(output_ids))
    tensors: dict[str, NDArray[Any]] = {
        "output_ids": ids,
        "sequence_length": np.array([[len(output_ids)]], dtype=np.int32),
    }
    for name in requested:
        if name in tensors:
            continue
        if name == "output_log_probs":
            tensors[name] = np.zeros((1, 1, max(1, len(output_ids))), dtype=np.float32)
        elif name == "num_input_tokens":
            tensors[name] = np.array([[num_input_tokens]], dtype=np.int32)
        elif name == "num_output_tokens":
            tensors[name] = np.array([[len(output_ids)]], dtype=np.int32)
        elif name == "acceptance_rate":
            rate = accepted_draft_tokens / draft_tokens if draft_tokens else 0.0
            tensors[name] = np.array([[rate]], dtype=np.float32)
        elif name == "total_accepted_draft_tokens":
            tensors[name] = np.array([[accepted_draft_tokens]], dtype=np.int32)
        elif name == "total_draft_tokens":
            tensors[name] = np.array([[draft_tokens]], dtype=np.int32)
        elif name in _PLACEHOLDERS:
            dtype, shape = _PLACEHOLDERS[name]
            tensors[name] = np.zeros(shape, dtype=dtype)
    return tensors
