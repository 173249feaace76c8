"""Triton Python model ``tensorrt_llm_bls`` of the reference engine (decoupled, text in / text out).

Each request is tokenized here, sent to ``tensorrt_llm`` with ``pb_utils.InferenceRequest(...).exec(
decoupled=True)`` and its token responses are decoded incrementally into ``text_output`` deltas
(``stream`` true) or one text (``stream`` false). Each request runs on its own daemon thread, so BLS
requests share in-flight batches instead of queueing behind each other, and a request still running at
unload cannot keep the stub process alive (a thread pool's non-daemon workers would). An error response
of ``tensorrt_llm`` (a LoRA cache miss, ...) is forwarded with its text unchanged.

Cancellation: each ``tensorrt_llm`` response is followed by ``is_cancelled()`` on the client's request;
once the client is gone (a closed gRPC stream or HTTP connection: Triton cancels the request) the BLS sends
TRT-LLM's ``stop`` request for its ``tensorrt_llm`` request (same request id), so the engine retires it at
its next step, then reads the remaining responses to the final one. python_backend r24.10 has no
``ResponseIterator.cancel()`` (added in python_backend@7f21b6702779b862e33a34880050f17f514bc20a, 2025).
A non-streaming request has one ``tensorrt_llm`` response, so it runs to its end.

Every finished response iterator is released as :mod:`~trtfleet_engines.reference.graveyard` explains
(dropping it too early lets the stub's cleanup thread free Python objects without the GIL).
"""

from __future__ import annotations

import itertools
import json
import logging
import os
import threading
from typing import Any

import _trtfleet_bootstrap  # noqa: F401  (sys.path first)
import numpy as np
import triton_python_backend_utils as pb_utils

from trtfleet_engines.reference.graveyard import Graveyard, GraveyardSweeper
from trtfleet_engines.reference.text import IncrementalDecoder, encode_prompt, word_list
from trtfleet_engines.reference.tokenizer import EOS_ID, PAD_ID

logger = logging.getLogger("trtfleet_engines.reference.models.tensorrt_llm_bls")

FINAL = pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL

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
        self._request_ids = itertools.count()
        self._id_prefix = f"bls-{os.getpid()}-"
        self._graveyard: GraveyardSweeper[Any] = GraveyardSweeper(Graveyard())

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

    def _llm_inputs(self, request: Any) -> tuple[list[Any], bool]:
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
                arrays[name] = value
        return [pb_utils.Tensor(name, value) for name, value in arrays.items()], stream

    def _run(self, sender: Any, inputs: list[Any], stream: bool) -> None:
        try:
            self._generate(sender, inputs, stream)
        except Exception as exc:  # report to the client instead of leaving its stream open
            logger.exception("BLS request failed")
            sender.send(_error(f"tensorrt_llm_bls: {exc}"), flags=FINAL)

    def _generate(self, sender: Any, inputs: list[Any], stream: bool) -> None:
        request_id = self._id_prefix + str(next(self._request_ids))
        llm_request = pb_utils.InferenceRequest(
            model_name=self.llm_model,
            inputs=inputs,
            requested_output_names=["output_ids", "sequence_length"],
            request_id=request_id,
        )
        iterator = llm_request.exec(decoupled=True)
        decoder = IncrementalDecoder()
        pieces: list[str] = []
        error: str | None = None
        cancelled = False
        response = None
        for response in iterator:  # always to the final response: an unfinished iterator blocks its release
            if response.has_error():
                error = response.error().message()
                continue
            ids = pb_utils.get_output_tensor_by_name(response, "output_ids")
            if ids is None or cancelled:
                continue  # the empty response carrying only the final flag, or output nobody reads
            if sender.is_cancelled():
                cancelled = True
                self._stop(request_id)
                continue
            lengths = pb_utils.get_output_tensor_by_name(response, "sequence_length").as_numpy()
            delta = decoder.feed(ids.as_numpy().reshape(-1)[: int(lengths.reshape(-1)[0])].tolist())
            if stream and delta:
                sender.send(_text_response(delta))
            pieces.append(delta)
        del response
        self._release(iterator, sender, cancelled)
        del iterator
        if cancelled:
            sender.send(None, flags=FINAL)  # the client is gone; the final flag releases the request
        elif error is not None:
            sender.send(_error(error), flags=FINAL)
        elif stream:
            tail = decoder.flush()
            sender.send(_text_response(tail) if tail else None, flags=FINAL)
        else:
            sender.send(_text_response("".join(pieces) + decoder.flush()), flags=FINAL)

    def _stop(self, request_id: str) -> None:
        """TRT-LLM's cancellation: a ``stop`` request naming the running request's id."""
        stop = pb_utils.InferenceRequest(
            model_name=self.llm_model,
            inputs=[
                pb_utils.Tensor("input_ids", np.zeros((1, 1), np.int32)),
                pb_utils.Tensor("input_lengths", np.ones((1, 1), np.int32)),
                pb_utils.Tensor("request_output_len", np.ones((1, 1), np.int32)),
                pb_utils.Tensor("stop", np.ones((1, 1), bool)),
            ],
            requested_output_names=["output_ids"],
            request_id=request_id,
        )
        iterator = stop.exec(decoupled=True)
        for response in iterator:
            if response.has_error():
                logger.warning("stop of %s failed: %s", request_id, response.error().message())
        self._graveyard.bury(iterator)  # no fresh is_cancelled() to wait on: the client's request is cancelled

    def _release(self, iterator: Any, sender: Any, cancelled: bool) -> None:
        """Drop a finished iterator now if the stub's cleanup thread is done with it, else bury it."""
        if not cancelled and not sender.is_cancelled():
            return  # a fresh answer came through the stub-to-parent queue after the cleanup id: safe to drop
        self._graveyard.bury(iterator)  # is_cancelled() answered from its cache: wait out the hold time

    def finalize(self) -> None:
        dropped = self._graveyard.close()
        logger.info("tensorrt_llm_bls finalized (%d buried response iterators released)", dropped)
