"""The ``pytorch`` upstream served by Triton: TRT-LLM's Python-backend ``llmapi`` model ``tensorrt_llm`` (pure).

A base model with ``runtime: pytorch`` and ``serving.server: triton`` runs tritonserver with the llmapi model
(``triton_backend/all_models/llmapi/tensorrt_llm``; contract and commits in docs/design/pytorch-backend.md). The
router sends it one prompt per request over gRPC ``ModelStreamInfer`` (shape ``[1]``: ``max_batch_size`` 0):
``text_input``, ``streaming``, ``sampling_param_max_tokens`` / ``temperature`` / ``top_p`` / ``top_k`` /
``seed`` / ``stop`` / penalties, ``sampling_param_exclude_input_from_output`` **true** (the model's default is
false: the prompt would head the text), and for an adapter ``lora_id`` (the task id, the pod's cache key),
``lora_name`` (the served name) and ``lora_path`` (the staged PEFT directory the pod reads on a miss). No
weights travel: a cold adapter costs the pod's read, never an error, and there is no miss recovery.

Answers: every streamed response carries the whole text so far (upstream sends ``CompletionOutput.text``);
:class:`CumulativeText` turns them into the deltas the front ends expect. Refusals come back as error
responses "Error generating request: <text>"; those that are the request's (partial LoRA inputs, a
``lora_path`` the pod cannot see) are in :data:`~trtfleet_router.upstream.protocol.INVALID_RE`.
"""

from __future__ import annotations

from collections.abc import Callable

from tritonclient.grpc import service_pb2

from trtfleet_router.models_registry import LLMAPI_UPSTREAM_MODEL, AdapterEntry
from trtfleet_router.upstream.protocol import SamplingParams, TextPiece, read_text
from trtfleet_router.upstream.tensors import encode_bytes, raw_bool, raw_fp32, raw_int32, raw_uint64


def build_llmapi_request(
    prompt: str,
    params: SamplingParams,
    *,
    stream: bool,
    adapter: AdapterEntry | None,
    request_id: str,
    model: str = LLMAPI_UPSTREAM_MODEL,
) -> service_pb2.ModelInferRequest:
    """The llmapi model's request for a text prompt (and an adapter the pod reads from its ``lora_path``)."""
    request = service_pb2.ModelInferRequest(model_name=model, id=request_id)

    def add(name: str, datatype: str, raw: bytes, count: int = 1) -> None:
        request.inputs.add(name=name, datatype=datatype, shape=[count])
        request.raw_input_contents.append(raw)

    def text(name: str, *values: str) -> None:
        add(name, "BYTES", encode_bytes(v.encode("utf-8") for v in values), len(values))

    text("text_input", prompt)
    add("streaming", "BOOL", raw_bool(stream))
    add("sampling_param_max_tokens", "INT32", raw_int32(params.max_tokens))
    add("sampling_param_exclude_input_from_output", "BOOL", raw_bool(True))
    optional: tuple[tuple[str, str, float | int | None, Callable[..., bytes]], ...] = (
        ("sampling_param_temperature", "FP32", params.temperature, raw_fp32),
        ("sampling_param_top_p", "FP32", params.top_p, raw_fp32),
        ("sampling_param_top_k", "INT32", params.top_k, raw_int32),
        ("sampling_param_seed", "UINT64", params.seed, raw_uint64),
        ("sampling_param_presence_penalty", "FP32", params.presence_penalty, raw_fp32),
        ("sampling_param_frequency_penalty", "FP32", params.frequency_penalty, raw_fp32),
    )
    for name, datatype, value, encode in optional:
        if value is not None:
            add(name, datatype, encode(value))
    if params.stop:
        text("sampling_param_stop", *params.stop)
    if adapter is not None:
        add("lora_id", "UINT64", raw_uint64(adapter.task_id))
        text("lora_name", adapter.served_name)
        text("lora_path", adapter.lora_path)
    return request


class CumulativeText:
    """One request's answers as deltas: each llmapi response holds the whole text so far."""

    def __init__(self) -> None:
        self.seen = ""

    def read(self, response: service_pb2.ModelInferResponse) -> TextPiece:
        whole = read_text(response).text
        common = len(self.seen) if whole.startswith(self.seen) else _common_prefix(self.seen, whole)
        self.seen = whole
        return TextPiece(whole[common:])


def _common_prefix(a: str, b: str) -> int:
    size = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        size += 1
    return size
