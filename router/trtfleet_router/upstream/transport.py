"""The seam between the dispatcher and the wires: one :class:`Attempt` in, the pod's answers out.

Four transports implement :class:`Transport`: trtllm-serve's OpenAI API (:mod:`.openai_upstream`), Triton's
HTTP generate extension (:mod:`.http_transport`), and gRPC ``ModelStreamInfer`` as a call per request or
multiplexed on shared streams (:mod:`.grpc_transport`). Each says whether it can carry an attempt (its wire
is among the payload's forms, the pod has the port, weights travel only over gRPC) and yields the pod's
``ModelStreamInferResponse`` messages until the request's final one, raising
:class:`~.failures.UpstreamCallFailed` (a classified failure) when the attempt fails.
"""

from __future__ import annotations

from collections.abc import AsyncGenerator
from dataclasses import dataclass
from typing import Protocol

from tritonclient.grpc import service_pb2

from trtfleet_router.liveview import PodEndpoint
from trtfleet_router.upstream.payload import Payload
from trtfleet_router.upstream.protocol import UpstreamModelInfo, request_stream_final_flag, with_weights
from trtfleet_router.weights import AdapterWeights


@dataclass(frozen=True, slots=True)
class AttachedWeights:
    """An adapter's weights going along with an attempt, and the model info that shapes their tensors."""

    info: UpstreamModelInfo
    weights: AdapterWeights


@dataclass(frozen=True, slots=True)
class Attempt:
    """One try of a request on one pod."""

    payload: Payload
    endpoint: PodEndpoint
    deadline_s: float  # on time.monotonic()
    client_streaming: bool
    weights: AttachedWeights | None = None

    def infer_request(self) -> service_pb2.ModelInferRequest:
        """The gRPC request of this attempt: the payload's, with the weights when they go along, and with
        Triton asked to flag the stream's last response."""
        request = self.payload.infer_request()
        if request is None:
            raise TypeError(f"a {type(self.payload).__name__} has no gRPC form")
        if self.weights is not None:
            request = with_weights(request, self.weights.info, self.weights.weights)
        request_stream_final_flag(request)
        return request


class Transport(Protocol):
    label: str
    """The ``trtfleet_router_upstream_attempts_total`` label of the attempts it carries."""

    def carries(self, attempt: Attempt) -> bool: ...

    def exchange(self, attempt: Attempt) -> AsyncGenerator[service_pb2.ModelStreamInferResponse, None]: ...

    async def close(self) -> None: ...
