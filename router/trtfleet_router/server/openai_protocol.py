"""OpenAI request parsing and response/chunk building (pure).

Supported: ``/v1/completions`` (``prompt`` a string or a list of one string) and
``/v1/chat/completions`` with ``max_tokens`` (or ``max_completion_tokens``), ``temperature``, ``top_p``,
``seed``, ``stop`` (string or list of up to 4), ``presence_penalty``, ``frequency_penalty``,
``stream`` and ``stream_options.include_usage``, and trtllm-serve's ``priority`` (a number in [0, 1]: the request's
own band, see ``routing/tenancy.py``). ``temperature: 0`` means greedy (sent as ``top_k=1``).
Refused with 400: ``n``/``best_of`` above 1, ``logprobs``/``top_logprobs``, ``echo``, ``suffix``, token-id
prompts, tools/functions, ``response_format`` other than text. Unknown fields are ignored, as the
OpenAI API does for fields it does not know.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final

from trtfleet_router.chat import ChatMessage, parse_messages
from trtfleet_router.errors import MalformedRequest, UnsupportedParameter
from trtfleet_router.upstream.protocol import SamplingParams
from trtfleet_router.upstream.text import Usage

MAX_STOP_SEQUENCES: Final = 4
SEED_MAX: Final = 2**64 - 1
OWNED_BY: Final = "trtfleet"


@dataclass(frozen=True, slots=True)
class OpenAIRequest:
    model: str
    prompt: str | None
    messages: list[ChatMessage] | None
    max_tokens: int | None
    temperature: float | None
    top_p: float | None
    seed: int | None
    stop: tuple[str, ...]
    presence_penalty: float | None
    frequency_penalty: float | None
    stream: bool
    include_usage: bool
    priority: float | None = None

    def sampling(self, max_tokens: int) -> SamplingParams:
        greedy = self.temperature == 0
        return SamplingParams(
            max_tokens=max_tokens,
            temperature=None if greedy else self.temperature,
            top_p=self.top_p,
            top_k=1 if greedy else None,
            seed=self.seed,
            stop=self.stop,
            presence_penalty=self.presence_penalty,
            frequency_penalty=self.frequency_penalty,
        )


def _object(body: Any) -> Mapping[str, Any]:
    if not isinstance(body, dict):
        raise MalformedRequest("the request body must be a JSON object")
    return body


def _number(body: Mapping[str, Any], key: str, low: float, high: float) -> float | None:
    value = body.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float) or not low <= value <= high:
        raise MalformedRequest(f"'{key}' must be a number from {low} to {high}", param=key)
    return float(value)


def _integer(body: Mapping[str, Any], key: str, low: int, high: int) -> int | None:
    value = body.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise MalformedRequest(f"'{key}' must be an integer from {low} to {high}", param=key)
    return value


def _bool(body: Mapping[str, Any], key: str) -> bool:
    value = body.get(key, False)
    if value is None:
        return False
    if not isinstance(value, bool):
        raise MalformedRequest(f"'{key}' must be a boolean", param=key)
    return value


def _stop(body: Mapping[str, Any]) -> tuple[str, ...]:
    stop = body.get("stop")
    if stop is None:
        return ()
    if isinstance(stop, str):
        return (stop,) if stop else ()
    if isinstance(stop, list) and all(isinstance(s, str) for s in stop) and len(stop) <= MAX_STOP_SEQUENCES:
        return tuple(s for s in stop if s)
    raise MalformedRequest(f"'stop' must be a string or a list of up to {MAX_STOP_SEQUENCES} strings", param="stop")


def _refuse(body: Mapping[str, Any]) -> None:
    n = body.get("n")
    if n is not None and n != 1:
        raise UnsupportedParameter("only n=1 is supported", param="n")
    best_of = body.get("best_of")
    if best_of is not None and best_of != 1:
        raise UnsupportedParameter("only best_of=1 is supported", param="best_of")
    if body.get("logprobs") not in (None, False) or body.get("top_logprobs") is not None:
        raise UnsupportedParameter("logprobs are not supported by this server", param="logprobs")
    if body.get("echo"):
        raise UnsupportedParameter("echo is not supported", param="echo")
    if body.get("suffix"):
        raise UnsupportedParameter("suffix is not supported", param="suffix")
    for key in ("tools", "functions"):
        if body.get(key):
            raise UnsupportedParameter(f"'{key}' (tool calling) is not supported", param=key)
    response_format = body.get("response_format")
    if response_format is not None and (not isinstance(response_format, dict) or response_format.get("type") != "text"):
        raise UnsupportedParameter("only response_format type 'text' is supported", param="response_format")


def _common(body: Mapping[str, Any], prompt: str | None, messages: list[ChatMessage] | None) -> OpenAIRequest:
    model = body.get("model")
    if not isinstance(model, str) or not model:
        raise MalformedRequest("'model' must be a non-empty string", param="model")
    _refuse(body)
    max_tokens = _integer(body, "max_completion_tokens", 1, 2**31 - 1)
    if max_tokens is None:
        max_tokens = _integer(body, "max_tokens", 1, 2**31 - 1)
    stream = _bool(body, "stream")
    options = body.get("stream_options")
    if options is not None and not isinstance(options, dict):
        raise MalformedRequest("'stream_options' must be an object", param="stream_options")
    include_usage = bool(options and options.get("include_usage"))
    return OpenAIRequest(
        model=model,
        prompt=prompt,
        messages=messages,
        max_tokens=max_tokens,
        temperature=_number(body, "temperature", 0.0, 2.0),
        top_p=_number(body, "top_p", 0.0, 1.0),
        seed=_integer(body, "seed", 0, SEED_MAX),  # the engine's seed is UINT64: a negative one is refused
        stop=_stop(body),
        presence_penalty=_number(body, "presence_penalty", -2.0, 2.0),
        frequency_penalty=_number(body, "frequency_penalty", -2.0, 2.0),
        stream=stream,
        include_usage=stream and include_usage,
        priority=_number(body, "priority", 0.0, 1.0),
    )


def parse_completion(raw: Any) -> OpenAIRequest:
    body = _object(raw)
    prompt = body.get("prompt")
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str):
        prompt = prompt[0]
    if isinstance(prompt, list):
        if prompt and all(isinstance(p, int) for p in prompt):
            raise UnsupportedParameter("token-id prompts are not supported; send text", param="prompt")
        raise UnsupportedParameter("only one prompt per request is supported", param="prompt")
    if not isinstance(prompt, str):
        raise MalformedRequest("'prompt' must be a string", param="prompt")
    return _common(body, prompt, None)


def parse_chat(raw: Any) -> OpenAIRequest:
    body = _object(raw)
    return _common(body, None, parse_messages(body.get("messages")))


# -- responses ------------------------------------------------------------------------------------------


def usage_json(usage: Usage) -> dict[str, int]:
    return {
        "prompt_tokens": usage.prompt_tokens,
        "completion_tokens": usage.completion_tokens,
        "total_tokens": usage.total_tokens,
    }


def completion_response(
    response_id: str, model: str, text: str, finish: str, usage: Usage, created: int | None = None
) -> dict[str, Any]:
    return {
        "id": response_id,
        "object": "text_completion",
        "created": created if created is not None else int(time.time()),
        "model": model,
        "choices": [{"index": 0, "text": text, "logprobs": None, "finish_reason": finish}],
        "usage": usage_json(usage),
    }


def chat_response(
    response_id: str, model: str, text: str, finish: str, usage: Usage, created: int | None = None
) -> dict[str, Any]:
    return {
        "id": response_id,
        "object": "chat.completion",
        "created": created if created is not None else int(time.time()),
        "model": model,
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": text},
                "logprobs": None,
                "finish_reason": finish,
            }
        ],
        "usage": usage_json(usage),
    }


@dataclass(frozen=True, slots=True)
class ChunkFactory:
    """Builds the chunks of one streamed answer (completions or chat)."""

    response_id: str
    model: str
    created: int
    chat: bool
    include_usage: bool

    def _envelope(self, choices: list[dict[str, Any]]) -> dict[str, Any]:
        chunk: dict[str, Any] = {
            "id": self.response_id,
            "object": "chat.completion.chunk" if self.chat else "text_completion",
            "created": self.created,
            "model": self.model,
            "choices": choices,
        }
        if self.include_usage:
            chunk["usage"] = None
        return chunk

    def role(self) -> dict[str, Any]:
        """Chat only: the first chunk announces the assistant role."""
        return self._envelope(
            [
                {
                    "index": 0,
                    "delta": {"role": "assistant", "content": ""},
                    "logprobs": None,
                    "finish_reason": None,
                }
            ]
        )

    def text(self, text: str) -> dict[str, Any]:
        if self.chat:
            choice = {"index": 0, "delta": {"content": text}, "logprobs": None, "finish_reason": None}
        else:
            choice = {"index": 0, "text": text, "logprobs": None, "finish_reason": None}
        return self._envelope([choice])

    def finish(self, reason: str) -> dict[str, Any]:
        if self.chat:
            choice = {"index": 0, "delta": {}, "logprobs": None, "finish_reason": reason}
        else:
            choice = {"index": 0, "text": "", "logprobs": None, "finish_reason": reason}
        return self._envelope([choice])

    def usage(self, usage: Usage) -> dict[str, Any]:
        chunk = self._envelope([])
        chunk["usage"] = usage_json(usage)
        return chunk


def model_card(name: str, created: int, parent: str | None) -> dict[str, Any]:
    card: dict[str, Any] = {"id": name, "object": "model", "created": created, "owned_by": OWNED_BY}
    card["parent"] = parent
    card["root"] = parent if parent is not None else name
    return card
