"""A small tritonclient-based client for the reference worker's tests (gRPC streaming, as decoupled needs)."""

from __future__ import annotations

import queue
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import tritonclient.grpc as grpcclient
from numpy.typing import NDArray
from tritonclient.utils import InferenceServerException
from trtfleet_engines.reference.tokenizer import EOS_ID

MODEL = "tensorrt_llm"
NEVER_END_ID = 1_000_000
"""An end_id no token equals: the request runs to request_output_len (for long-running requests)."""


@dataclass(frozen=True)
class Adapter:
    """A converted adapter as a request carries it."""

    name: str
    weights: NDArray[Any]  # [1, N, W] float16
    config: NDArray[np.int32]  # [1, N, 3]


@dataclass
class Result:
    tokens: list[int] = field(default_factory=list)
    responses: int = 0
    error: str | None = None
    final_at: float | None = None


def _tensor(name: str, value: NDArray[Any], datatype: str) -> grpcclient.InferInput:
    tensor = grpcclient.InferInput(name, list(value.shape), datatype)
    tensor.set_data_from_numpy(value)
    return tensor


def request_inputs(
    prompt: Sequence[int],
    max_tokens: int,
    *,
    task_id: int | None = None,
    adapter: Adapter | None = None,
    streaming: bool = False,
    end_id: int | None = EOS_ID,
    stop: bool = False,
) -> list[grpcclient.InferInput]:
    """The ``tensorrt_llm`` inputs of one request (LoRA weights only when ``adapter`` is given).

    ``end_id`` defaults to the tokenizer's ``<eos>``, as the ensemble's preprocessing sends it.
    """
    inputs = [
        _tensor("input_ids", np.array([list(prompt)], np.int32), "INT32"),
        _tensor("input_lengths", np.array([[len(prompt)]], np.int32), "INT32"),
        _tensor("request_output_len", np.array([[max_tokens]], np.int32), "INT32"),
        _tensor("streaming", np.array([[streaming]], bool), "BOOL"),
    ]
    if stop:
        inputs.append(_tensor("stop", np.array([[True]], bool), "BOOL"))
    if end_id is not None:
        inputs.append(_tensor("end_id", np.array([[end_id]], np.int32), "INT32"))
    if task_id is not None:
        inputs.append(_tensor("lora_task_id", np.array([[task_id]], np.uint64), "UINT64"))
    if adapter is not None:
        inputs.append(_tensor("lora_weights", adapter.weights, "FP16"))
        inputs.append(_tensor("lora_config", adapter.config, "INT32"))
    return inputs


class Stream:
    """One gRPC stream with the responses of one request collected (context manager)."""

    def __init__(self, url: str) -> None:
        self.client = grpcclient.InferenceServerClient(url)
        self.result = Result()
        self.done = queue.Queue[bool]()
        self.first_token = queue.Queue[bool]()
        self.client.start_stream(callback=self._on_response)

    def _on_response(self, result: Any, error: InferenceServerException | None) -> None:
        if self.result.final_at is not None:
            return  # e.g. the local cancellation notice when a finished stream is closed
        if error is not None:
            self.result.error = error.message()
            self.result.final_at = time.monotonic()
            self.done.put(True)
            return
        response = result.get_response()
        ids = result.as_numpy("output_ids")
        if ids is not None:
            self.result.tokens += ids.reshape(-1).tolist()
            self.result.responses += 1
            if self.result.tokens:
                self.first_token.put(True)
        if response.parameters["triton_final_response"].bool_param:
            self.result.final_at = time.monotonic()
            self.done.put(True)

    def send(self, inputs: list[grpcclient.InferInput], request_id: str = "") -> None:
        outputs = [
            grpcclient.InferRequestedOutput("output_ids"),
            grpcclient.InferRequestedOutput("sequence_length"),
        ]
        self.client.async_stream_infer(MODEL, inputs, request_id=request_id, outputs=outputs)

    def wait(self, timeout_s: float = 60.0) -> Result:
        self.done.get(timeout=timeout_s)
        return self.result

    def wait_first_token(self, timeout_s: float = 60.0) -> None:
        self.first_token.get(timeout=timeout_s)

    def close(self, cancel: bool = False) -> None:
        """Close the stream; ``cancel`` cancels its request if it is still running.

        Never cancel a finished request: with Triton 2.51 a cancellation that arrives after the final
        response leaves the gRPC handler waiting for a callback, which holds the model until the server's
        exit timeout.
        """
        self.client.stop_stream(cancel_requests=cancel and self.result.final_at is None)
        self.client.close()

    def __enter__(self) -> Stream:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close(cancel=True)


def generate(url: str, prompt: Sequence[int], max_tokens: int, *, request_id: str = "", **options: Any) -> Result:
    """One request, run to completion over its own stream."""
    with Stream(url) as stream:
        stream.send(request_inputs(prompt, max_tokens, **options), request_id)
        return stream.wait()


def wait_until(condition: Callable[[], bool], timeout_s: float = 30.0, interval_s: float = 0.02) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"condition not met within {timeout_s} s")
        time.sleep(interval_s)


BLS_MODEL = "tensorrt_llm_bls"


def bls_inputs(
    text: str,
    max_tokens: int,
    *,
    stream: bool,
    end_id: int | None = None,
    task_id: int | None = None,
    adapter: Adapter | None = None,
) -> list[grpcclient.InferInput]:
    """The ``tensorrt_llm_bls`` inputs of one text request (what the router sends)."""
    inputs = [
        _tensor("text_input", np.array([[text.encode()]], dtype=object), "BYTES"),
        _tensor("max_tokens", np.array([[max_tokens]], np.int32), "INT32"),
        _tensor("stream", np.array([[stream]], bool), "BOOL"),
    ]
    if end_id is not None:
        inputs.append(_tensor("end_id", np.array([[end_id]], np.int32), "INT32"))
    if task_id is not None:
        inputs.append(_tensor("lora_task_id", np.array([[task_id]], np.uint64), "UINT64"))
    if adapter is not None:
        inputs.append(_tensor("lora_weights", adapter.weights, "FP16"))
        inputs.append(_tensor("lora_config", adapter.config, "INT32"))
    return inputs


class BlsStream:
    """One gRPC stream to ``tensorrt_llm_bls`` collecting ``text_output`` chunks (context manager)."""

    def __init__(self, url: str) -> None:
        self.client = grpcclient.InferenceServerClient(url)
        self.chunks = queue.Queue[str | None]()
        self.final = False
        self.error: str | None = None
        self.client.start_stream(callback=self._on_response)

    def _on_response(self, result: Any, error: InferenceServerException | None) -> None:
        if self.final:
            return
        if error is not None:
            self.error = error.message()
            self.final = True
            self.chunks.put(None)
            return
        text = result.as_numpy("text_output")
        if text is not None:
            self.chunks.put(b"".join(text.reshape(-1)).decode())
        if result.get_response().parameters["triton_final_response"].bool_param:
            self.final = True
            self.chunks.put(None)

    def send(self, text: str, max_tokens: int, **options: Any) -> None:
        self.client.async_stream_infer(
            BLS_MODEL,
            bls_inputs(text, max_tokens, stream=True, **options),
            enable_empty_final_response=True,  # the BLS model's final response carries no tensor
        )

    def next_chunk(self, timeout_s: float = 60.0) -> str | None:
        """The next text chunk; None after the final response (or an error)."""
        return self.chunks.get(timeout=timeout_s)

    def text(self, timeout_s: float = 60.0) -> str:
        """Every remaining chunk until the final response, joined."""
        pieces = []
        while (chunk := self.next_chunk(timeout_s)) is not None:
            pieces.append(chunk)
        return "".join(pieces)

    def abandon(self) -> None:
        """What a client that goes away does: the stream is cancelled before its final response."""
        self.client.stop_stream(cancel_requests=not self.final)
        self.client.close()

    def __enter__(self) -> BlsStream:
        return self

    def __exit__(self, *exc: object) -> None:
        self.abandon()
