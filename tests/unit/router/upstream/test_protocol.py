"""Upstream request building, LoRA attachment, response reading, error classification (pure)."""

from __future__ import annotations

import grpc
import numpy as np
import pytest
from tritonclient.grpc import service_pb2
from trtfleet_router.errors import MalformedRequest, UnsupportedParameter, WeightsUnavailable
from trtfleet_router.testing.echo import echo_model_config
from trtfleet_router.upstream.protocol import (
    FailureKind,
    SamplingParams,
    UpstreamModelInfo,
    build_text_request,
    classify_upstream_error,
    read_text,
    set_lora_task_id,
    with_weights,
)
from trtfleet_router.upstream.tensors import (
    decode_bytes,
    encode_bytes,
    json_to_raw,
    normalize_to_raw,
    raw_to_json,
)
from trtfleet_router.weights import AdapterWeights

from trtfleet.loracache import FULL_TEXT, MISS_TEXT

INFO = UpstreamModelInfo.from_config(echo_model_config("tensorrt_llm_bls"))


def _inputs(request: service_pb2.ModelInferRequest) -> dict[str, tuple[str, list[int], bytes]]:
    return {
        t.name: (t.datatype, list(t.shape), raw)
        for t, raw in zip(request.inputs, request.raw_input_contents, strict=True)
    }


def test_text_request_tensors() -> None:
    params = SamplingParams(max_tokens=9, temperature=0.5, top_k=1, seed=42, stop=("\n", "END"))
    request = build_text_request(INFO, "héllo", params, stream=True, task_id=7, request_id="r1")
    inputs = _inputs(request)
    assert request.model_name == "tensorrt_llm_bls" and request.id == "r1"
    assert inputs["text_input"] == ("BYTES", [1, 1], encode_bytes(["héllo".encode()]))
    assert inputs["max_tokens"] == ("INT32", [1, 1], np.int32(9).tobytes())
    assert inputs["stream"] == ("BOOL", [1, 1], b"\x01")
    assert inputs["temperature"][2] == np.float32(0.5).tobytes()
    assert inputs["seed"] == ("UINT64", [1, 1], np.uint64(42).tobytes())
    assert inputs["stop_words"][:2] == ("BYTES", [1, 2])
    assert inputs["lora_task_id"] == ("UINT64", [1, 1], np.uint64(7).tobytes())
    assert "lora_weights" not in inputs and "top_p" not in inputs


def test_optional_inputs_only_when_declared() -> None:
    bare = UpstreamModelInfo(name="m", inputs={"text_input": "BYTES", "max_tokens": "INT32"}, batched=False)
    request = build_text_request(
        bare, "x", SamplingParams(max_tokens=1, temperature=1.0), stream=False, task_id=None, request_id=""
    )
    assert set(_inputs(request)) == {"text_input", "max_tokens"}
    assert list(request.inputs[0].shape) == [1]
    with pytest.raises(UnsupportedParameter):
        build_text_request(
            bare, "x", SamplingParams(max_tokens=1, stop=("a",)), stream=False, task_id=None, request_id=""
        )


def _weights(datatype: str = "FP16") -> AdapterWeights:
    return AdapterWeights(b"\x00\x3c" * 8, (1, 2, 4), datatype, np.zeros((1, 2, 3), "<i4").tobytes(), (1, 2, 3), "s")


def test_with_weights_copies_and_checks_dtype() -> None:
    request = build_text_request(INFO, "x", SamplingParams(max_tokens=1), stream=False, task_id=3, request_id="")
    cold = with_weights(request, INFO, _weights())
    assert "lora_weights" not in _inputs(request)
    inputs = _inputs(cold)
    assert inputs["lora_weights"] == ("FP16", [1, 2, 4], b"\x00\x3c" * 8)
    assert inputs["lora_config"][:2] == ("INT32", [1, 2, 3])
    with pytest.raises(WeightsUnavailable, match="engine dtype"):
        with_weights(request, INFO, _weights("BF16"))


def test_set_lora_task_id_replaces_client_lora_inputs() -> None:
    request = service_pb2.ModelInferRequest()
    request.inputs.add(name="text_input", datatype="BYTES", shape=[1, 1])
    request.inputs.add(name="lora_task_id", datatype="UINT64", shape=[1, 1])
    request.raw_input_contents.extend([encode_bytes([b"a"]), np.uint64(1).tobytes()])
    set_lora_task_id(request, INFO, 99)
    assert _inputs(request)["lora_task_id"][2] == np.uint64(99).tobytes() and len(request.inputs) == 2


def test_read_text() -> None:
    response = service_pb2.ModelInferResponse()
    response.outputs.add(name="text_output", datatype="BYTES", shape=[1, 1])
    response.outputs.add(name="num_output_tokens", datatype="INT32", shape=[1, 1])
    response.raw_output_contents.extend([encode_bytes(["ünï".encode()]), np.int32(4).tobytes()])
    piece = read_text(response)
    assert (piece.text, piece.output_tokens, piece.input_tokens) == ("ünï", 4, None)


@pytest.mark.parametrize(
    ("message", "code", "kind", "task_id"),
    [
        (
            "Executor failed process requestId 5 due to the following error: " + MISS_TEXT.format(task_id=12),
            grpc.StatusCode.INTERNAL,
            FailureKind.MISS,
            12,
        ),
        (
            "[TensorRT-LLM][ERROR] Assertion failed: LoRA task 3 not found in cache. Please send",
            None,
            FailureKind.MISS,
            3,
        ),
        (FULL_TEXT, None, FailureKind.CACHE_FULL, None),
        ("PEFT Cache is full. Could not store taskId=4", None, FailureKind.CACHE_FULL, None),
        (
            "Maximum queue size of 64 has been reached, please try again later",
            grpc.StatusCode.INTERNAL,
            FailureKind.QUEUE_FULL,
            None,
        ),
        ("Exceeds maximum queue size", grpc.StatusCode.UNAVAILABLE, FailureKind.QUEUE_FULL, None),
        ("failed to connect to all addresses", grpc.StatusCode.UNAVAILABLE, FailureKind.POD_FAILED, None),
        ("Socket closed", grpc.StatusCode.UNAVAILABLE, FailureKind.POD_FAILED, None),
        ("Request for unknown model: 'x' is not found", grpc.StatusCode.NOT_FOUND, FailureKind.POD_FAILED, None),
        # in a stream (no gRPC code): a server unloading its models after a stub died
        ("Request for unknown model: 'tensorrt_llm_bls' has no available versions", None, FailureKind.POD_FAILED, None),
        ("Request for unknown model: 'tensorrt_llm_bls' version 1 is not at ready state", None,
         FailureKind.POD_FAILED, None),
        ("Deadline Exceeded", grpc.StatusCode.DEADLINE_EXCEEDED, FailureKind.TIMEOUT, None),
        ("unexpected inference input 'foo'", grpc.StatusCode.INVALID_ARGUMENT, FailureKind.INVALID, None),
        (
            "[request id: r] expected number of inputs between 2 and 42 but got 1 inputs for model 'tensorrt_llm_bls'",
            None,
            FailureKind.INVALID,
            None,
        ),
        ("Expected lora weights to be the same data type as base model", None, FailureKind.INVALID, None),
        ("lora module attn_qkv not enabled for this model", grpc.StatusCode.INTERNAL, FailureKind.INVALID, None),
        ("something odd happened", grpc.StatusCode.INTERNAL, FailureKind.INTERNAL, None),
    ],
)
def test_classification(message: str, code: grpc.StatusCode | None, kind: FailureKind, task_id: int | None) -> None:
    failure = classify_upstream_error(message, code)
    assert (failure.kind, failure.task_id) == (kind, task_id)
    assert failure.retry_elsewhere == (kind in (FailureKind.CACHE_FULL, FailureKind.QUEUE_FULL, FailureKind.POD_FAILED))


def test_bytes_and_json_tensors() -> None:
    raw = encode_bytes([b"a", b"", "é".encode()])
    assert decode_bytes(raw) == [b"a", b"", "é".encode()]
    with pytest.raises(MalformedRequest):
        decode_bytes(raw[:-1])
    assert raw_to_json("INT32", json_to_raw("x", "INT32", [2, 2], [[1, 2], [3, 4]])) == [1, 2, 3, 4]
    assert raw_to_json("BYTES", json_to_raw("x", "BYTES", [1], ["hi"])) == ["hi"]
    with pytest.raises(MalformedRequest, match="values for shape"):
        json_to_raw("x", "INT32", [3], [1, 2])
    with pytest.raises(MalformedRequest, match="binary"):
        json_to_raw("x", "FP16", [1], [1.0])


def test_typed_grpc_contents_normalised_to_raw() -> None:
    request = service_pb2.ModelInferRequest()
    tensor = request.inputs.add(name="max_tokens", datatype="INT32", shape=[1, 1])
    tensor.contents.int_contents.append(5)
    text = request.inputs.add(name="text_input", datatype="BYTES", shape=[1, 1])
    text.contents.bytes_contents.append(b"hey")
    normalize_to_raw(request)
    assert list(request.raw_input_contents) == [np.int32(5).tobytes(), encode_bytes([b"hey"])]
    assert not request.inputs[0].HasField("contents")
