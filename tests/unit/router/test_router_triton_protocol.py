"""Triton HTTP/JSON <-> protobuf translation (pure)."""

from __future__ import annotations

import json

import numpy as np
import pytest
from tritonclient.grpc import service_pb2
from trtfleet_router.errors import MalformedRequest
from trtfleet_router.server.triton_protocol import (
    config_json,
    encode_infer_response,
    generate_output_json,
    merge_responses,
    parse_generate_request,
    parse_infer_request,
)
from trtfleet_router.upstream.echo import echo_model_config
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
    assert request.id == "q1" and request.parameters["priority"].uint64_param == 2
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
