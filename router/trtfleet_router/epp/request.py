"""What the picker makes of one request through a gateway: the call the router would dispatch, and what the pod gets.

The same parsing and rewriting as the router's own front ends, so a client sends only ``model: <adapter>``:

* ``POST /v1/completions`` and ``/v1/chat/completions`` to a ``pytorch`` base model served by trtllm-serve: the
  OpenAI body trtllm-serve takes, the base model's name in ``model`` and the adapter in ``lora_request`` (name,
  task id, staged path), the fields trtllm-serve does not know left out (:class:`~..upstream.payload.OpenAIPayload`);
* ``POST /v2/models/{name}/generate`` and ``/generate_stream`` to a Triton base model: the path names the upstream
  text model and the body carries the adapter's ``lora_task_id``. LoRA weights have no JSON form, so a pod predicted
  cold gets them pushed over gRPC before the request goes (:mod:`.coldloads`);
* ``GET /v1/models``: answered by the picker itself (the served names, as the router lists them);
* anything else passes unchanged to a ready pod of the pool.

Answers from the pod name the model the pod served; :meth:`GatewayRequest.client_names` rewrites them back to the
name the client sent. The fairness and objective headers a gateway sends name the request's tenant and band
(``routing/tenancy.py``).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Final

from trtfleet_router import jsoncodec
from trtfleet_router.errors import MalformedRequest, UnsupportedParameter
from trtfleet_router.routing.tenancy import FAIRNESS_HEADERS, OBJECTIVE_HEADERS, first_header
from trtfleet_router.server.auth import presented_key
from trtfleet_router.server.common import RequestRecord, Services
from trtfleet_router.server.openai_http import prepare_text_request
from trtfleet_router.server.triton_http import prepare_generate_call
from trtfleet_router.upstream.call import UpstreamCall

MODELS_PATH: Final = "/v1/models"
OPENAI_PATHS: Final = {"/v1/completions": False, "/v1/chat/completions": True}  # path -> chat
GENERATE_PREFIX: Final = "/v2/models/"
GENERATE_ENDINGS: Final = {"/generate": False, "/generate_stream": True}  # ending -> streaming


@dataclass(frozen=True, slots=True)
class GatewayRequest:
    call: UpstreamCall
    path: str  # what the pod is asked, and with which body
    body: bytes
    client_model: str
    upstream_model: str
    weights_travel: bool  # runtime tensorrtllm: the pod can only learn an adapter from weights sent to it
    fairness_id: str | None = None
    objective: str | None = None

    def client_names(self, chunk: bytes) -> bytes:
        """A response chunk with the model the pod named replaced by the one the client asked for."""
        if self.upstream_model == self.client_model or not chunk:
            return chunk
        ours = self.client_model.encode()
        for key in (b'"model":"', b'"model": "', b'"model_name":"', b'"model_name": "'):
            chunk = chunk.replace(key + self.upstream_model.encode() + b'"', key + ours + b'"')
        return chunk


def request_path(headers: Mapping[str, str]) -> str:
    return headers.get(":path", "").split("?", 1)[0]


def is_models_list(headers: Mapping[str, str]) -> bool:
    return headers.get(":method") == "GET" and request_path(headers) == MODELS_PATH


async def interpret(
    services: Services, headers: Mapping[str, str], body: bytes, record: RequestRecord
) -> GatewayRequest | None:
    """The gateway request for an inference call; None for anything else (it passes to a pod unchanged). Raises
    the client-facing :class:`~trtfleet_router.errors.RouterError` for a request the router would refuse."""
    if headers.get(":method") != "POST":
        return None
    path, key = request_path(headers), presented_key(headers)
    fairness, objective = first_header(headers, FAIRNESS_HEADERS), first_header(headers, OBJECTIVE_HEADERS)
    chat = OPENAI_PATHS.get(path)
    if chat is not None:
        parsed, text_request = prepare_text_request(
            services, _json(body), record, chat=chat, key=key, internal=False, fairness_id=fairness,
            objective=objective,
        )
        call = await services.text.call(text_request)
        wire = call.payload.openai_json()
        if wire is None:
            base = text_request.target.base
            raise UnsupportedParameter(
                f"model '{parsed.model}' is served by Triton (base model '{base.name}'): through a gateway, call "
                f"POST /v2/models/{parsed.model}/generate; the OpenAI API is the router's own front end",
                param="model",
            )
        body_out = dict(wire.body)
        if not parsed.include_usage:  # the router asks for usage for itself; the client's stream is the pod's here
            body_out.pop("stream_options", None)
        return GatewayRequest(
            call, wire.path, jsoncodec.dumps(body_out), parsed.model, call.payload.model, False, fairness, objective
        )
    if path.startswith(GENERATE_PREFIX):
        name, _, ending = path[len(GENERATE_PREFIX) :].partition("/")
        streaming = GENERATE_ENDINGS.get("/" + ending)
        if streaming is None or not name:
            return None
        call = await prepare_generate_call(
            services, _json(body), name, key, record, streaming=streaming, fairness_id=fairness, objective=objective
        )
        generate = call.payload.generate_json()
        if generate is None:
            raise UnsupportedParameter(
                f"model '{name}' cannot take this request as generate JSON (a decoupled model collects streamed "
                "answers over gRPC only): use generate_stream, or the router's own Triton endpoints",
                param="stream",
            )
        upstream_path = f"{GENERATE_PREFIX}{call.payload.model}/{ending}"
        adapter = call.target.adapter
        weights_travel = adapter is not None and not adapter.lora_path
        return GatewayRequest(
            call, upstream_path, jsoncodec.dumps(generate.body), name, call.payload.model, weights_travel, fairness,
            objective,
        )
    return None


def _json(body: bytes) -> object:
    try:
        return jsoncodec.loads(body)
    except (ValueError, UnicodeDecodeError) as exc:
        raise MalformedRequest(f"the request body is not valid JSON: {exc}") from exc
