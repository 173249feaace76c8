"""Tensor-level requests (Triton infer/generate over HTTP, ModelInfer/ModelStreamInfer over gRPC)
-> an :class:`~trtfleet_router.upstream.call.UpstreamCall` for the base model's upstream model.

The client addresses a base model or an adapter by its served name. For an adapter the router sets
``lora_task_id``; a client that names the base model may instead send ``lora_task_id`` of a served
adapter itself. ``lora_weights``/``lora_config`` from clients are refused: the router owns the weights.
The prompt length and ``max_tokens`` are checked when the request has ``text_input``/``max_tokens``;
required inputs and requested outputs are checked against the upstream model's config.
"""

from __future__ import annotations

import time
from typing import Final

from tritonclient.grpc import service_pb2

from trtfleet_router.errors import MalformedRequest, UnsupportedParameter
from trtfleet_router.models_registry import Target
from trtfleet_router.routing.prefix import NO_BLOCKS
from trtfleet_router.server.common import Services
from trtfleet_router.server.triton_protocol import ConfigView, config_view, generate_body_for_tensors
from trtfleet_router.upstream.call import UpstreamCall
from trtfleet_router.upstream.payload import GenerateJson, TritonTensorPayload
from trtfleet_router.upstream.protocol import set_lora_task_id, strip_lora_inputs
from trtfleet_router.upstream.tensors import decode_bytes, normalize_to_raw

CLIENT_WEIGHT_INPUTS: Final = frozenset({"lora_weights", "lora_config"})


def _inputs_of(request: service_pb2.ModelInferRequest) -> dict[str, tuple[str, bytes]]:
    """Input name -> (datatype, raw bytes), read once (raw contents: after :func:`normalize_to_raw`)."""
    return {
        tensor.name: (tensor.datatype, raw)
        for tensor, raw in zip(request.inputs, request.raw_input_contents, strict=True)
    }


_INT_WIDTHS: Final = {"INT32": (4, True), "INT64": (8, True), "UINT32": (4, False), "UINT64": (8, False)}


def _int_of(inputs: dict[str, tuple[str, bytes]], name: str) -> int | None:
    found = inputs.get(name)
    if found is None:
        return None
    datatype, raw = found
    width_signed = _INT_WIDTHS.get(datatype)
    if width_signed is None or len(raw) < width_signed[0]:
        raise MalformedRequest(f"input '{name}' must be an integer scalar")
    width, signed = width_signed
    return int.from_bytes(raw[:width], "little", signed=signed)


def _bool_of(inputs: dict[str, tuple[str, bytes]], name: str) -> bool:
    found = inputs.get(name)
    return found is not None and found[0] == "BOOL" and found[1][:1] == b"\x01"


def prompt_text(inputs: dict[str, tuple[str, bytes]]) -> str | None:
    found = inputs.get("text_input")
    if found is None or found[0] != "BYTES":
        return None
    return b"".join(decode_bytes(found[1])).decode("utf-8", errors="replace")


async def prepare_tensor_call(
    services: Services,
    request: service_pb2.ModelInferRequest,
    served_name: str,
    api_key: str | None,
    request_id: str,
    *,
    client_streaming: bool = False,
    fairness_id: str | None = None,
    objective: str | None = None,
) -> tuple[Target, UpstreamCall]:
    """Resolve, check and rewrite ``request`` (in place) for the upstream model; ``fairness_id`` and ``objective``: a
    gateway's headers (the tenant and the InferenceObjective)."""
    target = services.resolve(served_name, api_key)
    normalize_to_raw(request)
    inputs = _inputs_of(request)  # the LoRA rewrite below touches only lora_* inputs
    if not CLIENT_WEIGHT_INPUTS.isdisjoint(inputs):
        raise UnsupportedParameter(
            "lora_weights/lora_config cannot be sent through the router: register the adapter and use its served name",
            param="lora_weights",
        )
    task_id = _int_of(inputs, "lora_task_id")
    if task_id is not None:
        if target.adapter is None:
            adapter = services.fleets.registry.adapter_by_task(target.base.name, task_id)
            if services.api_keys is not None:
                services.api_keys.authorize(api_key, adapter.served_name)
            target = Target(target.base, adapter)
        elif target.adapter.task_id != task_id:
            raise MalformedRequest(
                f"lora_task_id {task_id} does not belong to adapter '{served_name}'", param="lora_task_id"
            )
    base = target.base
    info = await services.model_info.info(base)
    check_against_config(request, config_view(await services.model_info.config(base)), served_name)
    request.model_name = info.name
    request.model_version = ""
    if target.adapter is not None:
        set_lora_task_id(request, info, target.adapter.task_id)
    else:
        strip_lora_inputs(request)
    prompt = prompt_text(inputs)
    prompt_tokens = base.estimate_tokens(prompt) if prompt is not None else 0
    max_tokens = base.resolve_max_tokens(prompt_tokens, _int_of(inputs, "max_tokens"))
    who = services.request_class(target, api_key, fairness_id=fairness_id, objective=objective)
    call = UpstreamCall(
        request_id=request_id,
        target=target,
        payload=TritonTensorPayload(request),
        prompt_tokens=prompt_tokens,
        max_tokens=max_tokens,
        deadline_s=time.monotonic() + services.settings.request_timeout_s,
        client_streaming=client_streaming and _bool_of(inputs, "stream"),
        client_id=request.id,
        blocks=base.prompt_blocks(prompt, target.adapter.task_id if target.adapter is not None else 0)
        if prompt is not None
        else NO_BLOCKS,
        priority=who.band,
        tenant=who.tenant,
        output_metered=False,  # its output tensors are not decoded here: its tenant pays max_tokens at admission
    )
    return target, call


def check_against_config(request: service_pb2.ModelInferRequest, view: ConfigView, served_name: str) -> None:
    """400 for what the pod would refuse anyway: a required input missing (``max_tokens``, ``text_input``),
    an output the model does not have. Caught here, such a request never reaches (or blames) a pod."""
    names = {tensor.name for tensor in request.inputs}
    for name in view.required_inputs:
        if name not in names:
            raise MalformedRequest(f"missing required input '{name}' for model '{served_name}'", param=name)
    for output in request.outputs:
        if output.name not in view.outputs:
            known = ", ".join(sorted(view.outputs))
            raise MalformedRequest(
                f"unknown output '{output.name}' for model '{served_name}' (it has: {known})", param=output.name
            )


async def travel_as_generate_json(services: Services, target: Target, call: UpstreamCall, *, streaming: bool) -> None:
    """Let a warm tensor request travel as Triton generate JSON over the pod's HTTP port (much cheaper for
    the router than a gRPC call) when it can do so unchanged; see :func:`generate_body_for_tensors`.
    Requests with weights, and pods without an HTTP port, still go over gRPC (the dispatcher decides)."""
    view = config_view(await services.model_info.config(target.base))
    if view.shaped_reader is None:
        return
    request = call.payload.infer_request()
    assert request is not None
    body = generate_body_for_tensors(request, view.config, streaming=streaming)
    if body is None:
        return
    generate = GenerateJson(body, bool(streaming and body.get("stream")), view.shaped_reader)
    call.payload = TritonTensorPayload(request, generate)
