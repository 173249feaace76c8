"""What a request asks of a pod, held in one form; each transport derives the wire form it sends.

A :class:`Payload` is the request as the router understood it: a prompt for a Triton text-level model, a
client's Triton tensors, a prompt for TRT-LLM's llmapi model, or an OpenAI request for trtllm-serve. It
answers, for each wire the router speaks, what that wire carries (built on first use, then kept), or None
when the request cannot travel that way:

* :meth:`~Payload.infer_request`: Triton's ``ModelInferRequest`` (gRPC ``ModelStreamInfer``; the only form
  that can carry LoRA weights);
* :meth:`~Payload.generate_json`: Triton's HTTP generate extension (a warm request only, see
  :mod:`.http_transport`);
* :meth:`~Payload.openai_json`: trtllm-serve's OpenAI API (runtime ``pytorch``).

:mod:`.transport` picks the first transport whose wire the payload has.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from tritonclient.grpc import service_pb2

from trtfleet_router.chat import ChatMessage
from trtfleet_router.models_registry import Target
from trtfleet_router.upstream.llmapi_upstream import build_llmapi_request
from trtfleet_router.upstream.openai_upstream import build_openai_body
from trtfleet_router.upstream.protocol import (
    AnswerReader,
    SamplingParams,
    UpstreamModelInfo,
    build_generate_body,
    build_text_request,
)


@dataclass(frozen=True, slots=True)
class GenerateJson:
    """A request for Triton's generate extension: the JSON body, ``generate_stream`` (SSE) or not, and how
    an answer becomes a response message (None: ``text_output`` only)."""

    body: Mapping[str, Any]
    stream: bool
    reader: AnswerReader | None = None


@dataclass(frozen=True, slots=True)
class OpenAIJson:
    """A request for trtllm-serve: ``/v1/completions`` or ``/v1/chat/completions``, its body, streamed or not."""

    path: str
    body: Mapping[str, Any]
    stream: bool


class Payload(Protocol):
    @property
    def model(self) -> str:
        """The model the pod serves this request with (its Triton model or trtllm-serve's model name)."""
        ...

    def infer_request(self) -> service_pb2.ModelInferRequest | None: ...

    def generate_json(self) -> GenerateJson | None: ...

    def openai_json(self) -> OpenAIJson | None: ...


class TritonTextPayload:
    """A prompt for a Triton text-level model (``tensorrt_llm_bls`` or ``ensemble``): generate JSON for warm
    attempts over HTTP, the gRPC request built only when an attempt needs it (weights, or no HTTP port)."""

    __slots__ = ("_build", "_generate", "_request", "model")

    def __init__(
        self,
        info: UpstreamModelInfo,
        prompt: str,
        params: SamplingParams,
        *,
        stream: bool,
        task_id: int | None,
        request_id: str,
    ) -> None:
        self.model = info.name
        body = build_generate_body(info, prompt, params, stream=stream, task_id=task_id)
        self._generate = GenerateJson(body, bool(body.get("stream")))
        self._request: service_pb2.ModelInferRequest | None = None
        self._build = functools.partial(
            build_text_request, info, prompt, params, stream=stream, task_id=task_id, request_id=request_id
        )

    def infer_request(self) -> service_pb2.ModelInferRequest:
        if self._request is None:
            self._request = self._build()
        return self._request

    def generate_json(self) -> GenerateJson:
        return self._generate

    def openai_json(self) -> None:
        return None


class TritonTensorPayload:
    """A client's Triton tensors (the Triton front ends, prewarming), rewritten for the upstream model; it
    also travels as generate JSON when that carries it unchanged (``generate``)."""

    __slots__ = ("_generate", "_request")

    def __init__(self, request: service_pb2.ModelInferRequest, generate: GenerateJson | None = None) -> None:
        self._request = request
        self._generate = generate

    @property
    def model(self) -> str:
        return str(self._request.model_name)

    def infer_request(self) -> service_pb2.ModelInferRequest:
        return self._request

    def generate_json(self) -> GenerateJson | None:
        return self._generate

    def openai_json(self) -> None:
        return None


class LlmapiPayload:
    """A prompt for TRT-LLM's llmapi model (runtime ``pytorch`` served by Triton): gRPC tensors only."""

    __slots__ = ("_build", "_request", "model")

    def __init__(self, model: str, build: Callable[[], service_pb2.ModelInferRequest]) -> None:
        self.model = model
        self._build = build
        self._request: service_pb2.ModelInferRequest | None = None

    @classmethod
    def for_prompt(
        cls, target: Target, prompt: str, params: SamplingParams, *, stream: bool, request_id: str
    ) -> LlmapiPayload:
        model = target.base.upstream_model
        build = functools.partial(
            build_llmapi_request,
            prompt,
            params,
            stream=stream,
            adapter=target.adapter,
            request_id=request_id,
            model=model,
        )
        return cls(model, build)

    def infer_request(self) -> service_pb2.ModelInferRequest:
        if self._request is None:
            self._request = self._build()
        return self._request

    def generate_json(self) -> None:
        return None

    def openai_json(self) -> None:
        return None


class OpenAIPayload:
    """An OpenAI request for trtllm-serve (runtime ``pytorch``); chat stays chat (the pod applies its template)."""

    __slots__ = ("_json", "model")

    def __init__(
        self,
        target: Target,
        prompt: str,
        messages: tuple[ChatMessage, ...] | None,
        params: SamplingParams,
        *,
        stream: bool,
        priority: float | None = None,
    ) -> None:
        path, body = build_openai_body(target, prompt, messages, params, stream=stream, priority=priority)
        self.model = str(body["model"])
        self._json = OpenAIJson(path, body, stream)

    def infer_request(self) -> None:
        return None

    def generate_json(self) -> None:
        return None

    def openai_json(self) -> OpenAIJson:
        return self._json
