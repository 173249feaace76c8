"""The Triton llmapi upstream of a ``pytorch`` base model: request tensors, cumulative answers, registry, errors."""

from __future__ import annotations

import struct
from typing import Any

import pytest
from tritonclient.grpc import service_pb2
from trtfleet_router.discovery.static import BaseModelConfig, base_entry
from trtfleet_router.models_registry import AdapterEntry, base_entry_from_spec
from trtfleet_router.upstream.llmapi_upstream import CumulativeText, build_llmapi_request
from trtfleet_router.upstream.protocol import FailureKind, SamplingParams, classify_upstream_error
from trtfleet_router.upstream.tensors import decode_bytes, encode_bytes

from trtfleet.api import BaseModelSpec

ADAPTER = AdapterEntry("tiny-upper", "tiny", 11, "/artifacts/upper", lora_path="/artifacts/upper-peft")
DECODE = {
    "BYTES": lambda raw: [b.decode() for b in decode_bytes(raw)],
    "BOOL": lambda raw: [bool(b) for b in raw],
    "INT32": lambda raw: list(struct.unpack(f"<{len(raw) // 4}i", raw)),
    "UINT64": lambda raw: list(struct.unpack(f"<{len(raw) // 8}Q", raw)),
    "FP32": lambda raw: [round(v, 6) for v in struct.unpack(f"<{len(raw) // 4}f", raw)],
}


def tensors(request: service_pb2.ModelInferRequest) -> dict[str, tuple[str, list[int], list[Any]]]:
    return {
        t.name: (t.datatype, list(t.shape), DECODE[t.datatype](raw))
        for t, raw in zip(request.inputs, request.raw_input_contents, strict=True)
    }


def test_base_model_request_carries_text_sampling_and_no_lora() -> None:
    params = SamplingParams(max_tokens=16, temperature=0.0, top_k=1, seed=7, stop=("\n", "END"))
    request = build_llmapi_request("hi", params, stream=True, adapter=None, request_id="r1")
    assert (request.model_name, request.id) == ("tensorrt_llm", "r1")
    assert tensors(request) == {
        "text_input": ("BYTES", [1], ["hi"]),
        "streaming": ("BOOL", [1], [True]),
        "sampling_param_max_tokens": ("INT32", [1], [16]),
        "sampling_param_exclude_input_from_output": ("BOOL", [1], [True]),
        "sampling_param_temperature": ("FP32", [1], [0.0]),
        "sampling_param_top_k": ("INT32", [1], [1]),
        "sampling_param_seed": ("UINT64", [1], [7]),
        "sampling_param_stop": ("BYTES", [2], ["\n", "END"]),
    }


def test_adapter_request_names_id_name_and_path_and_sends_no_weights() -> None:
    request = build_llmapi_request("hi", SamplingParams(max_tokens=4), stream=False, adapter=ADAPTER, request_id="r")
    got = tensors(request)
    assert got["lora_id"] == ("UINT64", [1], [11])
    assert got["lora_name"] == ("BYTES", [1], ["tiny-upper"])
    assert got["lora_path"] == ("BYTES", [1], ["/artifacts/upper-peft"])
    assert not {"lora_task_id", "lora_weights", "lora_config"} & set(got)


def answer(text: str) -> service_pb2.ModelInferResponse:
    response = service_pb2.ModelInferResponse()
    response.outputs.add(name="text_output", datatype="BYTES", shape=[1])
    response.raw_output_contents.append(encode_bytes([text.encode()]))
    return response


@pytest.mark.parametrize(
    ("answers", "deltas"),
    [
        pytest.param(["h", "he", "hello"], ["h", "e", "llo"], id="growing"),
        pytest.param(["hello"], ["hello"], id="one-answer"),
        pytest.param(["ab", "ab", "abc"], ["ab", "", "c"], id="repeated"),
        pytest.param(["abc", "abX"], ["abc", "X"], id="not-a-prefix"),
    ],
)
def test_cumulative_answers_become_deltas(answers: list[str], deltas: list[str]) -> None:
    reader = CumulativeText()
    assert [reader.read(answer(a)).text for a in answers] == deltas


SPEC = {"source": {"uri": "hf://org/m"}, "architecture": "llama", "runtime": "pytorch"}


@pytest.mark.parametrize(
    ("server", "llmapi", "openai", "upstream"),
    [(None, False, True, "tensorrt_llm_bls"), ("trtllm-serve", False, True, "tensorrt_llm_bls"),
     ("triton", True, False, "tensorrt_llm")],
)
def test_registry_entry_follows_serving_server(server: str | None, llmapi: bool, openai: bool, upstream: str) -> None:
    serving = {} if server is None else {"server": server}
    entry = base_entry_from_spec("m", BaseModelSpec.model_validate({**SPEC, "serving": serving}))
    assert (entry.serves_llmapi, entry.serves_openai, entry.upstream_model) == (llmapi, openai, upstream)
    assert entry.batched is not llmapi


def test_fleet_file_without_spec_takes_runtime_and_server() -> None:
    entry = base_entry(BaseModelConfig.model_validate({"name": "tiny", "runtime": "pytorch", "server": "triton"}))
    assert entry.serves_llmapi and entry.upstream_model == "tensorrt_llm" and not entry.batched


@pytest.mark.parametrize(
    "text",
    [
        "Error generating request: lora_id, lora_name, and lora_path must all be provided together",
        "Error generating request: lora_path does not exist on the Triton server's filesystem: /x",
        "Error generating request: Streaming is only supported in decoupled mode.",
    ],
)
def test_llmapi_refusals_are_the_requests(text: str) -> None:
    assert classify_upstream_error(text).kind is FailureKind.INVALID
