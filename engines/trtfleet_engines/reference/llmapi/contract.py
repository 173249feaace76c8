"""The tensor contract of TRT-LLM's Triton ``llmapi`` model, and its ``config.pbtxt`` for the reference (pure).

Upstream (``triton_backend/all_models/llmapi/tensorrt_llm``, files and commits in docs/design/pytorch-backend.md):
one prompt per request (``max_batch_size`` 0), ``text_input`` required, everything else optional;
``sampling_param_*`` become ``SamplingParams`` fields (``max_tokens`` defaults to 32 there,
``exclude_input_from_output`` to **false** in the model, so ``text_output`` starts with the prompt unless a
client sends true); ``return_finish_reason`` / ``return_stop_reason`` add those outputs; ``stop`` true with a
request id cancels that id's requests; ``lora_id`` + ``lora_name`` + ``lora_path`` (all three or none, plus an
optional ``lora_ckpt_source`` ``hf`` or ``nemo``) select an adapter the server reads from ``lora_path``.
Every streamed response carries the **whole** text so far (``CompletionOutput.text``), not a delta.
``max_batch_size`` and the decoupled policy come from ``model.yaml``'s ``triton_config``.

Errors: :class:`LlmapiRequestError` with upstream's texts (the model prefixes "Error generating request: ");
:class:`~trtfleet_engines.reference.errors.RepositoryError` for a ``triton_config`` the model cannot serve.
"""

from __future__ import annotations

import shlex
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final

import numpy as np

from trtfleet_engines.reference.errors import RepositoryError
from trtfleet_engines.triton import pbtxt

MODEL_NAME: Final = "tensorrt_llm"
DEFAULT_MAX_TOKENS: Final = 32
"""``SamplingParams.max_tokens``'s default (``tensorrt_llm/sampling_params.py``)."""
ERROR_PREFIX: Final = "Error generating request: "
LORA_SOURCES: Final = ("hf", "nemo")
SERVE_ARGS_PARAMETER: Final = "reference_serve_args"

INPUTS: Final = (
    pbtxt.Tensor("text_input", "TYPE_STRING", (-1,)),
    pbtxt.Tensor("streaming", "TYPE_BOOL", (1,), optional=True),
    pbtxt.Tensor("sampling_param_best_of", "TYPE_INT32", (1,), optional=True),
    pbtxt.Tensor("sampling_param_temperature", "TYPE_FP32", (1,), optional=True),
    pbtxt.Tensor("sampling_param_top_k", "TYPE_INT32", (1,), optional=True),
    pbtxt.Tensor("sampling_param_top_p", "TYPE_FP32", (1,), optional=True),
    pbtxt.Tensor("sampling_param_frequency_penalty", "TYPE_FP32", (1,), optional=True),
    pbtxt.Tensor("sampling_param_presence_penalty", "TYPE_FP32", (1,), optional=True),
    pbtxt.Tensor("sampling_param_max_tokens", "TYPE_INT32", (1,), optional=True),
    pbtxt.Tensor("sampling_param_stop", "TYPE_STRING", (-1,), optional=True),
    pbtxt.Tensor("sampling_param_seed", "TYPE_UINT64", (1,), optional=True),
    pbtxt.Tensor("sampling_param_exclude_input_from_output", "TYPE_BOOL", (1,), optional=True),
    pbtxt.Tensor("sampling_param_return_perf_metrics", "TYPE_BOOL", (1,), optional=True),
    pbtxt.Tensor("return_finish_reason", "TYPE_BOOL", (1,), optional=True),
    pbtxt.Tensor("return_stop_reason", "TYPE_BOOL", (1,), optional=True),
    pbtxt.Tensor("return_cumulative_logprob", "TYPE_BOOL", (1,), optional=True),
    pbtxt.Tensor("stop", "TYPE_BOOL", (1,), optional=True),
    pbtxt.Tensor("lora_id", "TYPE_UINT64", (1,), optional=True),
    pbtxt.Tensor("lora_name", "TYPE_STRING", (1,), optional=True),
    pbtxt.Tensor("lora_path", "TYPE_STRING", (1,), optional=True),
    pbtxt.Tensor("lora_ckpt_source", "TYPE_STRING", (1,), optional=True),
)
OUTPUTS: Final = (
    pbtxt.Tensor("text_output", "TYPE_STRING", (-1,)),
    pbtxt.Tensor("finish_reason", "TYPE_STRING", (-1,)),
    pbtxt.Tensor("stop_reason", "TYPE_STRING", (-1,)),
    pbtxt.Tensor("cumulative_logprob", "TYPE_FP32", (-1,)),
    pbtxt.Tensor("kv_cache_reused_block", "TYPE_INT32", (-1,)),
    pbtxt.Tensor("kv_cache_missed_block", "TYPE_INT32", (-1,)),
    pbtxt.Tensor("kv_cache_hit_rate", "TYPE_FP32", (-1,)),
)
"""The outputs the reference fills (text, reasons); upstream also declares timing and speculative outputs."""


class LlmapiRequestError(Exception):
    """A request the model refuses; ``text`` is upstream's message (without :data:`ERROR_PREFIX`)."""

    def __init__(self, text: str) -> None:
        super().__init__(text)
        self.text = text


def render_config(triton_config: Mapping[str, Any], *, serve_args: Sequence[str] = ()) -> str:
    """``config.pbtxt`` of the reference llmapi model. ``triton_config`` (from ``model.yaml``) sets what upstream
    sets in ``auto_complete_config``: ``max_batch_size`` (only 0, one prompt per request) and ``decoupled``.
    ``serve_args``: reference-only flags of the ``pytorch`` mode (tier sizes, step time), as a parameter."""
    if int(triton_config.get("max_batch_size", 0)) != 0:
        raise RepositoryError("triton_config.max_batch_size must be 0: the llmapi model takes one prompt a request")
    decoupled = bool(triton_config.get("decoupled", False))
    lines = [
        f"name: {pbtxt.quote(MODEL_NAME)}",
        'backend: "python"',
        "max_batch_size: 0",
        f"model_transaction_policy {{ decoupled: {str(decoupled).lower()} }}",
        *pbtxt.instance_group_cpu(1),
        *pbtxt.tensor_list("input", INPUTS, is_input=True),
        *pbtxt.tensor_list("output", OUTPUTS, is_input=False),
        *pbtxt.parameters([(SERVE_ARGS_PARAMETER, shlex.join(serve_args))]),
    ]
    return "\n".join(lines) + "\n"


@dataclass(frozen=True)
class LoraSelection:
    lora_id: int
    name: str
    path: str
    source: str = "hf"


@dataclass(frozen=True)
class LlmapiRequest:
    prompt: str
    streaming: bool = False
    max_tokens: int = DEFAULT_MAX_TOKENS
    temperature: float | None = None
    top_k: int | None = None
    top_p: float | None = None
    seed: int | None = None
    stop: tuple[str, ...] = ()
    best_of: int = 1
    frequency_penalty: float | None = None
    presence_penalty: float | None = None
    exclude_input_from_output: bool = False
    return_finish_reason: bool = False
    return_stop_reason: bool = False
    lora: LoraSelection | None = None


Getter = Callable[[str], Any]
"""Name -> the input as a numpy array, or None when absent."""


def _text(value: Any) -> str:
    return value.decode("utf-8") if isinstance(value, bytes) else str(value)


def _scalar(get: Getter, name: str) -> Any:
    array = get(name)
    if array is None:
        return None
    if array.size != 1:
        raise LlmapiRequestError(f"Expected a scalar tensor for tensor {name}")
    value = array.reshape(-1)[0]
    return value.item() if isinstance(value, np.generic) else value  # STRING tensors hold bytes objects


def is_stop_request(get: Getter) -> bool:
    return bool(_scalar(get, "stop"))


def _lora(get: Getter, path_exists: Callable[[str], bool]) -> LoraSelection | None:
    lora_id, name, path = (_scalar(get, key) for key in ("lora_id", "lora_name", "lora_path"))
    if lora_id is None and name is None and path is None:
        return None
    if lora_id is None or name is None or path is None:
        raise LlmapiRequestError("lora_id, lora_name, and lora_path must all be provided together")
    source = _scalar(get, "lora_ckpt_source")
    source = "hf" if source is None else _text(source)
    if source not in LORA_SOURCES:
        raise LlmapiRequestError(f"lora_ckpt_source must be one of {LORA_SOURCES}, got {source!r}")
    if not path_exists(_text(path)):
        raise LlmapiRequestError(f"lora_path does not exist on the Triton server's filesystem: {_text(path)}")
    return LoraSelection(int(lora_id), _text(name), _text(path), source)


def parse_request(get: Getter, *, path_exists: Callable[[str], bool]) -> LlmapiRequest:
    """The request's fields, checked as upstream checks them (``path_exists``: ``os.path.exists`` in the shell)."""
    text = get("text_input")
    if text is None:
        raise LlmapiRequestError("text_input is missing from the request")
    if text.ndim > 1:
        raise LlmapiRequestError("The current implementation only supports text_input being a 1D tensor.")
    stop = get("sampling_param_stop")

    def number(name: str, kind: type[int] | type[float]) -> Any:
        value = _scalar(get, f"sampling_param_{name}")
        return None if value is None else kind(value)

    max_tokens = number("max_tokens", int)
    return LlmapiRequest(
        prompt=_text(text.reshape(-1)[0]),
        streaming=bool(_scalar(get, "streaming") or False),
        max_tokens=DEFAULT_MAX_TOKENS if max_tokens is None else max_tokens,
        temperature=number("temperature", float),
        top_k=number("top_k", int),
        top_p=number("top_p", float),
        seed=number("seed", int),
        stop=() if stop is None else tuple(_text(s) for s in stop.reshape(-1)),
        best_of=number("best_of", int) or 1,
        frequency_penalty=number("frequency_penalty", float),
        presence_penalty=number("presence_penalty", float),
        exclude_input_from_output=bool(_scalar(get, "sampling_param_exclude_input_from_output") or False),
        return_finish_reason=bool(_scalar(get, "return_finish_reason") or False),
        return_stop_reason=bool(_scalar(get, "return_stop_reason") or False),
        lora=_lora(get, path_exists),
    )


def output_text(request: LlmapiRequest, generated: str) -> str:
    """``text_output``: the text so far, after the prompt unless ``exclude_input_from_output``."""
    return generated if request.exclude_input_from_output else request.prompt + generated
