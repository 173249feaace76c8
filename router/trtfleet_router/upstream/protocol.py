"""What the router sends to a pod's text-level model and how it reads the answers (pure).

Upstream calls go to the base model's text-level model (``tensorrt_llm_bls`` by default, or the
``ensemble``) over gRPC ``ModelStreamInfer``: ``text_input``, ``max_tokens``, sampling knobs, ``stream``,
``lora_task_id`` always for an adapter, and ``lora_weights``/``lora_config`` as raw tensors only when the
routing decision says the pod does not hold the adapter. Optional inputs are sent only when the
upstream model's config declares them (see :class:`UpstreamModelInfo`).

Upstream failures are classified from TRT-LLM's and Triton's texts (see the facts in
``trtllm-triton.md``): a cache miss (``LoRA task N not found in cache``), a full LoRA cache, a full
queue, an invalid request, or a transport failure of the pod.
"""

from __future__ import annotations

import functools
import re
import struct
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any, Final

import grpc
from tritonclient.grpc import model_config_pb2, service_pb2

from trtfleet_router import jsoncodec
from trtfleet_router.errors import UnsupportedParameter, WeightsUnavailable
from trtfleet_router.upstream.tensors import (
    decode_bytes,
    encode_bytes,
    raw_bool,
    raw_fp32,
    raw_int32,
    raw_uint64,
)
from trtfleet_router.weights import AdapterWeights

LORA_INPUTS: Final = frozenset({"lora_task_id", "lora_weights", "lora_config"})
TEXT_OUTPUT: Final = "text_output"
SSE_DATA: Final = b"data:"
_U32: Final = struct.Struct("<I")
_TEXT_SHAPE: Final = (1, 1)
FINAL_RESPONSE_PARAM: Final = "triton_final_response"
EMPTY_FINAL_PARAM: Final = "triton_enable_empty_final_response"

MISS_RE: Final = re.compile(r"LoRA task (\d+) not found in cache")
CACHE_FULL_RE: Final = re.compile(r"Cache is full|Could not store taskId")
QUEUE_FULL_RE: Final = re.compile(r"Maximum queue size of \d+ has been reached|Exceeds maximum queue size")
POD_BROKEN_RE: Final = re.compile(
    r"Stub process .* is not healthy|stub process .*(?:unhealthy|exited|crashed|died)"
    r"|Failed to (?:initialize|load|connect to) .*stub|Socket closed|failed to connect to all addresses"
    r"|Connection reset by peer|Broken pipe"
    # Triton core's GetModel (core ``src/model_repository_manager/model_lifecycle.cc``): the model is being
    # unloaded or loaded (a server stopping after a stub died, a restart). Inside a stream these come
    # without a gRPC code; the router asks every pod for the same upstream model, so another pod may serve it.
    r"|Request for unknown model|has no available versions|is not at ready state",
    re.IGNORECASE,
)
"""Texts that say the pod (its tritonserver or a Python stub of its models), not the request, is broken."""
INVALID_RE: Final = re.compile(
    r"lora_task_id must be set|Expected lora weights to be the same data type|not enabled for this model"
    r"|has to few values|unexpected inference input|unexpected shape|expected \d+ inputs"
    r"|expected number of inputs|missing required input|input byte size mismatch|unexpected datatype"
    r"|invalid value type for '.*' parameter"
    # TRT-LLM's llmapi model (runtime pytorch with Triton): helpers.py / model.py refusals
    r"|must all be provided together|lora_path does not exist|lora_ckpt_source must be one of"
    r"|text_input is missing|Streaming is only supported in decoupled mode",
    re.IGNORECASE,
)

# Inputs of NVIDIA's BLS model the router may send, used when a pod's config cannot be read yet.
DEFAULT_TEXT_INPUTS: Final[dict[str, str]] = {
    "text_input": "BYTES",
    "max_tokens": "INT32",
    "stream": "BOOL",
    "temperature": "FP32",
    "top_p": "FP32",
    "top_k": "INT32",
    "seed": "UINT64",
    "stop_words": "BYTES",
    "presence_penalty": "FP32",
    "frequency_penalty": "FP32",
    "exclude_input_in_output": "BOOL",
    "lora_task_id": "UINT64",
    "lora_weights": "FP16",
    "lora_config": "INT32",
}


@functools.cache
def triton_datatype(data_type: int) -> str:
    """``model_config_pb2.DataType`` -> the wire datatype (``TYPE_STRING`` -> ``BYTES``)."""
    name = model_config_pb2.DataType.Name(data_type).removeprefix("TYPE_")
    return "BYTES" if name == "STRING" else name


@dataclass(frozen=True, slots=True)
class UpstreamModelInfo:
    """The upstream model's inputs and batching, read from its config (or :data:`DEFAULT_TEXT_INPUTS`)."""

    name: str
    inputs: Mapping[str, str] = field(default_factory=lambda: dict(DEFAULT_TEXT_INPUTS))
    batched: bool = True
    decoupled: bool = True

    @classmethod
    def from_config(cls, config: model_config_pb2.ModelConfig) -> UpstreamModelInfo:
        return cls(
            name=config.name,
            inputs={tensor.name: triton_datatype(tensor.data_type) for tensor in config.input},
            batched=config.max_batch_size > 0,
            decoupled=config.model_transaction_policy.decoupled,
        )

    def shape(self, *dims: int) -> list[int]:
        return [1, *dims] if self.batched else list(dims)


@dataclass(frozen=True, slots=True)
class SamplingParams:
    max_tokens: int
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    seed: int | None = None
    stop: tuple[str, ...] = ()
    presence_penalty: float | None = None
    frequency_penalty: float | None = None


def check_text_params(info: UpstreamModelInfo, params: SamplingParams) -> None:
    """Reject what the model cannot take (what :func:`build_generate_body` would silently drop)."""
    if params.stop and "stop_words" not in info.inputs:
        raise UnsupportedParameter(f"model '{info.name}' does not accept stop sequences", param="stop")


def build_text_request(
    info: UpstreamModelInfo,
    prompt: str,
    params: SamplingParams,
    *,
    stream: bool,
    task_id: int | None,
    request_id: str,
) -> service_pb2.ModelInferRequest:
    """The upstream request for a text prompt (LoRA weights are attached separately)."""
    request = service_pb2.ModelInferRequest(model_name=info.name, id=request_id)
    inputs, raws = request.inputs, request.raw_input_contents
    known = info.inputs

    def add(name: str, datatype: str, raw: bytes, *dims: int) -> None:
        inputs.add(name=name, datatype=datatype, shape=info.shape(*dims))
        raws.append(raw)

    add("text_input", "BYTES", encode_bytes((prompt.encode("utf-8"),)), 1)
    add("max_tokens", "INT32", raw_int32(params.max_tokens), 1)
    if "stream" in known:
        add("stream", "BOOL", raw_bool(stream), 1)
    if "exclude_input_in_output" in known:
        add("exclude_input_in_output", "BOOL", raw_bool(True), 1)
    if params.temperature is not None and "temperature" in known:
        add("temperature", "FP32", raw_fp32(params.temperature), 1)
    if params.top_p is not None and "top_p" in known:
        add("top_p", "FP32", raw_fp32(params.top_p), 1)
    if params.top_k is not None and "top_k" in known:
        add("top_k", "INT32", raw_int32(params.top_k), 1)
    if params.seed is not None and "seed" in known:
        add("seed", "UINT64", raw_uint64(params.seed), 1)
    if params.presence_penalty is not None and "presence_penalty" in known:
        add("presence_penalty", "FP32", raw_fp32(params.presence_penalty), 1)
    if params.frequency_penalty is not None and "frequency_penalty" in known:
        add("frequency_penalty", "FP32", raw_fp32(params.frequency_penalty), 1)
    if params.stop:
        check_text_params(info, params)
        add("stop_words", "BYTES", encode_bytes(s.encode("utf-8") for s in params.stop), len(params.stop))
    if task_id is not None:
        add("lora_task_id", "UINT64", raw_uint64(task_id), 1)
    return request


def build_generate_body(
    info: UpstreamModelInfo, prompt: str, params: SamplingParams, *, stream: bool, task_id: int | None
) -> dict[str, Any]:
    """The same request as :func:`build_text_request` for Triton's HTTP generate extension (JSON keys
    are input names; no weights: those only travel as binary tensors over gRPC)."""
    known = info.inputs
    body: dict[str, Any] = {"text_input": prompt, "max_tokens": params.max_tokens}
    optional: dict[str, Any] = {
        "stream": stream,
        "exclude_input_in_output": True,
        "temperature": params.temperature,
        "top_p": params.top_p,
        "top_k": params.top_k,
        "seed": params.seed,
        "presence_penalty": params.presence_penalty,
        "frequency_penalty": params.frequency_penalty,
        "stop_words": list(params.stop) if params.stop else None,
        "lora_task_id": task_id,
    }
    for name, value in optional.items():
        if value is not None and name in known:
            body[name] = value
    return body


def set_lora_task_id(request: service_pb2.ModelInferRequest, info: UpstreamModelInfo, task_id: int) -> None:
    """Replace any LoRA inputs of a (raw) client request by ``lora_task_id`` (in place)."""
    strip_lora_inputs(request)
    request.inputs.add(name="lora_task_id", datatype="UINT64", shape=info.shape(1))
    request.raw_input_contents.append(raw_uint64(task_id))


def strip_lora_inputs(request: service_pb2.ModelInferRequest) -> None:
    kept = [
        (t, r) for t, r in zip(request.inputs, request.raw_input_contents, strict=True) if t.name not in LORA_INPUTS
    ]
    if len(kept) == len(request.inputs):
        return
    tensors = [service_pb2.ModelInferRequest.InferInputTensor() for _ in kept]
    for copy, (tensor, _) in zip(tensors, kept, strict=True):
        copy.CopyFrom(tensor)
    raws = [raw for _, raw in kept]
    del request.inputs[:]
    del request.raw_input_contents[:]
    request.inputs.extend(tensors)
    request.raw_input_contents.extend(raws)


def check_weights(info: UpstreamModelInfo, weights: AdapterWeights) -> None:
    """Refuse weights the model cannot take (LoRA weights must have the engine dtype)."""
    expected = info.inputs.get("lora_weights")
    if expected is not None and expected != weights.weights_datatype:
        raise WeightsUnavailable(
            f"the adapter's weights are {weights.weights_datatype} but model '{info.name}' "
            f"expects {expected} "
            "(LoRA weights must have the engine dtype)"
        )


def with_weights(
    request: service_pb2.ModelInferRequest, info: UpstreamModelInfo, weights: AdapterWeights
) -> service_pb2.ModelInferRequest:
    """A copy of ``request`` carrying ``lora_weights`` and ``lora_config`` as raw tensors."""
    check_weights(info, weights)
    cold = service_pb2.ModelInferRequest()
    cold.CopyFrom(request)
    weights_shape = list(weights.weights_shape if info.batched else weights.weights_shape[1:])
    config_shape = list(weights.config_shape if info.batched else weights.config_shape[1:])
    cold.inputs.add(name="lora_weights", datatype=weights.weights_datatype, shape=weights_shape)
    cold.raw_input_contents.append(weights.weights_raw)
    cold.inputs.add(name="lora_config", datatype="INT32", shape=config_shape)
    cold.raw_input_contents.append(weights.config_raw)
    return cold


def request_stream_final_flag(request: service_pb2.ModelInferRequest) -> None:
    """Ask Triton to always flag the last stream response (``triton_final_response``)."""
    request.parameters[EMPTY_FINAL_PARAM].bool_param = True


def text_message(text: str, *, final: bool, request_id: str = "") -> service_pb2.ModelStreamInferResponse:
    message = service_pb2.ModelStreamInferResponse()
    response = message.infer_response  # filled in place (no copy of a separately built response)
    if request_id:
        response.id = request_id
    response.outputs.add(name="text_output", datatype="BYTES", shape=_TEXT_SHAPE)
    data = text.encode("utf-8")
    response.raw_output_contents.append(_U32.pack(len(data)) + data)  # one BYTES element, as encode_bytes
    response.parameters[FINAL_RESPONSE_PARAM].bool_param = final
    return message


AnswerReader = Callable[[Mapping[str, Any], bool], service_pb2.ModelStreamInferResponse]
"""(one generate answer or SSE event as JSON, final) -> the response message with its outputs."""


def text_answer(doc: Mapping[str, Any], final: bool) -> service_pb2.ModelStreamInferResponse:
    """The default reader: ``text_output`` only (what the text front ends need)."""
    return text_message(str(doc.get("text_output", "")), final=final)


def error_text(body: bytes) -> str:
    """The message of an error answer: Triton's ``{"error": str}``, OpenAI's ``{"error": {"message"}}`` or
    trtllm-serve's ``ErrorResponse {"message"}`` (else the body's first 1,000 characters)."""
    try:
        doc = jsoncodec.loads(body)
    except ValueError:
        return body.decode("utf-8", errors="replace")[:1000]
    if isinstance(doc, dict):
        error = doc.get("error", doc)
        if isinstance(error, dict):
            error = error.get("message", error)
        if error is not None:
            return str(error)
    return body.decode("utf-8", errors="replace")[:1000]


def is_final(response: service_pb2.ModelInferResponse) -> bool:
    param = response.parameters.get(FINAL_RESPONSE_PARAM)
    return param is not None and param.bool_param


def has_outputs(response: service_pb2.ModelInferResponse) -> bool:
    return len(response.outputs) > 0


@dataclass(frozen=True, slots=True)
class TextPiece:
    """What one upstream response says: new text, and the engine's token counts when it returns them."""

    text: str
    output_tokens: int | None = None
    input_tokens: int | None = None


def read_text(response: service_pb2.ModelInferResponse) -> TextPiece:
    text, out_tokens, in_tokens = "", None, None
    raws = response.raw_output_contents
    for index, tensor in enumerate(response.outputs):
        if tensor.name == TEXT_OUTPUT:
            raw = raws[index] if index < len(raws) else encode_bytes(tensor.contents.bytes_contents)
            text = b"".join(decode_bytes(raw)).decode("utf-8", errors="replace")
        elif tensor.name == "num_output_tokens" and index < len(raws) and len(raws[index]) >= 4:
            out_tokens = int.from_bytes(raws[index][:4], "little", signed=True)
        elif tensor.name == "num_input_tokens" and index < len(raws) and len(raws[index]) >= 4:
            in_tokens = int.from_bytes(raws[index][:4], "little", signed=True)
    return TextPiece(text, out_tokens, in_tokens)


# -- upstream failures ----------------------------------------------------------------------------------


class FailureKind(StrEnum):
    MISS = "miss"
    CACHE_FULL = "cache_full"
    QUEUE_FULL = "queue_full"
    INVALID = "invalid"
    POD_FAILED = "pod_failed"  # the pod is broken (connection refused or reset, dead stub)
    STALLED = "stalled"  # the pod sent nothing within the first-token or inter-token timeout
    TIMEOUT = "timeout"  # the request's own deadline passed
    INTERNAL = "internal"  # an error of unknown cause: neither retried nor held against the pod


@dataclass(frozen=True, slots=True)
class UpstreamFailure:
    kind: FailureKind
    message: str
    task_id: int | None = None

    @property
    def retry_elsewhere(self) -> bool:
        return self.kind in _RETRY_ELSEWHERE

    @property
    def blames_pod(self) -> bool:
        """The failure counts against the pod (outlier detection); request errors never do."""
        return self.kind in _BLAMES_POD


_RETRY_ELSEWHERE: Final = frozenset(
    {FailureKind.CACHE_FULL, FailureKind.QUEUE_FULL, FailureKind.POD_FAILED, FailureKind.STALLED}
)
_BLAMES_POD: Final = frozenset({FailureKind.POD_FAILED, FailureKind.STALLED})


_POD_FAILED_CODES: Final = frozenset(
    {
        grpc.StatusCode.UNAVAILABLE,
        grpc.StatusCode.CANCELLED,
        grpc.StatusCode.ABORTED,
        grpc.StatusCode.UNKNOWN,
        grpc.StatusCode.NOT_FOUND,
        grpc.StatusCode.UNIMPLEMENTED,
    }
)


def classify_upstream_error(message: str, code: grpc.StatusCode | None = None) -> UpstreamFailure:
    """Classify an upstream error from its text (and gRPC status code when it ended the call).

    Texts win over codes: TRT-LLM reports misses and a full queue as INTERNAL, Triton's own queue
    limit as UNAVAILABLE. NOT_FOUND/UNIMPLEMENTED mean the pod does not serve the model (yet): another
    pod may. A dead Python stub is reported by Triton as an error *answer* (``Stub process
    '<model>_0_0' is not healthy.``, python_backend ``src/python_be.cc``): a pod failure, not a request
    error. Invalid-request texts are checked first, so a request error is never held against a pod.
    """
    miss = MISS_RE.search(message)
    if miss:
        return UpstreamFailure(FailureKind.MISS, message, int(miss.group(1)))
    if CACHE_FULL_RE.search(message):
        return UpstreamFailure(FailureKind.CACHE_FULL, message)
    if QUEUE_FULL_RE.search(message):
        return UpstreamFailure(FailureKind.QUEUE_FULL, message)
    if code is grpc.StatusCode.DEADLINE_EXCEEDED:
        return UpstreamFailure(FailureKind.TIMEOUT, message)
    if code is grpc.StatusCode.INVALID_ARGUMENT or INVALID_RE.search(message):
        return UpstreamFailure(FailureKind.INVALID, message)
    if POD_BROKEN_RE.search(message):
        return UpstreamFailure(FailureKind.POD_FAILED, message)
    if code in _POD_FAILED_CODES:
        return UpstreamFailure(FailureKind.POD_FAILED, message)
    if code is grpc.StatusCode.RESOURCE_EXHAUSTED:
        return UpstreamFailure(FailureKind.QUEUE_FULL, message)
    return UpstreamFailure(FailureKind.INTERNAL, message)
