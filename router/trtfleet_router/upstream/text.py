"""Text generation on top of the dispatcher: prompt + sampling parameters in, text pieces out.

Used by the OpenAI front end and Triton's generate extension. Upstream, ``stream: true`` makes the
text-level model answer with one response per new piece of text (a delta); ``stream: false`` with one
response holding the whole completion. A ``pytorch`` base model's request travels as trtllm-serve's
OpenAI request instead (:mod:`.openai_upstream`; chat as chat when ``messages`` are given), or, served by
Triton, as the llmapi model's tensors (:mod:`.llmapi_upstream`, whose cumulative answers become deltas). Token
counts come from the engine when it returns ``num_input_tokens``/``num_output_tokens`` (trtllm-serve:
its ``usage``), else from the registry's byte estimate.
"""

from __future__ import annotations

import math
import time
from collections.abc import AsyncGenerator
from contextlib import aclosing
from dataclasses import dataclass

from trtfleet_router.chat import ChatMessage
from trtfleet_router.models_registry import Target
from trtfleet_router.routing.fairqueue import ENGINE_PRIORITY
from trtfleet_router.routing.prefix import NO_BLOCKS, PromptBlocks
from trtfleet_router.routing.tenancy import DEFAULT_TENANT
from trtfleet_router.upstream.call import UpstreamCall
from trtfleet_router.upstream.dispatch import Dispatcher
from trtfleet_router.upstream.llmapi_upstream import CumulativeText
from trtfleet_router.upstream.payload import LlmapiPayload, OpenAIPayload, Payload, TritonTextPayload
from trtfleet_router.upstream.protocol import SamplingParams, TextPiece, check_text_params, read_text
from trtfleet_router.upstream.waiting import Priority


@dataclass(frozen=True, slots=True)
class TextRequest:
    request_id: str
    target: Target
    prompt: str
    params: SamplingParams
    stream: bool
    prompt_tokens: int  # estimated (see models_registry)
    timeout_s: float
    messages: tuple[ChatMessage, ...] | None = None  # a chat request's messages (``prompt`` is them rendered)
    blocks: PromptBlocks = NO_BLOCKS  # the prompt's KV block hashes for routing (routing/prefix.py)
    priority: Priority = Priority.INTERACTIVE  # its band (routing/tenancy.py); batch: a line of the batch runner
    tenant: str = DEFAULT_TENANT


@dataclass(slots=True)
class Usage:
    prompt_tokens: int
    completion_tokens: int = 0
    engine_counted: bool = False

    @property
    def total_tokens(self) -> int:
        return self.prompt_tokens + self.completion_tokens


class TextGenerator:
    def __init__(self, dispatcher: Dispatcher) -> None:
        self.dispatcher = dispatcher

    async def generate(self, request: TextRequest, usage: Usage) -> AsyncGenerator[TextPiece, None]:
        """Text pieces (deltas when streaming); fills ``usage`` as they arrive."""
        target = request.target
        read = CumulativeText().read if target.base.serves_llmapi else read_text
        call = await self.call(request)
        bytes_per_token = target.base.bytes_per_token
        estimated_bytes = 0
        meter = self.dispatcher.admission.tenants.meter(call)
        charged = 0
        async with aclosing(self.dispatcher.stream(call)) as responses:
            async for response in responses:
                piece = read(response)
                if piece.input_tokens is not None:
                    usage.prompt_tokens = piece.input_tokens
                if piece.output_tokens is not None:
                    counted = usage.completion_tokens if request.stream and usage.engine_counted else 0
                    usage.engine_counted = True
                    usage.completion_tokens = counted + piece.output_tokens
                elif not usage.engine_counted:
                    estimated_bytes += len(piece.text.encode("utf-8"))
                    usage.completion_tokens = math.ceil(estimated_bytes / bytes_per_token)
                if usage.completion_tokens > charged:  # the tenant pays for its output as it streams
                    meter.add(usage.completion_tokens - charged)
                    charged = usage.completion_tokens
                yield piece

    async def call(self, request: TextRequest) -> UpstreamCall:
        """The dispatcher's call for ``request``: its payload in the form its base model's pods take."""
        target = request.target
        payload: Payload
        if target.base.serves_openai:
            priority = ENGINE_PRIORITY[request.priority] if target.base.engine_priority else None
            payload = OpenAIPayload(
                target, request.prompt, request.messages, request.params, stream=request.stream, priority=priority
            )
        elif target.base.serves_llmapi:
            # the rendered prompt: the llmapi model applies no chat template
            payload = LlmapiPayload.for_prompt(
                target, request.prompt, request.params, stream=request.stream, request_id=request.request_id
            )
        else:
            info = await self.dispatcher.model_info.info(target.base)
            check_text_params(info, request.params)  # now, not when (if) the gRPC request is built
            payload = TritonTextPayload(
                info,
                request.prompt,
                request.params,
                stream=request.stream,
                task_id=target.adapter.task_id if target.adapter is not None else None,
                request_id=request.request_id,
            )
        return UpstreamCall(
            request_id=request.request_id,
            target=target,
            payload=payload,
            prompt_tokens=request.prompt_tokens,
            max_tokens=request.params.max_tokens,
            deadline_s=time.monotonic() + request.timeout_s,
            client_streaming=request.stream,
            client_id=request.request_id,
            blocks=request.blocks,
            priority=request.priority,
            tenant=request.tenant,
        )


def finish_reason(usage: Usage, max_tokens: int) -> str:
    """``length`` when the answer used every allowed token, else ``stop``."""
    return "length" if usage.completion_tokens >= max_tokens else "stop"
