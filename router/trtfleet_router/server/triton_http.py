"""The Triton-compatible HTTP front end (KServe v2 + Triton's generate extension).

Model names are served names: a base model (forwarded to its upstream text-level model) or an
adapter (the same, plus ``lora_task_id``). ``tritonclient.http`` sees one Triton server. Health:
``/v2/health/live`` is 200 while the process runs; ``/v2/health/ready`` and ``/v2/models/{m}/ready``
are 200 when a ready pod serves the model (400 otherwise, and while draining), as Triton answers.
Errors are Triton's ``{"error": "..."}`` with the status from :mod:`trtfleet_router.errors`;
``generate_stream`` errors after the first event arrive as ``data: {"error": "..."}`` with status 200.
"""

from __future__ import annotations

import time
from contextlib import aclosing
from typing import Any, Final

from aiohttp import web

from trtfleet import version
from trtfleet_router import jsoncodec
from trtfleet_router.errors import (
    MalformedRequest,
    RouterError,
    http_headers_for,
    mapping_for,
    triton_error_body,
)
from trtfleet_router.server.auth import presented_key
from trtfleet_router.server.common import (
    REQUEST_ID_HEADER,
    RequestRecord,
    Services,
    read_body,
    read_json_body,
)
from trtfleet_router.server.sse import LazySse, json_event
from trtfleet_router.server.tensor_calls import prepare_tensor_call, travel_as_generate_json
from trtfleet_router.server.triton_models import config_json, metadata_json
from trtfleet_router.server.triton_protocol import (
    HEADER_LENGTH,
    config_view,
    encode_infer_response,
    generate_http_body,
    generate_output_json,
    merge_responses,
    parse_generate_request,
    parse_infer_request,
)
from trtfleet_router.upstream.call import UpstreamCall
from trtfleet_router.upstream.payload import GenerateJson, TritonTensorPayload

FRONTEND = "triton_http"
SERVER_NAME = "trtfleet-router"
EXTENSIONS = ["model_configuration", "binary_tensor_data", "parameters", "generate"]


def _json(obj: Any, status: int = 200, headers: dict[str, str] | None = None) -> web.Response:
    body = jsoncodec.dumps(obj)
    return web.Response(body=body, status=status, headers=headers, content_type="application/json")


def error_response(error: RouterError) -> web.Response:
    return _json(triton_error_body(error), mapping_for(error).http_status, http_headers_for(error))


MODEL_ACTIONS: Final = frozenset({"ready", "config", "infer", "generate", "generate_stream"})


def split_model_path(path: str) -> tuple[str, str | None, str]:
    """What follows ``/v2/models/`` -> (model, version or None, action or ""): ``m``, ``m/ready``,
    ``m/versions/1``, ``m/versions/1/generate``. Served names may contain ``/``; a last segment that is
    an action always reads as the action (as Triton's own routes do)."""
    action = ""
    head, slash, last = path.rpartition("/")
    if slash and head and last in MODEL_ACTIONS:
        path, action = head, last
    model, marker, version = path.rpartition("/versions/")
    if marker and model and version and "/" not in version:
        return model, version, action
    return path, None, action


def _method_not_allowed(what: str, allowed: str) -> web.Response:
    return _json({"error": f"{what} takes {allowed} only"}, 405, {"Allow": allowed})


class TritonHttpFrontend:
    def __init__(self, services: Services) -> None:
        self.services = services

    def routes(self) -> list[web.RouteDef]:
        routes = [
            web.get("/v2/health/live", self.live),
            web.get("/v2/health/ready", self.ready),
            web.get("/v2", self.server_metadata),
            web.post("/v2/repository/index", self.repository_index),
        ]
        # One route per method for everything under /v2/models, split by split_model_path: aiohttp would
        # try a dozen regular expressions in turn for each inference request (about 8 % of its CPU).
        routes += [web.get("/v2/models/{path:.+}", self.model_get), web.post("/v2/models/{path:.+}", self.model_post)]
        return routes

    async def model_get(self, request: web.Request) -> web.StreamResponse:
        name, _, action = split_model_path(request.match_info["path"])
        if action == "":
            return await self.model_metadata(request, name)
        if action == "ready":
            return await self.model_ready(request, name)
        if action == "config":
            return await self.model_config(request, name)
        return _method_not_allowed(action, "POST")

    async def model_post(self, request: web.Request) -> web.StreamResponse:
        name, _, action = split_model_path(request.match_info["path"])
        if action == "generate":
            return await self._tracked(request, name, self._generate)
        if action == "generate_stream":
            return await self._tracked(request, name, self._generate_stream)
        if action == "infer":
            return await self._tracked(request, name, self._infer)
        return _method_not_allowed(action or "model metadata", "GET")

    # -- health and metadata --------------------------------------------------------------------------
    async def live(self, request: web.Request) -> web.Response:
        return web.Response(status=200)

    async def ready(self, request: web.Request) -> web.Response:
        services = self.services
        ready = not services.lifecycle.draining and any(
            services.fleets.ready_endpoints(name) for name in services.fleets.registry.bases
        )
        return web.Response(status=200 if ready else 400)

    async def server_metadata(self, request: web.Request) -> web.Response:
        return _json({"name": SERVER_NAME, "version": version.__version__, "extensions": EXTENSIONS})

    async def repository_index(self, request: web.Request) -> web.Response:
        registry = self.services.fleets.registry
        key = presented_key(request.headers)
        try:
            names = [name for name in registry.served_names() if self.services.visible(name, key)]
        except RouterError as exc:
            return error_response(exc)
        index = []
        for name in names:
            target = registry.resolve(name)
            state = "READY" if self.services.fleets.ready_endpoints(target.base.name) else "UNAVAILABLE"
            index.append({"name": name, "version": "1", "state": state})
        return _json(index)

    async def model_ready(self, request: web.Request, name: str) -> web.Response:
        try:
            target = self.services.resolve(name, presented_key(request.headers))
        except RouterError as exc:
            return error_response(exc)
        ready = not self.services.lifecycle.draining and self.services.fleets.ready_endpoints(target.base.name)
        return web.Response(status=200 if ready else 400)

    async def model_metadata(self, request: web.Request, name: str) -> web.Response:
        try:
            target = self.services.resolve(name, presented_key(request.headers))
            metadata = await self.services.model_info.metadata(target.base)
        except RouterError as exc:
            return error_response(exc)
        return _json(metadata_json(metadata, name))

    async def model_config(self, request: web.Request, name: str) -> web.Response:
        try:
            target = self.services.resolve(name, presented_key(request.headers))
            config = await self.services.model_info.config(target.base)
        except RouterError as exc:
            return error_response(exc)
        return _json(config_json(config, name))

    # -- inference ------------------------------------------------------------------------------------
    async def _tracked(self, request: web.Request, name: str, handler: Any) -> web.StreamResponse:
        request_id = self.services.request_ids.new(request.headers.get(REQUEST_ID_HEADER))
        try:
            with self.services.track(FRONTEND, request_id) as record:
                response: web.StreamResponse = await handler(request, record, name)
                return response
        except RouterError as exc:
            return error_response(exc)

    async def _collect(self, call: UpstreamCall) -> Any:
        responses = []
        async with aclosing(self.services.dispatcher.stream(call)) as stream:
            async for response in stream:
                responses.append(response)
        return merge_responses(responses)

    async def _infer(self, request: web.Request, record: RequestRecord, name: str) -> web.Response:
        services = self.services
        key = presented_key(request.headers)
        body = await read_body(request, services.body_limit(key), services.settings.body_timeout_s)
        header_length = request.headers.get(HEADER_LENGTH)
        try:
            length = int(header_length) if header_length is not None else None
        except ValueError as exc:
            raise MalformedRequest(f"{HEADER_LENGTH} must be an integer") from exc
        proto, choice = parse_infer_request(body, length)
        target, call = await prepare_tensor_call(services, proto, name, key, record.request_id)
        record.model_kind, record.model = target.model_kind, name
        await travel_as_generate_json(services, target, call, streaming=False)
        merged = await self._collect(call)
        payload, json_length = encode_infer_response(merged, choice, name)
        if json_length is None:
            return web.Response(body=payload, content_type="application/json")
        return web.Response(
            body=payload, content_type="application/octet-stream", headers={HEADER_LENGTH: str(json_length)}
        )

    async def _generate_call(
        self, request: web.Request, record: RequestRecord, name: str, *, streaming: bool = False
    ) -> UpstreamCall:
        services = self.services
        key = presented_key(request.headers)
        doc = await read_json_body(request, services.body_limit(key), services.settings.body_timeout_s)
        return await prepare_generate_call(services, doc, name, key, record, streaming=streaming)

    async def _generate(self, request: web.Request, record: RequestRecord, name: str) -> web.Response:
        call = await self._generate_call(request, record, name)
        merged = await self._collect(call)
        return _json(generate_output_json(merged, name))

    async def _generate_stream(self, request: web.Request, record: RequestRecord, name: str) -> web.StreamResponse:
        call = await self._generate_call(request, record, name, streaming=True)
        sse = LazySse(request)
        try:
            async with aclosing(self.services.dispatcher.stream(call)) as stream:
                async for response in stream:
                    if not sse.started:
                        record.first_output_s = time.perf_counter()
                    await sse.send(json_event(generate_output_json(response, name)))
        except RouterError as exc:
            if not sse.started:
                raise
            record.code = mapping_for(exc).code_label
            await sse.send(json_event(triton_error_body(exc)))
        return await sse.finish()


async def prepare_generate_call(
    services: Services,
    doc: Any,
    name: str,
    key: str | None,
    record: RequestRecord,
    *,
    streaming: bool,
    fairness_id: str | None = None,
    objective: str | None = None,
) -> UpstreamCall:
    """The call for Triton's generate extension (``generate_stream`` when ``streaming``) to model ``name``: the
    client's JSON checked against the upstream model's config, rewritten for it (``lora_task_id``); fills the
    record's model. ``fairness_id`` and ``objective``: a gateway's headers. Shared by this front end and the
    endpoint picker."""
    target = services.resolve(name, key)
    config = await services.model_info.config(target.base)
    proto = parse_generate_request(doc, config)
    target, call = await prepare_tensor_call(
        services, proto, name, key, record.request_id, client_streaming=streaming, fairness_id=fairness_id,
        objective=objective,
    )
    record.model_kind, record.model = target.model_kind, name
    reader = config_view(config).reader
    # generate (not _stream) with stream: true collects a decoupled model's responses: gRPC only.
    if reader is not None and (streaming or not doc.get("stream")):
        body = generate_http_body(doc, target.adapter.task_id if target.adapter else None)
        call.payload = TritonTensorPayload(proto, GenerateJson(body, streaming, reader))
    return call
