"""Triton Python model ``tensorrt_llm_bls`` of the reference engine (decoupled, text in / text out).

Each request is tokenized here, sent to ``tensorrt_llm`` and its token responses are decoded incrementally
into ``text_output`` deltas (``stream`` true) or one text (``stream`` false). Each request runs on its own
daemon thread, so BLS requests share in-flight batches instead of queueing behind each other, and a
request still running at unload cannot keep the stub process alive (a thread pool's non-daemon workers
would). An error response of ``tensorrt_llm`` (a LoRA cache miss, ...) is forwarded with its text unchanged.

``tensorrt_llm`` is called over a gRPC stream to this worker's own tritonserver, not with pb_utils BLS,
whose r24.10 implementation deadlocks and corrupts the heap under concurrent streams (see
:mod:`~trtfleet_engines.reference.engine_stream`). Cancellation: while waiting for ``tensorrt_llm``, the
model asks ``is_cancelled()`` after every response and every ``CANCEL_CHECK_S``; once the client is gone (a
closed gRPC stream or HTTP connection: Triton cancels the request) it sends TRT-LLM's ``stop`` request for
its ``tensorrt_llm`` request (same request id), so the engine retires it at its next step, then waits for
the final response. The client's request is then ended with an empty final response.
"""

from __future__ import annotations

import itertools
import json
import logging
import os
import queue
import threading
from typing import Any

import _trtfleet_bootstrap  # noqa: F401  (sys.path first)
import numpy as np
import triton_python_backend_utils as pb_utils

from trtfleet_engines.reference.engine_stream import EngineStream, grpc_address, stop_request
from trtfleet_engines.reference.text import IncrementalDecoder, encode_prompt, word_list
from trtfleet_engines.reference.tokenizer import EOS_ID, PAD_ID

logger = logging.getLogger("trtfleet_engines.reference.models.tensorrt_llm_bls")

FINAL = pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL
CANCEL_CHECK_S = 0.1
"""Longest wait for a ``tensorrt_llm`` response before asking whether the client is still there."""
STOP_TIMEOUT_S = 30.0

# BLS input -> (tensorrt_llm input, dtype) for the scalar pass-through knobs.
_PASS_THROUGH = {
    "temperature": ("temperature", np.float32),
    "top_k": ("runtime_top_k", np.int32),
    "top_p": ("runtime_top_p", np.float32),
    "seed": ("seed", np.uint64),
    "lora_task_id": ("lora_task_id", np.uint64),
}


def _input(request: Any, name: str) -> Any:
    tensor = pb_utils.get_input_tensor_by_name(request, name)
    return None if tensor is None else tensor.as_numpy()


def _scalar(request: Any, name: str) -> Any:
    value = _input(request, name)
    return None if value is None or value.size == 0 else value.reshape(-1)[0]


def _text_response(text: str) -> Any:
    value = np.array([[text.encode("utf-8")]], dtype=object)
    return pb_utils.InferenceResponse(output_tensors=[pb_utils.Tensor("text_output", value)])


def _error(text: str) -> Any:
    return pb_utils.InferenceResponse(error=pb_utils.TritonError(text, pb_utils.TritonError.INTERNAL))


class TritonPythonModel:
    def initialize(self, args: dict[str, str]) -> None:
        config = json.loads(args["model_config"])
        params = {k: v.get("string_value", "") for k, v in (config.get("parameters") or {}).items()}
        self.llm_model = params.get("tensorrt_llm_model_name") or "tensorrt_llm"
        self.address = grpc_address()
        self._request_ids = itertools.count()
        self._id_prefix = f"bls-{os.getpid()}-"

    def execute(self, requests: list[Any]) -> None:
        for request in requests:
            sender = request.get_response_sender()
            try:
                inputs, stream = self._llm_inputs(request)
            except (ValueError, TypeError) as exc:
                sender.send(_error(f"invalid request: {exc}"), flags=FINAL)
                continue
            threading.Thread(target=self._run, args=(sender, inputs, stream), name="bls", daemon=True).start()
        return None

    def _llm_inputs(self, request: Any) -> tuple[dict[str, Any], bool]:
        text = _scalar(request, "text_input")
        prompt = encode_prompt(text.decode("utf-8") if isinstance(text, bytes) else str(text))
        max_tokens = _scalar(request, "max_tokens")
        if max_tokens is None:
            raise ValueError("max_tokens is required")
        stream = bool(_scalar(request, "stream"))
        end_id, pad_id = _scalar(request, "end_id"), _scalar(request, "pad_id")
        arrays = {
            "input_ids": np.array([prompt], np.int32),
            "input_lengths": np.array([[len(prompt)]], np.int32),
            "request_output_len": np.array([[int(max_tokens)]], np.int32),
            "end_id": np.array([[EOS_ID if end_id is None else int(end_id)]], np.int32),
            "pad_id": np.array([[PAD_ID if pad_id is None else int(pad_id)]], np.int32),
            "streaming": np.array([[stream]], bool),
            "exclude_input_in_output": np.array([[True]], bool),
        }
        for name, (target, dtype) in _PASS_THROUGH.items():
            value = _scalar(request, name)
            if value is not None:
                arrays[target] = np.array([[value]], dtype)
        stop_words = _input(request, "stop_words")
        if stop_words is not None and stop_words.size:
            words = [w.decode("utf-8") if isinstance(w, bytes) else str(w) for w in stop_words.reshape(-1)]
            arrays["stop_words_list"] = word_list(words)[None]
        for name in ("lora_weights", "lora_config"):
            value = _input(request, name)
            if value is not None:
                arrays[name] = np.array(value, copy=True)  # the request's memory is not ours after execute
        return arrays, stream

    def _run(self, sender: Any, inputs: dict[str, Any], stream: bool) -> None:
        try:
            self._generate(sender, inputs, stream)
        except Exception as exc:  # report to the client instead of leaving its stream open
            logger.exception("BLS request failed")
            sender.send(_error(f"tensorrt_llm_bls: {exc}"), flags=FINAL)

    def _generate(self, sender: Any, inputs: dict[str, Any], stream: bool) -> None:
        request_id = self._id_prefix + str(next(self._request_ids))
        decoder = IncrementalDecoder()
        pieces: list[str] = []
        error: str | None = None
        cancelled = False
        with EngineStream(self.address, self.llm_model) as upstream:
            upstream.send(inputs, request_id, outputs=("output_ids", "sequence_length"))
            while True:
                try:
                    event = upstream.events.get(timeout=CANCEL_CHECK_S)
                except queue.Empty:
                    event = None
                if not cancelled and sender.is_cancelled():
                    cancelled = True
                    self._stop(request_id)
                if event is None:
                    continue
                if event.error is not None:
                    error = event.error
                    break
                ids, lengths = event.outputs.get("output_ids"), event.outputs.get("sequence_length")
                if ids is not None and lengths is not None and not cancelled:
                    delta = decoder.feed(ids.reshape(-1)[: int(lengths.reshape(-1)[0])].tolist())
                    if stream and delta:
                        sender.send(_text_response(delta))
                    pieces.append(delta)
                if event.final:
                    break
        if cancelled:
            sender.send(None, flags=FINAL)  # the client is gone; the final flag releases its request
        elif error is not None:
            sender.send(_error(error), flags=FINAL)
        elif stream:
            tail = decoder.flush()
            sender.send(_text_response(tail) if tail else None, flags=FINAL)
        else:
            sender.send(_text_response("".join(pieces) + decoder.flush()), flags=FINAL)

    def _stop(self, request_id: str) -> None:
        """TRT-LLM's cancellation: a ``stop`` request naming the running request's id (on a stream of its own)."""
        with EngineStream(self.address, self.llm_model) as stopper:
            stopper.send(stop_request(), request_id, outputs=("output_ids",))
            event = stopper.events.get(timeout=STOP_TIMEOUT_S)
            if event.error is not None:
                logger.warning("stop of %s failed: %s", request_id, event.error)
