"""Triton Python model ``tensorrt_llm`` of the CPU reference engine (decoupled).

It takes exactly the tensors of TRT-LLM's ``tensorrt_llm`` model and answers like the C++ backend:
``execute`` only decodes and enqueues (or answers a ``stop`` request), a scheduler thread runs in-flight
batching over the tiny numpy Llama with the LoRA cache, and responses go out through each request's
response sender (``triton_final_response`` on the last). Errors are ``TritonError`` responses with the
backend's texts. All logic lives in ``trtfleet_engines.reference``; this file only translates.
"""

from __future__ import annotations

import json
import logging
import time
from dataclasses import dataclass
from typing import Any

import _trtfleet_bootstrap  # noqa: F401  (sys.path first)
import triton_python_backend_utils as pb_utils

from trtfleet_engines.reference.engine import build_batcher
from trtfleet_engines.reference.errors import RequestRejected
from trtfleet_engines.reference.loop import EngineLoop
from trtfleet_engines.reference.metrics import TritonMetrics
from trtfleet_engines.reference.protocol import is_stop_request, output_tensors, parse_request
from trtfleet_engines.reference.scheduler import BatcherStats, EngineResponse
from trtfleet_engines.reference.settings import settings_from_model_config

logger = logging.getLogger("trtfleet_engines.reference.models.tensorrt_llm")


@dataclass(frozen=True)
class _Handle:
    sender: Any
    requested: frozenset[str]
    num_input_tokens: int


def _getter(request: Any) -> Any:
    def get(name: str) -> Any:
        tensor = pb_utils.get_input_tensor_by_name(request, name)
        return None if tensor is None else tensor.as_numpy()

    return get


def _error_response(text: str) -> Any:
    return pb_utils.InferenceResponse(error=pb_utils.TritonError(text, pb_utils.TritonError.INTERNAL))


class TritonPythonModel:
    def initialize(self, args: dict[str, str]) -> None:
        logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
        config = json.loads(args["model_config"])
        self.settings = settings_from_model_config(config)
        batcher = build_batcher(self.settings, _Handle)
        self.metrics = TritonMetrics(pb_utils, args["model_name"], args["model_version"], batcher.stats())
        self._report(batcher.stats())
        self.loop = EngineLoop(
            batcher,
            self._deliver,
            is_cancelled=lambda handle: bool(handle.sender.is_cancelled()),
            on_stats=self._report,
            min_step_s=self.settings.min_step_s,
            prefill_s_per_token=self.settings.prefill_s_per_token,
            host_to_device_bytes_per_s=self.settings.host_to_device_bytes_per_s,
            network_bytes_per_s=self.settings.network_bytes_per_s,
        )
        self.loop.start()
        logger.info(
            "reference tensorrt_llm ready: model_dir=%s limits=%s",
            self.settings.model_dir,
            self.settings.limits,
        )

    def execute(self, requests: list[Any]) -> None:
        for request in requests:
            sender = request.get_response_sender()
            get = _getter(request)
            user_id = request.request_id() or ""
            if is_stop_request(get):
                if not user_id:
                    sender.send(
                        _error_response("A request id must be provided for request cancellation"),
                        flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL,
                    )
                    continue
                self.loop.stop_user_request(user_id)
                sender.send(pb_utils.InferenceResponse(), flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
                continue
            try:
                parsed = parse_request(
                    get, user_id=user_id, exclude_input_default=self.settings.exclude_input_in_output
                )
                handle = _Handle(sender, frozenset(request.requested_output_names()), len(parsed.prompt))
                self.loop.submit(parsed, handle)
            except RequestRejected as exc:
                sender.send(_error_response(exc.text), flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
        return None

    def _deliver(self, responses: list[EngineResponse[_Handle]]) -> None:
        for response in responses:
            handle = response.handle
            flags = pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL if response.final else 0
            if response.error is not None:
                message = _error_response(response.error)
            else:
                tensors = output_tensors(
                    response.output_ids, handle.requested, num_input_tokens=handle.num_input_tokens,
                    draft_tokens=response.draft_tokens, accepted_draft_tokens=response.accepted_draft_tokens,
                )
                message = pb_utils.InferenceResponse(
                    output_tensors=[pb_utils.Tensor(name, value) for name, value in tensors.items()]
                )
            try:
                handle.sender.send(message, flags=flags)
            except Exception as exc:  # the client went away: nothing else to do for this request
                logger.info("request %s: response not delivered: %s", response.request_id, exc)

    def _report(self, stats: BatcherStats) -> None:
        self.metrics.update(stats, int(time.time() * 1e6))

    def finalize(self) -> None:
        self.loop.stop()
        self.metrics.close()  # never leave pb_utils metrics to the stub's own teardown (see TritonMetrics.close)
