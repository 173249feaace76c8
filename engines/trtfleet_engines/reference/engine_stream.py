"""How the reference BLS model calls ``tensorrt_llm``: a gRPC stream to its own tritonserver, not pb_utils BLS.

python_backend r24.10's decoupled BLS (``pb_utils.InferenceRequest(...).exec(decoupled=True)``) deadlocks a
stub under concurrent streams, seen twice in 4,000 soak requests at 20 streams (the worker then hangs with
requests in flight): a thread in ``ResponseIterator::Next`` wakes up holding the iterator's mutex and waits
for the GIL (``src/pb_response_iterator.cc``); the parent-to-stub thread, in
``Stub::ProcessBLSResponseDecoupled``, holds ``response_iterator_map_mu_`` and waits for that iterator's
mutex to enqueue the next response (``src/pb_stub.cc``); a thread starting a request holds the GIL in
``Stub::GetResponseIterator`` and waits for ``response_iterator_map_mu_`` (same file). All three at
triton-inference-server/python_backend@01d0ad82f9f5d63978456e26c8a2a9746a9d68d8 (r24.10), unchanged on main
at @f9088ff60944cc5a2e97ff16baba55f1666852bc. The same BLS path frees responses without the GIL when its
cleanup thread erases an iterator that Python already dropped (``Stub::SendCleanupId``), and has no
``cancel()`` (added in python_backend@7f21b6702779b862e33a34880050f17f514bc20a).

A gRPC stream (``tritonclient.grpc``, the same ``ModelStreamInfer`` call every client uses) has none of
this: responses arrive on the client's own thread into a queue. The server's address comes from
:data:`GRPC_ADDRESS_ENV`, set by :func:`~trtfleet_engines.reference.server.start_worker`.
"""

from __future__ import annotations

import os
import queue
from dataclasses import dataclass
from typing import Any

import numpy as np
from numpy.typing import NDArray

GRPC_ADDRESS_ENV = "TRTFLEET_WORKER_GRPC_ADDRESS"
DEFAULT_GRPC_ADDRESS = "127.0.0.1:8001"
"""tritonserver's default gRPC port, for a server started by hand without the variable."""


def grpc_address() -> str:
    return os.environ.get(GRPC_ADDRESS_ENV) or DEFAULT_GRPC_ADDRESS


@dataclass(frozen=True)
class EngineEvent:
    """One response of a request on the stream (``error`` set: the request failed and is over)."""

    request_id: str
    outputs: dict[str, NDArray[Any]]
    final: bool
    error: str | None = None


class EngineStream:
    """One gRPC stream to the worker's own server for one request; its responses are queued."""

    def __init__(self, address: str, model: str) -> None:
        import tritonclient.grpc as grpcclient

        self._grpc = grpcclient
        self.model = model
        self.client = grpcclient.InferenceServerClient(address)
        self.events: queue.Queue[EngineEvent] = queue.Queue()
        self._closed = False
        self._ended = False  # the request's final response (or error) arrived
        self.client.start_stream(callback=self._on_response)

    def _on_response(self, result: Any, error: Any) -> None:
        if self._closed:
            return  # the local "cancelled" notice of close()
        if error is not None:
            self._ended = True
            self.events.put(EngineEvent("", {}, final=True, error=error.message()))
            return
        response = result.get_response()
        outputs = {output.name: result.as_numpy(output.name) for output in response.outputs}
        final = bool(response.parameters["triton_final_response"].bool_param)
        self._ended = self._ended or final
        self.events.put(EngineEvent(response.id, outputs, final=final))

    def send(self, arrays: dict[str, NDArray[Any]], request_id: str, outputs: tuple[str, ...]) -> None:
        from tritonclient.utils import np_to_triton_dtype

        inputs = []
        for name, value in arrays.items():
            tensor = self._grpc.InferInput(name, list(value.shape), np_to_triton_dtype(value.dtype))
            tensor.set_data_from_numpy(value)
            inputs.append(tensor)
        self.client.async_stream_infer(
            self.model,
            inputs,
            request_id=request_id,
            outputs=[self._grpc.InferRequestedOutput(name) for name in outputs],
            enable_empty_final_response=True,  # streaming ends with an empty response carrying the flag
        )

    def close(self) -> None:
        """End the stream and the channel, cancelling the request only if it has not ended.

        Never cancel an ended request: with Triton 2.51 a cancellation that arrives after the final
        response leaves the gRPC handler waiting for a callback, which holds the model until the server's
        exit timeout.
        """
        cancel = not self._ended
        self._closed = True
        self.client.stop_stream(cancel_requests=cancel)
        self.client.close()

    def __enter__(self) -> EngineStream:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def stop_request() -> dict[str, NDArray[Any]]:
    """TRT-LLM's cancellation request: ``stop`` true, sent with the running request's id."""
    return {
        "input_ids": np.zeros((1, 1), np.int32),
        "input_lengths": np.ones((1, 1), np.int32),
        "request_output_len": np.ones((1, 1), np.int32),
        "stop": np.ones((1, 1), bool),
    }
