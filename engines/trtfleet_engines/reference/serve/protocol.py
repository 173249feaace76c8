"""trtllm-serve's OpenAI request bodies and response shapes, as the reference ``pytorch`` mode speaks them.

Request models forbid unknown fields, as ``tensorrt_llm/serve/openai_protocol.py`` does; the server turns any
validation failure into **400** ``{"error": "<pydantic error list as text>"}`` (``openai_server.py``'s
``RequestValidationError`` handler), and every other refusal into ``ErrorResponse``
``{object: "error", message, type: "BadRequestError", param: null, code: 400}``.

``lora_request`` is ``{lora_name, lora_int_id, lora_path[, lora_ckpt_source]}``; a ``lora_path`` that does not
exist fails validation with upstream's ``LoRARequest`` text, ``lora_path (<path>) does not exist.`` (an omitted
path is the empty string, which fails the same way). Fields the reference model cannot honour (``n`` > 1,
``logprobs``, penalties) are accepted by the schema and refused with an ``ErrorResponse``.

Pure: no I/O apart from the ``os.path.exists`` check upstream makes in the same place.
"""

from __future__ import annotations

import os
import time
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

BAD_REQUEST = "BadRequestError"


class StrictModel(BaseModel):
    model_config = ConfigDict(extra="forbid")


class LoraRequestBody(StrictModel):
    lora_name: str
    lora_int_id: int
    lora_path: str = ""
    lora_ckpt_source: Literal["hf", "nemo"] = "hf"

    @model_validator(mode="after")
    def _path_exists(self) -> LoraRequestBody:
        if not os.path.exists(self.lora_path):
            raise ValueError(f"lora_path ({self.lora_path}) does not exist.")
        return self


class StreamOptions(StrictModel):
    include_usage: bool | None = True
    continuous_usage_stats: bool | None = False


class SamplingFields(StrictModel):
    model: str
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    seed: int | None = None
    stop: str | list[str] | None = None
    n: int = 1
    ignore_eos: bool = False
    stream: bool | None = False
    stream_options: StreamOptions | None = None
    lora_request: LoraRequestBody | None = None
    priority: float | None = Field(default=None, ge=0, le=1)
    user: str | None = None
    frequency_penalty: float | None = 0.0
    presence_penalty: float | None = 0.0

    @model_validator(mode="after")
    def _stream_options_need_stream(self) -> SamplingFields:
        if self.stream_options is not None and not self.stream:
            raise ValueError("Stream options can only be defined when `stream=True`.")
        return self

    def stop_strings(self) -> tuple[str, ...]:
        if self.stop is None:
            return ()
        return (self.stop,) if isinstance(self.stop, str) else tuple(self.stop)

    def unsupported(self) -> str | None:
        """Why the reference engine cannot honour this request, or None."""
        if self.n != 1:
            return "the reference engine generates one choice per request (n must be 1)"
        if self.frequency_penalty or self.presence_penalty:
            return "the reference engine does not apply frequency or presence penalties"
        return None


class CompletionRequest(SamplingFields):
    prompt: str | list[str]
    max_tokens: int | None = Field(default=None, ge=1)
    logprobs: int | None = None
    echo: bool = False
    return_context_logits: bool = False
    detokenize: bool = True

    def prompt_text(self) -> str | None:
        if isinstance(self.prompt, str):
            return self.prompt
        return self.prompt[0] if len(self.prompt) == 1 else None


class ChatMessage(StrictModel):
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[dict[str, Any]] | None = None
    name: str | None = None

    def text(self) -> str:
        if self.content is None:
            return ""
        if isinstance(self.content, str):
            return self.content
        return "".join(str(part.get("text", "")) for part in self.content if part.get("type") == "text")


class ChatCompletionRequest(SamplingFields):
    messages: list[ChatMessage] = Field(min_length=1)
    max_tokens: int | None = Field(default=None, ge=1)
    max_completion_tokens: int | None = Field(default=None, ge=1)
    logprobs: bool = False
    top_logprobs: int | None = None
    cache_salt: str | None = Field(default=None, min_length=1)

    @model_validator(mode="after")
    def _one_length_limit(self) -> ChatCompletionRequest:
        if self.max_tokens is not None and self.max_completion_tokens is not None:
            raise ValueError("max_tokens and max_completion_tokens are mutually exclusive")
        return self

    def output_limit(self) -> int | None:
        return self.max_completion_tokens if self.max_completion_tokens is not None else self.max_tokens

    def prompt_text(self) -> str:
        """The tiny model's prompt is the last user message (the ``reference`` chat template)."""
        users = [message.text() for message in self.messages if message.role == "user"]
        return users[-1] if users else ""


def error_response(message: str, *, status: int = 400, err_type: str = BAD_REQUEST) -> dict[str, Any]:
    """upstream's ``ErrorResponse`` body."""
    return {"object": "error", "message": message, "type": err_type, "param": None, "code": status}


def usage(prompt_tokens: int, completion_tokens: int, cached_tokens: int = 0) -> dict[str, Any]:
    return {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
        "prompt_tokens_details": {"cached_tokens": cached_tokens},
    }


def now_s() -> int:
    return int(time.time())


def completion_body(*, request_id: str, model: str, text: str, finish_reason: str, prompt_tokens: int,
                    completion_tokens: int, cached_tokens: int = 0) -> dict[str, Any]:
    choice = {"index": 0, "text": text, "token_ids": None, "logprobs": None, "finish_reason": finish_reason,
              "stop_reason": None}
    return {"id": request_id, "object": "text_completion", "created": now_s(), "model": model,
            "choices": [choice], "usage": usage(prompt_tokens, completion_tokens, cached_tokens)}


def completion_chunk(*, request_id: str, model: str, text: str, finish_reason: str | None) -> dict[str, Any]:
    """A streamed completions chunk: every field present, nulls included."""
    choice = {"index": 0, "text": text, "token_ids": None, "logprobs": None, "finish_reason": finish_reason,
              "stop_reason": None}
    return {"id": request_id, "object": "text_completion", "created": now_s(), "model": model,
            "choices": [choice], "usage": None}


def chat_body(*, request_id: str, model: str, text: str, finish_reason: str, prompt_tokens: int,
              completion_tokens: int, cached_tokens: int = 0) -> dict[str, Any]:
    choice = {"index": 0, "message": {"role": "assistant", "content": text}, "logprobs": None,
              "finish_reason": finish_reason, "stop_reason": None}
    return {"id": request_id, "object": "chat.completion", "created": now_s(), "model": model,
            "choices": [choice], "usage": usage(prompt_tokens, completion_tokens, cached_tokens)}


def chat_chunk(*, request_id: str, model: str, delta: dict[str, str], finish_reason: str | None) -> dict[str, Any]:
    """A streamed chat chunk: null fields omitted."""
    choice: dict[str, Any] = {"index": 0, "delta": delta}
    if finish_reason is not None:
        choice["finish_reason"] = finish_reason
    return {"id": request_id, "object": "chat.completion.chunk", "created": now_s(), "model": model,
            "choices": [choice]}


def usage_chunk(*, request_id: str, model: str, chat: bool, prompt_tokens: int,
                completion_tokens: int, cached_tokens: int = 0) -> dict[str, Any]:
    kind = "chat.completion.chunk" if chat else "text_completion"
    return {"id": request_id, "object": kind, "created": now_s(), "model": model, "choices": [],
            "usage": usage(prompt_tokens, completion_tokens, cached_tokens)}
