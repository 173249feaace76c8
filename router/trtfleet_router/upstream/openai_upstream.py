"""The ``pytorch`` upstream's protocol: trtllm-serve's OpenAI API (``/v1/completions``, ``/v1/chat/completions``).

A base model with ``runtime: pytorch`` runs trtllm-serve pods. The OpenAI front end's request travels to
the routed pod as an OpenAI request of the same kind (chat stays chat: the pod applies the model's own
chat template), with only fields trtllm-serve's request models know (they forbid extra fields) and, for
an adapter, ``lora_request {lora_name, lora_int_id, lora_path}``: the task id is the pod's cache key and
the pod reads the PEFT directory at ``lora_path`` when the id is not cached. Nothing else travels: a cold
adapter costs the pod's disk read, never an error, and there is no miss recovery.

Answers come back as the same ``ModelStreamInferResponse`` messages the Triton transports yield (text as
``text_output``, the pod's ``usage`` as ``num_output_tokens``/``num_input_tokens``), so the dispatcher's
routing, stream timeouts, retries and outlier detection apply unchanged.

Errors (``../shared/reference/trtllm-pytorch.md`` section 7; ``tensorrt_llm/serve/openai_server.py``):
trtllm-serve answers request validation *and* internal engine errors with 400, so a status is not a
class. :func:`classify_answer` classifies by text first (a full cache or queue, a broken pod), then by
status (400: the request's; 404 or 5xx: the pod's); :mod:`.openai_transport` then asks the pod's ``/health``, and an
error from a pod that is not healthy is the pod's. A body ``null`` with 200 (the executor stopped
itself), a stream that ends without ``[DONE]`` (chat streams end so on an error), a refused or broken
connection: the pod's. Closing the generator closes the connection, which trtllm-serve notices
within a second and aborts the request.
"""

from __future__ import annotations

import struct
from collections.abc import Mapping, Sequence
from typing import Any, Final

from tritonclient.grpc import service_pb2

from trtfleet_router.chat import ChatMessage
from trtfleet_router.models_registry import Target
from trtfleet_router.upstream.protocol import (
    FailureKind,
    SamplingParams,
    UpstreamFailure,
    classify_upstream_error,
    text_message,
)

COMPLETIONS_PATH: Final = "/v1/completions"
CHAT_PATH: Final = "/v1/chat/completions"
HEALTH_PATH: Final = "/health"
HEALTH_TIMEOUT_S: Final = 2.0
DONE: Final = b"[DONE]"
_I32: Final = struct.Struct("<i")
_COUNT_SHAPE: Final = (1, 1)


def lora_request(target: Target) -> dict[str, Any] | None:
    """trtllm-serve's ``lora_request`` for ``target`` (None for the base model)."""
    adapter = target.adapter
    if adapter is None:
        return None
    return {"lora_name": adapter.served_name, "lora_int_id": adapter.task_id, "lora_path": adapter.lora_path}


def build_openai_body(
    target: Target,
    prompt: str,
    messages: Sequence[ChatMessage] | None,
    params: SamplingParams,
    *,
    stream: bool,
    priority: float | None = None,
) -> tuple[str, dict[str, Any]]:
    """The path and body for the pod: chat when ``messages`` are given, else a completion of ``prompt``.
    Greedy requests arrive as ``top_k`` 1 without a temperature (see ``OpenAIRequest.sampling``). ``priority``:
    trtllm-serve's request priority in [0, 1] (its waiting queue orders by it under ``waiting_queue_policy:
    priority``; None leaves the engine's default, 0.5)."""
    body: dict[str, Any] = {"model": target.base.upstream_name, "max_tokens": params.max_tokens, "stream": stream}
    if messages is not None:
        body["messages"] = [{"role": m.role, "content": m.content} for m in messages]
    else:
        body["prompt"] = prompt
    if stream:
        body["stream_options"] = {"include_usage": True}
    optional: dict[str, Any] = {
        "temperature": params.temperature,
        "top_p": params.top_p,
        "top_k": params.top_k,
        "seed": params.seed,
        "presence_penalty": params.presence_penalty,
        "frequency_penalty": params.frequency_penalty,
        "stop": list(params.stop) if params.stop else None,
        "lora_request": lora_request(target),
        "priority": priority,
    }
    body.update({name: value for name, value in optional.items() if value is not None})
    return (CHAT_PATH if messages is not None else COMPLETIONS_PATH), body


def classify_answer(status: int, message: str) -> UpstreamFailure:
    """An error answer of trtllm-serve, before the pod's health is asked (see the module docstring)."""
    failure = classify_upstream_error(message)
    if failure.kind is not FailureKind.INTERNAL:
        return failure
    if status == 400:
        return UpstreamFailure(FailureKind.INVALID, message)
    if status == 404 or status >= 500:
        return UpstreamFailure(FailureKind.POD_FAILED, f"HTTP {status}: {message}")
    return failure


def piece_message(text: str, usage: object = None) -> service_pb2.ModelStreamInferResponse:
    """One piece of text as a response message, with the pod's token counts when ``usage`` has them."""
    message = text_message(text, final=False)
    if isinstance(usage, dict):
        response = message.infer_response
        for name, key in (("num_output_tokens", "completion_tokens"), ("num_input_tokens", "prompt_tokens")):
            value = usage.get(key)
            if isinstance(value, int):
                response.outputs.add(name=name, datatype="INT32", shape=_COUNT_SHAPE)
                response.raw_output_contents.append(_I32.pack(value))
    return message


def choice_text(doc: Mapping[str, Any]) -> str:
    """The text of a completion or chat answer or chunk (first choice; empty when it has none)."""
    choices = doc.get("choices")
    if not isinstance(choices, list) or not choices or not isinstance(choices[0], dict):
        return ""
    choice = choices[0]
    if "text" in choice:
        return str(choice.get("text") or "")
    part = choice.get("delta") or choice.get("message") or {}
    return str(part.get("content") or "") if isinstance(part, dict) else ""
