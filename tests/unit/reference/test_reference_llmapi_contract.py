"""The reference llmapi model's contract: its config parses as Triton's, requests are checked as upstream checks
them (with upstream's texts), the text output heads with the prompt unless excluded."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from google.protobuf import text_format
from tritonclient.grpc import model_config_pb2
from trtfleet_engines.reference.errors import RepositoryError
from trtfleet_engines.reference.llmapi.contract import (
    DEFAULT_MAX_TOKENS,
    LlmapiRequestError,
    is_stop_request,
    output_text,
    parse_request,
    render_config,
)


def getter(**inputs: Any) -> Any:
    arrays = {name: np.array(value if isinstance(value, list) else [value]) for name, value in inputs.items()}
    return arrays.get


def exists(path: str) -> bool:
    return path.startswith("/adapters/")


def test_config_is_the_llmapi_models_with_triton_config_applied() -> None:
    config = text_format.Parse(render_config({"max_batch_size": 0, "decoupled": True}, serve_args=["--max-loras", "1"]),
                               model_config_pb2.ModelConfig())
    assert (config.name, config.backend, config.max_batch_size) == ("tensorrt_llm", "python", 0)
    assert config.model_transaction_policy.decoupled
    inputs = {t.name: t for t in config.input}
    assert not inputs["text_input"].optional and all(t.optional for n, t in inputs.items() if n != "text_input")
    assert {"lora_id", "lora_name", "lora_path", "lora_ckpt_source"} <= set(inputs)
    assert config.parameters["reference_serve_args"].string_value == "--max-loras 1"


def test_a_batching_triton_config_is_refused() -> None:
    with pytest.raises(RepositoryError, match="max_batch_size must be 0"):
        render_config({"max_batch_size": 8, "decoupled": False})


def test_defaults_follow_upstream() -> None:
    request = parse_request(getter(text_input=b"hi"), path_exists=exists)
    assert (request.max_tokens, request.streaming, request.exclude_input_from_output) == (DEFAULT_MAX_TOKENS, False,
                                                                                          False)
    assert output_text(request, " there") == "hi there"


def test_sampling_and_lora_inputs_are_read() -> None:
    request = parse_request(getter(
        text_input=b"hi", streaming=True, sampling_param_max_tokens=np.int32(5), sampling_param_temperature=0.0,
        sampling_param_stop=[b"a", b"b"], sampling_param_exclude_input_from_output=True,
        lora_id=np.uint64(3), lora_name=b"upper", lora_path=b"/adapters/upper",
    ), path_exists=exists)
    assert (request.max_tokens, request.temperature, request.stop) == (5, 0.0, ("a", "b"))
    assert request.lora is not None and (request.lora.lora_id, request.lora.path) == (3, "/adapters/upper")
    assert output_text(request, "HI") == "HI"


@pytest.mark.parametrize(
    ("inputs", "text"),
    [
        pytest.param({}, "text_input is missing from the request", id="no-text"),
        pytest.param({"text_input": b"x", "lora_id": np.uint64(1)}, "must all be provided together", id="lora-id-only"),
        pytest.param({"text_input": b"x", "lora_id": np.uint64(1), "lora_name": b"n", "lora_path": b"/nowhere"},
                     "lora_path does not exist on the Triton server's filesystem: /nowhere", id="missing-path"),
        pytest.param({"text_input": b"x", "lora_id": np.uint64(1), "lora_name": b"n", "lora_path": b"/adapters/a",
                      "lora_ckpt_source": b"onnx"}, "lora_ckpt_source must be one of", id="bad-source"),
    ],
)
def test_refusals_use_upstream_texts(inputs: dict[str, Any], text: str) -> None:
    with pytest.raises(LlmapiRequestError, match=text):
        parse_request(getter(**inputs), path_exists=exists)


def test_stop_request() -> None:
    assert is_stop_request(getter(stop=True)) and not is_stop_request(getter(text_input=b"x"))
