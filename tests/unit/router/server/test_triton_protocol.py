"""Triton HTTP/JSON <-> protobuf translation (pure)."""

from __future__ import annotations

import json

import numpy as np
import pytest
from tritonclient.grpc import model_config_pb2, service_pb2
from trtfleet_router.errors import MalformedRequest
from trtfleet_router.server.triton_models import config_json
from trtfleet_router.server.triton_protocol import (
    encode_infer_response,
    generate_answer_reader,
    generate_body_for_tensors,
    generate_http_body,
    generate_output_json,
    merge_responses,
    parse_generate_request,
    parse_infer_request,
)
from trtfleet_router.testing.echo import echo_model_config
from trtfleet_router.upstream.tensors import encode_bytes

CONFIG = echo_model_config("tensorrt_llm_bls")


def _inputs(request: service_pb2.ModelInferRequest) -> dict[str, tuple[str, list[int], bytes]]:
    return {
        t.name: (t.datatype, list(t.shape), raw)
        for t, raw in zip(request.inputs, request.raw_input_contents, strict=True)
    }


def test_json_and_binary_inputs() -> None:
    head = json.dumps(
        {
            "id": "q1",
            "parameters": {"binary_data_output": True, "priority": 2},
            "inputs": [
                {"name": "text_input", "datatype": "BYTES", "shape": [1, 1], "data": ["hi"]},
                {"name": "max_tokens", "datatype": "INT32", "shape": [1, 1], "parameters": {"binary_data_size": 4}},
            ],
            "outputs": [{"name": "text_output", "parameters": {"binary_data": False}}],
        }
    ).encode()
    request, choice = parse_infer_request(head + np.int32(8).tobytes(), len(head))
    assert request.id == "q1" and request.parameters["priority"].int64_param == 2  # int64: what Triton takes
    assert _inputs(request) == {
        "text_input": ("BYTES", [1, 1], encode_bytes([b"hi"])),
        "max_tokens": ("INT32", [1, 1], np.int32(8).tobytes()),
    }
    assert choice.names == ("text_output",) and not choice.binary and choice.binary_default


@pytest.mark.parametrize(
    ("body", "length"),
    [
        (b"not json", None),
        (b'{"inputs": 3}', None),
        (b'{"inputs": [{"name": "x", "datatype": "INT32", "shape": [1]}]}', None),
        (
            b'{"inputs": [{"name": "x", "datatype": "INT32", "shape": [1], "parameters": {"binary_data_size": 8}}]}',
            None,
        ),
        (b'{"inputs": []}xx', 14),
        (b'{"inputs": []}', 99),
    ],
)
def test_malformed_infer_requests(body: bytes, length: int | None) -> None:
    with pytest.raises(MalformedRequest):
        parse_infer_request(body, length)


def _response(text: str, model: str = "up") -> service_pb2.ModelInferResponse:
    response = service_pb2.ModelInferResponse(model_name=model, model_version="1", id="q1")
    response.outputs.add(name="text_output", datatype="BYTES", shape=[1, 1])
    response.raw_output_contents.append(encode_bytes([text.encode()]))
    return response


def test_encode_json_and_binary_responses() -> None:
    body, length = encode_infer_response(_response("out"), parse_infer_request(b'{"inputs": []}', None)[1], "up")
    assert length is None
    assert json.loads(body)["outputs"] == [
        {"name": "text_output", "datatype": "BYTES", "shape": [1, 1], "data": ["out"]}
    ]
    _, binary = parse_infer_request(b'{"inputs": [], "parameters": {"binary_data_output": true}}', None)
    body, length = encode_infer_response(_response("out"), binary, "up")
    assert length is not None
    head = json.loads(body[:length])
    assert head["model_name"] == "up" and head["outputs"][0]["parameters"] == {"binary_data_size": 7}
    assert body[length:] == encode_bytes([b"out"])


def test_generate_request_typed_by_config() -> None:
    request = parse_generate_request(
        {"text_input": "hello", "max_tokens": 5, "stream": True, "stop_words": ["a", "b"], "parameters": {"x": "y"}},
        CONFIG,
    )
    inputs = _inputs(request)
    assert inputs["text_input"][:2] == ("BYTES", [1, 1]) and inputs["max_tokens"][2] == np.int32(5).tobytes()
    assert inputs["stream"][2] == b"\x01" and inputs["stop_words"][:2] == ("BYTES", [1, 2])
    assert request.parameters["x"].string_param == "y"
    with pytest.raises(MalformedRequest, match="unexpected inference input"):
        parse_generate_request({"text_input": "x", "bogus": 1}, CONFIG)


def test_generate_output_and_merge() -> None:
    merged = merge_responses([_response("ab"), _response("cd"), _response("e")])
    assert generate_output_json(merged, "up") == {
        "model_name": "up",
        "model_version": "1",
        "id": "q1",
        "text_output": "abcde",
    }


def test_config_json_renamed_with_integer_dims() -> None:
    doc = config_json(CONFIG, "tiny-upper")
    assert doc["name"] == "tiny-upper" and doc["input"][0]["dims"] == [1]


def _config_with_outputs(*outputs: tuple[str, int]) -> model_config_pb2.ModelConfig:
    config = model_config_pb2.ModelConfig(name="bls", max_batch_size=8)
    for name, data_type in outputs:
        config.output.add(name=name, data_type=data_type, dims=[-1])
    return config


def test_generate_answer_read_back_gives_the_pods_json() -> None:
    # Warm generate requests travel as JSON: reading the pod's answer into a response and writing it
    # for the client must give the pod's JSON back, for every output type TRT-LLM's BLS returns.
    config = _config_with_outputs(
        ("text_output", model_config_pb2.TYPE_STRING),
        ("cum_log_probs", model_config_pb2.TYPE_FP32),
        ("output_log_probs", model_config_pb2.TYPE_FP32),
        ("num_output_tokens", model_config_pb2.TYPE_INT32),
        ("arrival_time_ns", model_config_pb2.TYPE_INT64),
    )
    read = generate_answer_reader(config)
    assert read is not None
    pod = {
        "model_name": "tensorrt_llm_bls",
        "model_version": "1",
        "text_output": "héllo",
        "cum_log_probs": -1.5,
        "output_log_probs": [-0.5, -0.25, -0.75],
        "num_output_tokens": 3,
        "arrival_time_ns": 1795312952000000000,
    }
    message = read(pod, True)
    assert message.infer_response.parameters["triton_final_response"].bool_param
    assert generate_output_json(message.infer_response, "tiny") == {**pod, "model_name": "tiny"}
    with pytest.raises(MalformedRequest):
        read({"num_output_tokens": "three"}, False)


def test_generate_over_json_only_when_every_output_can_travel_as_json() -> None:
    assert generate_answer_reader(_config_with_outputs(("logits", model_config_pb2.TYPE_FP16))) is None
    assert generate_answer_reader(_config_with_outputs(("logits", model_config_pb2.TYPE_FP32))) is not None


def test_generate_http_body_carries_the_adapters_task_id() -> None:
    doc = {"text_input": "x", "lora_task_id": 5, "parameters": {"a": 1}}
    assert generate_http_body(doc, 7) == {"text_input": "x", "lora_task_id": 7, "parameters": {"a": 1}}
    assert generate_http_body(doc, None) == {"text_input": "x", "parameters": {"a": 1}}


def _tensor_request(*inputs: tuple[str, str, list[int], bytes], **params: str) -> service_pb2.ModelInferRequest:
    request = service_pb2.ModelInferRequest(id="c1")
    for name, datatype, shape, raw in inputs:
        request.inputs.add(name=name, datatype=datatype, shape=shape)
        request.raw_input_contents.append(raw)
    for key, value in params.items():
        request.parameters[key].string_param = value
    return request


TEXT = ("text_input", "BYTES", [1, 1], encode_bytes([b"hi"]))
MAX_TOKENS = ("max_tokens", "INT32", [1, 1], np.array([5], np.int32).tobytes())


def test_tensor_requests_become_generate_json_when_nothing_is_lost() -> None:
    stop = ("stop_words", "BYTES", [1, 2], encode_bytes([b"a", b"b"]))
    task = ("lora_task_id", "UINT64", [1, 1], np.array([7], np.uint64).tobytes())
    body = generate_body_for_tensors(_tensor_request(TEXT, MAX_TOKENS, stop, task, x="y"), CONFIG, streaming=False)
    assert body == {
        "text_input": "hi",
        "max_tokens": 5,
        "stop_words": ["a", "b"],
        "lora_task_id": 7,
        "parameters": {"x": "y"},
        "id": "c1",
    }
    rebuilt = {t.name: list(t.shape) for t in parse_generate_request(body, CONFIG).inputs}
    assert rebuilt == {"text_input": [1, 1], "max_tokens": [1, 1], "stop_words": [1, 2], "lora_task_id": [1, 1]}
    streamed = ("stream", "BOOL", [1, 1], b"\x01")
    assert generate_body_for_tensors(_tensor_request(TEXT, streamed), CONFIG, streaming=True) is not None


@pytest.mark.parametrize(
    "inputs",
    [
        pytest.param([("text_input", "BYTES", [2, 1], encode_bytes([b"a", b"b"]))], id="batch-of-two"),
        pytest.param([("text_input", "BYTES", [1, 1], encode_bytes([b"\xff"]))], id="not-utf8"),
        pytest.param([("text_input", "BYTES", [1, 1, 1], encode_bytes([b"a"]))], id="other-shape"),
        pytest.param([TEXT, ("unknown", "INT32", [1, 1], b"\0\0\0\0")], id="undeclared-input"),
        pytest.param([TEXT, ("max_tokens", "INT64", [1, 1], b"\0" * 8)], id="other-type"),
        pytest.param([TEXT, ("stream", "BOOL", [1, 1], b"\x01")], id="stream-on-a-unary-call"),
    ],
)
def test_tensor_requests_that_would_change_stay_on_grpc(inputs: list[tuple[str, str, list[int], bytes]]) -> None:
    assert generate_body_for_tensors(_tensor_request(*inputs), CONFIG, streaming=False) is None


def test_return_flags_keep_requests_on_grpc() -> None:
    config = _config_with_outputs(("text_output", model_config_pb2.TYPE_STRING))
    config.input.add(name="text_input", data_type=model_config_pb2.TYPE_STRING, dims=[1])
    config.input.add(name="return_log_probs", data_type=model_config_pb2.TYPE_BOOL, dims=[1])
    flag = ("return_log_probs", "BOOL", [1, 1], b"\x01")
    assert generate_body_for_tensors(_tensor_request(TEXT, flag), config, streaming=False) is None
    off = ("return_log_probs", "BOOL", [1, 1], b"\x00")
    assert generate_body_for_tensors(_tensor_request(TEXT, off), config, streaming=False) is not None


def test_shaped_reader_gives_tritons_grpc_shapes() -> None:
    config = _config_with_outputs(
        ("text_output", model_config_pb2.TYPE_STRING),
        ("output_log_probs", model_config_pb2.TYPE_FP32),
    )
    config.output.add(name="fixed", data_type=model_config_pb2.TYPE_INT32, dims=[2, 3])
    read = generate_answer_reader(config, shaped=True)
    assert read is not None
    message = read({"text_output": "x", "output_log_probs": [0.5, 0.25], "fixed": [1, 2, 3, 4, 5, 6]}, True)
    shapes = {tensor.name: list(tensor.shape) for tensor in message.infer_response.outputs}
    assert shapes == {"text_output": [1, 1], "output_log_probs": [1, 2], "fixed": [1, 2, 3]}
