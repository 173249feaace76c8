"""Triton's HTTP/JSON forms <-> the gRPC protobufs the router forwards upstream (pure).

* ``/infer``: KServe v2 JSON with optional binary tensors after a JSON header of
  ``Inference-Header-Content-Length`` bytes, both ways (:func:`parse_infer_request`,
  :func:`encode_infer_response`).
* ``/generate`` and ``/generate_stream``: top-level JSON keys are input names, typed by the upstream
  model's config; ``parameters`` become request parameters (:func:`parse_generate_request`); outputs
  come back as flat JSON keys, single elements as scalars (:func:`generate_output_json`).
* metadata and config under the served name the client asked for: :mod:`.triton_models`.
* :func:`merge_responses`: the one answer for a unary call when the upstream model streamed several
  (``BYTES`` outputs concatenated element-wise, other outputs from the last response).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final

from tritonclient.grpc import model_config_pb2, service_pb2

from trtfleet_router import jsoncodec
from trtfleet_router.errors import MalformedRequest
from trtfleet_router.upstream.protocol import FINAL_RESPONSE_PARAM, AnswerReader, triton_datatype
from trtfleet_router.upstream.tensors import decode_bytes, encode_bytes, json_to_raw, raw_to_json

HEADER_LENGTH = "Inference-Header-Content-Length"
RESERVED_GENERATE_KEYS = frozenset({"parameters", "id"})
INT64_RANGE: Final = range(-(2**63), 2**63)


def _set_parameter(target: Any, key: str, value: Any) -> None:
    """One request parameter from JSON; integers as ``int64_param`` (Triton takes no unsigned ones)."""
    param = target[key]
    if isinstance(value, bool):
        param.bool_param = value
    elif isinstance(value, int):
        if value not in INT64_RANGE:
            raise MalformedRequest(f"parameter '{key}' must fit a 64-bit signed integer")
        param.int64_param = value
    elif isinstance(value, float):
        param.double_param = value
    elif isinstance(value, str):
        param.string_param = value
    else:
        raise MalformedRequest(f"parameter '{key}' must be a boolean, number or string")


def parameter_value(param: service_pb2.InferParameter) -> Any:
    which = param.WhichOneof("parameter_choice")
    return getattr(param, which) if which else None


@dataclass(frozen=True, slots=True)
class OutputChoice:
    """Which outputs the client wants and which of them as binary data."""

    names: tuple[str, ...]  # empty: all
    binary: frozenset[str]
    binary_default: bool


def parse_infer_request(body: bytes, header_length: int | None) -> tuple[service_pb2.ModelInferRequest, OutputChoice]:
    """A KServe v2 infer body -> a raw-contents ``ModelInferRequest`` (model name left empty)."""
    if header_length is not None and not 0 < header_length <= len(body):
        raise MalformedRequest(f"{HEADER_LENGTH} {header_length} does not fit a body of {len(body)} bytes")
    head, binary = (body[:header_length], body[header_length:]) if header_length else (body, b"")
    try:
        doc = jsoncodec.loads(head)
    except (ValueError, UnicodeDecodeError) as exc:
        raise MalformedRequest(f"the inference request header is not valid JSON: {exc}") from exc
    if not isinstance(doc, dict) or not isinstance(doc.get("inputs"), list):
        raise MalformedRequest("the inference request must be an object with an 'inputs' list")
    request = service_pb2.ModelInferRequest(id=str(doc.get("id", "")))
    params = doc.get("parameters") or {}
    if not isinstance(params, dict):
        raise MalformedRequest("'parameters' must be an object")
    binary_default = bool(params.get("binary_data_output", False))
    for key, value in params.items():
        if key != "binary_data_output":
            _set_parameter(request.parameters, key, value)
    offset = 0
    for item in doc["inputs"]:
        name, datatype, shape = _tensor_head(item)
        size = (item.get("parameters") or {}).get("binary_data_size")
        if size is not None:
            if not isinstance(size, int) or size < 0 or offset + size > len(binary):
                raise MalformedRequest(f"input '{name}': binary_data_size {size} exceeds the binary data")
            raw = binary[offset : offset + size]
            offset += size
        elif "data" in item:
            raw = json_to_raw(name, datatype, shape, item["data"])
        else:
            raise MalformedRequest(f"input '{name}' has neither 'data' nor 'binary_data_size'")
        request.inputs.add(name=name, datatype=datatype, shape=shape)
        request.raw_input_contents.append(raw)
    if offset != len(binary):
        raise MalformedRequest(f"{len(binary) - offset} bytes of binary data belong to no input")
    names, wanted_binary = [], set()
    for item in doc.get("outputs") or []:
        if not isinstance(item, dict) or not isinstance(item.get("name"), str):
            raise MalformedRequest("every requested output needs a 'name'")
        names.append(item["name"])
        request.outputs.add(name=item["name"])
        if (item.get("parameters") or {}).get("binary_data", binary_default):
            wanted_binary.add(item["name"])
    return request, OutputChoice(tuple(names), frozenset(wanted_binary), binary_default)


def _tensor_head(item: Any) -> tuple[str, str, list[int]]:
    if not isinstance(item, dict):
        raise MalformedRequest("every input must be an object")
    name, datatype, shape = item.get("name"), item.get("datatype"), item.get("shape")
    if not isinstance(name, str) or not isinstance(datatype, str) or not isinstance(shape, list):
        raise MalformedRequest("every input needs 'name', 'datatype' and 'shape'")
    if not all(isinstance(d, int) and not isinstance(d, bool) and d >= 0 for d in shape):
        raise MalformedRequest(f"input '{name}': shape must be a list of non-negative integers")
    return name, datatype, shape


def encode_infer_response(
    response: service_pb2.ModelInferResponse, choice: OutputChoice, model_name: str
) -> tuple[bytes, int | None]:
    """A ``ModelInferResponse`` -> (body, JSON header length when binary outputs follow)."""
    outputs_json, binaries = [], []
    raws = response.raw_output_contents
    for index, tensor in enumerate(response.outputs):
        if choice.names and tensor.name not in choice.names:
            continue
        raw = raws[index] if index < len(raws) else b""
        item: dict[str, Any] = {"name": tensor.name, "datatype": tensor.datatype, "shape": list(tensor.shape)}
        if tensor.name in choice.binary or (not choice.names and choice.binary_default):
            item["parameters"] = {"binary_data_size": len(raw)}
            binaries.append(raw)
        else:
            item["data"] = raw_to_json(tensor.datatype, raw)
        outputs_json.append(item)
    doc: dict[str, Any] = {
        "model_name": model_name,
        "model_version": response.model_version or "1",
        "outputs": outputs_json,
    }
    if response.id:
        doc["id"] = response.id
    header = jsoncodec.dumps(doc)
    if not binaries:
        return header, None
    return header + b"".join(binaries), len(header)


def parse_generate_request(doc: Any, config: model_config_pb2.ModelConfig) -> service_pb2.ModelInferRequest:
    """Triton's generate JSON -> a raw-contents request for the upstream model."""
    if not isinstance(doc, dict):
        raise MalformedRequest("the generate request body must be a JSON object")
    declared = config_view(config).inputs
    batched = config.max_batch_size > 0
    request = service_pb2.ModelInferRequest(id=str(doc.get("id", "")))
    params = doc.get("parameters") or {}
    if not isinstance(params, dict):
        raise MalformedRequest("'parameters' must be an object")
    for key, value in params.items():
        _set_parameter(request.parameters, key, value)
    for name, value in doc.items():
        if name in RESERVED_GENERATE_KEYS:
            continue
        spec = declared.get(name)
        if spec is None:
            raise MalformedRequest(f"unexpected inference input '{name}' for model '{config.name}'")
        datatype = spec.datatype
        values = value if isinstance(value, list) else [value]
        shape = [len(values)] if spec.variable or len(values) != 1 else [1] * spec.rank
        if not shape:
            shape = [1]
        if batched:
            shape = [1, *shape]
        request.inputs.add(name=name, datatype=datatype, shape=shape)
        request.raw_input_contents.append(json_to_raw(name, datatype, shape, values))
    return request


JSON_UNSAFE_DATATYPES = frozenset({"FP16", "BF16"})


def generate_answer_reader(config: model_config_pb2.ModelConfig, *, shaped: bool = False) -> AnswerReader | None:
    """How to read the pod's generate JSON (an answer or one SSE event) back into a response with every
    output the model declares, so a request can travel over HTTP and still answer as over gRPC. None
    when an output type cannot travel as JSON (FP16/BF16): those stay on gRPC.

    Generate JSON has no shapes. ``shaped``: give each output the shape Triton gives it over gRPC for a
    batch of one (``[1, *dims]`` for a batching model, the one variable dimension taking the count);
    without it, ``[count]`` (enough for generate answers, which have no shapes either)."""
    outputs = {tensor.name: (triton_datatype(tensor.data_type), list(tensor.dims)) for tensor in config.output}
    if JSON_UNSAFE_DATATYPES & {datatype for datatype, _ in outputs.values()}:
        return None
    batched = config.max_batch_size > 0

    def shape_of(dims: list[int], count: int) -> list[int]:
        if not shaped:
            return [count]
        fixed = math.prod(d for d in dims if d >= 0)
        variable = [i for i, d in enumerate(dims) if d < 0]
        if len(variable) == 1 and fixed > 0 and count % fixed == 0:
            dims = [count // fixed if d < 0 else d for d in dims]
        elif variable or fixed != count:
            dims = [count]  # not reconstructible from the JSON: flat
        return [1, *dims] if batched else dims or [count]

    def read(doc: Mapping[str, Any], final: bool) -> service_pb2.ModelStreamInferResponse:
        message = service_pb2.ModelStreamInferResponse()
        response = message.infer_response
        for name, value in doc.items():
            declared = outputs.get(name)
            if declared is None:
                continue  # model_name, model_version, id, parameters
            datatype, dims = declared
            count = len(value) if isinstance(value, list) else 1
            shape = shape_of(dims, count)
            response.outputs.add(name=name, datatype=datatype, shape=shape)
            response.raw_output_contents.append(json_to_raw(name, datatype, shape, value))
        response.parameters[FINAL_RESPONSE_PARAM].bool_param = final
        return message

    return read


@dataclass(frozen=True, slots=True)
class DeclaredInput:
    """What :func:`generate_body_for_tensors` needs of one input of a model config."""

    datatype: str  # wire datatype
    variable: bool  # a dimension is -1
    rank: int


def declared_inputs(config: model_config_pb2.ModelConfig) -> dict[str, DeclaredInput]:
    return {
        tensor.name: DeclaredInput(triton_datatype(tensor.data_type), any(d < 0 for d in tensor.dims), len(tensor.dims))
        for tensor in config.input
    }


@dataclass(frozen=True, slots=True)
class ConfigView:
    """What the front ends derive from a model config, once per config object (configs are cached per
    base model by :class:`~trtfleet_router.upstream.modelinfo.ModelInfoCache`)."""

    config: model_config_pb2.ModelConfig
    inputs: dict[str, DeclaredInput]
    reader: AnswerReader | None  # generate_answer_reader(config)
    shaped_reader: AnswerReader | None  # generate_answer_reader(config, shaped=True)
    required_inputs: tuple[str, ...] = ()  # inputs not marked optional
    outputs: frozenset[str] = frozenset()


_VIEWS_MAX = 64
_VIEWS: dict[int, ConfigView] = {}


def config_view(config: model_config_pb2.ModelConfig) -> ConfigView:
    view = _VIEWS.get(id(config))
    if view is None or view.config is not config:  # ids of collected configs get reused
        if len(_VIEWS) >= _VIEWS_MAX:
            _VIEWS.clear()
        view = ConfigView(
            config,
            declared_inputs(config),
            generate_answer_reader(config),
            generate_answer_reader(config, shaped=True),
            tuple(tensor.name for tensor in config.input if not tensor.optional),
            frozenset(tensor.name for tensor in config.output),
        )
        _VIEWS[id(config)] = view
    return view


def generate_body_for_tensors(
    request: service_pb2.ModelInferRequest, config: model_config_pb2.ModelConfig, *, streaming: bool
) -> dict[str, Any] | None:
    """The same request as Triton generate JSON, or None when it cannot travel that way unchanged: a
    batch of more than one, an input the config does not declare or types differently, FP16/BF16, bytes
    that are not UTF-8, a shape other than the one generate rebuilds from JSON, an output asked for with
    a ``return_*`` flag (logits and statistics: their shapes are lost in JSON), or ``stream`` set on a
    unary call (its responses are merged from a stream, which only gRPC carries)."""
    declared = config_view(config).inputs
    batched = config.max_batch_size > 0
    body: dict[str, Any] = {}
    for tensor, raw in zip(request.inputs, request.raw_input_contents, strict=True):
        spec = declared.get(tensor.name)
        datatype = tensor.datatype
        if spec is None or datatype in JSON_UNSAFE_DATATYPES or datatype != spec.datatype:
            return None
        shape = list(tensor.shape)
        if batched:
            if not shape or shape[0] != 1:
                return None
            shape = shape[1:]
        if datatype == "BYTES":
            try:
                values: list[Any] = [item.decode("utf-8") for item in decode_bytes(raw)]
            except UnicodeDecodeError:
                return None
        else:
            values = raw_to_json(datatype, raw)
        rebuilt = [len(values)] if spec.variable or len(values) != 1 else [1] * spec.rank
        if shape != (rebuilt or [1]):
            return None
        if tensor.name.startswith("return_") and any(values):
            return None
        body[tensor.name] = values[0] if len(values) == 1 else values  # scalars, as generate clients send
    if body.get("stream") and not streaming:
        return None
    if request.parameters:
        body["parameters"] = {key: parameter_value(value) for key, value in request.parameters.items()}
    if request.id:
        body["id"] = request.id
    return body


def generate_http_body(doc: Mapping[str, Any], task_id: int | None) -> dict[str, Any]:
    """The client's generate JSON for the upstream model: ``lora_task_id`` is the adapter's (or gone)."""
    body = {name: value for name, value in doc.items() if name != "lora_task_id"}
    if task_id is not None:
        body["lora_task_id"] = task_id
    return body


def generate_output_json(response: service_pb2.ModelInferResponse, model_name: str) -> dict[str, Any]:
    doc: dict[str, Any] = {"model_name": model_name, "model_version": response.model_version or "1"}
    if response.id:
        doc["id"] = response.id
    raws = response.raw_output_contents
    for index, tensor in enumerate(response.outputs):
        values = raw_to_json(tensor.datatype, raws[index] if index < len(raws) else b"")
        doc[tensor.name] = values[0] if len(values) == 1 else values
    return doc


def merge_responses(responses: Sequence[service_pb2.ModelInferResponse]) -> service_pb2.ModelInferResponse:
    if len(responses) == 1:
        return responses[0]
    merged = service_pb2.ModelInferResponse()
    if not responses:
        return merged
    merged.CopyFrom(responses[-1])
    for index, tensor in enumerate(merged.outputs):
        if tensor.datatype != "BYTES" or index >= len(merged.raw_output_contents):
            continue
        parts: list[list[bytes]] = []
        for response in responses:
            for j, other in enumerate(response.outputs):
                if other.name == tensor.name and j < len(response.raw_output_contents):
                    parts.append(decode_bytes(response.raw_output_contents[j]))
        width = max(len(p) for p in parts)
        joined = [b"".join(p[k] for p in parts if k < len(p)) for k in range(width)]
        merged.raw_output_contents[index] = encode_bytes(joined)
    return merged


def requested_parameters(request: service_pb2.ModelInferRequest) -> Mapping[str, Any]:
    return {key: parameter_value(value) for key, value in request.parameters.items()}
