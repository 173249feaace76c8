"""Triton Python model ``tensorrt_llm`` of the reference engine's llmapi mode (decoupled per ``model.yaml``).

It takes the tensors of TRT-LLM's ``llmapi`` model and answers as it does: one response per request, or
with ``streaming`` one per new piece of text (each carrying the whole text so far), the last flagged final;
errors are ``TritonError`` responses "Error generating request: ..." with a ``text_output`` of "N/A". The
configuration is ``model.yaml`` next to this file (or ``$LLM_CONFIG_PATH``): ``model`` and the LLM-API options.
All logic lives in ``trtfleet_engines.reference.llmapi``; this file only translates.
"""

from __future__ import annotations

import json
import logging
import os
import shlex
from pathlib import Path
from typing import Any

import _trtfleet_bootstrap  # noqa: F401  (sys.path first)
import numpy as np
import triton_python_backend_utils as pb_utils
import yaml

from trtfleet_engines.reference.llmapi.contract import (
    ERROR_PREFIX,
    SERVE_ARGS_PARAMETER,
    LlmapiRequest,
    LlmapiRequestError,
    is_stop_request,
    parse_request,
)
from trtfleet_engines.reference.llmapi.runtime import CANCELLED_TEXT, LlmapiEngine, settings_for

logger = logging.getLogger("trtfleet_engines.reference.models.tensorrt_llm_llmapi")
CONFIG_ENV = "LLM_CONFIG_PATH"


def _getter(request: Any) -> Any:
    def get(name: str) -> Any:
        tensor = pb_utils.get_input_tensor_by_name(request, name)
        return None if tensor is None else tensor.as_numpy()

    return get


def _strings(*values: str) -> Any:
    return np.array([v.encode("utf-8") for v in values], dtype=np.object_)


def _error(text: str, *, cancelled: bool = False) -> Any:
    if cancelled:
        return pb_utils.InferenceResponse(error=pb_utils.TritonError(text, pb_utils.TritonError.CANCELLED))
    return pb_utils.InferenceResponse(
        output_tensors=[pb_utils.Tensor("text_output", _strings("N/A"))],
        error=pb_utils.TritonError(ERROR_PREFIX + text),
    )


class _Sink:
    """One request's response sender."""

    def __init__(self, sender: Any, request: LlmapiRequest | None) -> None:
        self.sender = sender
        self.request = request

    def send(self, text: str, finish_reason: str | None, *, final: bool) -> None:
        tensors = [pb_utils.Tensor("text_output", _strings(text))]
        if self.request is not None and self.request.return_finish_reason:
            tensors.append(pb_utils.Tensor("finish_reason", _strings(str(finish_reason))))
        if self.request is not None and self.request.return_stop_reason:
            tensors.append(pb_utils.Tensor("stop_reason", _strings("None")))
        self._send(pb_utils.InferenceResponse(output_tensors=tensors), final=final)

    def fail(self, text: str, *, cancelled: bool = False) -> None:
        self._send(_error(text, cancelled=cancelled), final=True)

    def is_cancelled(self) -> bool:
        return bool(self.sender.is_cancelled())

    def _send(self, response: Any, *, final: bool) -> None:
        flags = pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL if final else 0
        try:
            self.sender.send(response, flags=flags)
        except Exception as exc:  # the client went away: nothing else to do for this request
            logger.info("response not delivered: %s", exc)


class TritonPythonModel:
    def initialize(self, args: dict[str, str]) -> None:
        logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
        config = json.loads(args["model_config"])
        self.decoupled = bool(config.get("model_transaction_policy", {}).get("decoupled", False))
        version_dir = Path(args["model_repository"]) / args["model_version"]
        path = os.path.join(version_dir, os.environ.get(CONFIG_ENV, "model.yaml"))
        options = yaml.safe_load(Path(path).read_text(encoding="utf-8")) or {}
        serve_args = config.get("parameters", {}).get(SERVE_ARGS_PARAMETER, {}).get("string_value", "")
        self.engine = LlmapiEngine(settings_for(path, str(options["model"]), shlex.split(serve_args)))
        self.engine.start()
        logger.info("reference llmapi tensorrt_llm ready: model=%s decoupled=%s", options["model"], self.decoupled)

    def execute(self, requests: list[Any]) -> None:
        for request in requests:
            sender = request.get_response_sender()
            get = _getter(request)
            user_id = request.request_id() or ""
            try:
                if is_stop_request(get):
                    if not user_id:
                        _Sink(sender, None).fail("A request id must be provided for request cancellation")
                        continue
                    self.engine.stop_user(user_id)
                    _Sink(sender, None).fail(CANCELLED_TEXT, cancelled=True)
                    continue
                parsed = parse_request(get, path_exists=os.path.exists)
                if parsed.streaming and not self.decoupled:
                    raise LlmapiRequestError("Streaming is only supported in decoupled mode.")
            except LlmapiRequestError as exc:
                _Sink(sender, None).fail(exc.text)
                continue
            self.engine.submit(parsed, _Sink(sender, parsed), user_id=user_id)
        return None

    def finalize(self) -> None:
        self.engine.stop()
