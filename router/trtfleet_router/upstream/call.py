"""One request as the dispatcher takes it, and how its attempts travel."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from tritonclient.grpc import service_pb2

from trtfleet_router.models_registry import Target
from trtfleet_router.routing.prefix import NO_BLOCKS, PromptBlocks
from trtfleet_router.routing.types import Decision
from trtfleet_router.upstream.http_transport import AnswerReader
from trtfleet_router.upstream.priority import Priority


@dataclass(slots=True)
class UpstreamCall:
    """One request for the dispatcher. ``request`` may be ``None`` when ``build_request`` makes it on
    first use: a warm text request that travels as ``http_body`` never needs the gRPC message."""

    request_id: str
    target: Target
    request: service_pb2.ModelInferRequest | None  # for target.base.upstream_model, lora_task_id set
    prompt_tokens: int
    max_tokens: int
    deadline_s: float  # on time.monotonic()
    client_streaming: bool = False  # the client receives the answer as a stream (see UpstreamCalls.AUTO)
    pinned_decision: Decision | None = None  # prewarming: this pod, with weights, no retry elsewhere
    http_body: Mapping[str, Any] | None = None  # the same request as Triton generate JSON (warm attempts)
    build_request: Callable[[], service_pb2.ModelInferRequest] | None = None
    upstream_model: str = ""  # the model the request is for (taken from ``request`` when empty)
    http_stream: bool = False  # http_body goes to generate_stream (SSE) instead of generate
    http_answer: AnswerReader | None = None  # reads the pod's generate JSON (default: text_output only)
    openai_body: Mapping[str, Any] | None = None  # runtime pytorch: the request for trtllm-serve (see openai_upstream)
    openai_path: str = ""  # /v1/completions or /v1/chat/completions
    blocks: PromptBlocks = NO_BLOCKS  # the prompt's KV block hashes, computed once by the front end
    priority: Priority = Priority.INTERACTIVE  # batch lines wait for headroom (see priority.py)

    def grpc_request(self) -> service_pb2.ModelInferRequest:
        """The gRPC request, built on first use."""
        if self.request is None:
            if self.build_request is None:
                raise ValueError("an UpstreamCall needs a request or a build_request")
            self.request = self.build_request()
        return self.request

    @property
    def model_name(self) -> str:
        return self.upstream_model or self.grpc_request().model_name

    @property
    def client_id(self) -> str:
        """The id the client sent (gRPC/tensor calls) or the router's request id (text calls)."""
        return self.request.id if self.request is not None else self.request_id


class UpstreamCalls(StrEnum):
    """How attempts travel (see :mod:`~trtfleet_router.upstream.transport`)."""

    AUTO = "auto"  # client streams: a call each (cancellable); unary requests: multiplexed
    PER_REQUEST = "per-request"
    MULTIPLEXED = "multiplexed"
