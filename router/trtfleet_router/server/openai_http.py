"""The OpenAI-compatible HTTP front end: ``/v1/completions``, ``/v1/chat/completions``, ``/v1/models``.

Streams are SSE ``data: {chunk}`` events ending with ``data: [DONE]``. Errors before the first event
are ordinary HTTP errors with OpenAI's error body. A stream that breaks after it started ends with one
``data: {"error": {...}}`` event and then ``data: [DONE]``: the official ``openai`` client raises
``openai.APIError`` with that message when it reads the error event (it never reaches [DONE]), and
raw SSE readers still see a terminated stream.
"""

from __future__ import annotations

import dataclasses
import time
from contextlib import aclosing
from typing import Any

from aiohttp import web

from trtfleet_router import jsoncodec
from trtfleet_router.errors import RouterError, http_headers_for, mapping_for, openai_error_body
from trtfleet_router.routing.tenancy import FAIRNESS_HEADERS, first_header
from trtfleet_router.server.auth import presented_key
from trtfleet_router.server.common import REQUEST_ID_HEADER, RequestRecord, Services, read_json_body
from trtfleet_router.server.openai_protocol import (
    ChunkFactory,
    OpenAIRequest,
    chat_response,
    completion_response,
    model_card,
    parse_chat,
    parse_completion,
)
from trtfleet_router.server.sse import DONE_EVENT, LazySse, json_event
from trtfleet_router.upstream.text import TextRequest, Usage, finish_reason

FRONTEND = "openai"


def json_response(obj: Any, status: int = 200, headers: dict[str, str] | None = None) -> web.Response:
    body = jsoncodec.dumps(obj)
    return web.Response(body=body, status=status, headers=headers, content_type="application/json")


def error_response(error: RouterError) -> web.Response:
    mapping = mapping_for(error)
    return json_response(openai_error_body(error), mapping.http_status, http_headers_for(error))


class OpenAIFrontend:
    def __init__(self, services: Services) -> None:
        self.services = services
        self.created = int(time.time())

    def routes(self) -> list[web.RouteDef]:
        return [
            web.post("/v1/completions", self.completions),
            web.post("/v1/chat/completions", self.chat_completions),
            web.get("/v1/models", self.models),
            web.get("/v1/models/{model:.+}", self.model),
        ]

    async def completions(self, request: web.Request) -> web.StreamResponse:
        return await self._serve(request, chat=False)

    async def chat_completions(self, request: web.Request) -> web.StreamResponse:
        return await self._serve(request, chat=True)

    async def models(self, request: web.Request) -> web.Response:
        try:
            cards = model_cards(self.services, presented_key(request.headers), self.created)
        except RouterError as exc:
            return error_response(exc)
        return json_response({"object": "list", "data": cards})

    async def model(self, request: web.Request) -> web.Response:
        name = request.match_info["model"]
        try:
            target = self.services.resolve(name, presented_key(request.headers))
        except RouterError as exc:
            return error_response(exc)
        parent = (target.base.variant_of or target.base.name) if target.adapter is not None else target.base.merged_base
        return json_response(model_card(name, self.created, parent))

    async def _serve(self, request: web.Request, *, chat: bool) -> web.StreamResponse:
        services = self.services
        request_id = services.request_ids.new(request.headers.get(REQUEST_ID_HEADER))
        try:
            with services.track(FRONTEND, request_id) as record:
                return await self._handle(request, record, chat=chat)
        except RouterError as exc:
            return error_response(exc)

    async def answer(self, body: Any, *, chat: bool, request_id: str) -> dict[str, Any]:
        """The non-streamed answer body to ``body`` through the same path as an HTTP request, counted
        under the front end ``batch`` (the batch runner's entry; raises :class:`RouterError`). API keys
        are not checked: the batch API checked its caller."""
        with self.services.track("batch", request_id) as record:
            parsed, text_request = prepare_text_request(self.services, body, record, chat=chat, key=None, internal=True)
            usage, response_id = Usage(text_request.prompt_tokens), _response_id(chat, record)
            return await self._unary(text_request, parsed, usage, record, chat, response_id)

    async def _handle(self, request: web.Request, record: RequestRecord, *, chat: bool) -> web.StreamResponse:
        services = self.services
        key = presented_key(request.headers)
        body = await read_json_body(request, services.body_limit(key), services.settings.body_timeout_s)
        fairness_id = first_header(request.headers, FAIRNESS_HEADERS) if services.trusts_fairness_header else None
        parsed, text_request = prepare_text_request(
            services, body, record, chat=chat, key=key, internal=False, fairness_id=fairness_id
        )
        usage, response_id = Usage(text_request.prompt_tokens), _response_id(chat, record)
        if parsed.stream:
            return await self._stream(request, text_request, parsed, usage, record, chat, response_id)
        answer = await self._unary(text_request, parsed, usage, record, chat, response_id)
        return json_response(answer, headers={REQUEST_ID_HEADER: record.request_id})

    async def _unary(
        self,
        text_request: TextRequest,
        parsed: OpenAIRequest,
        usage: Usage,
        record: RequestRecord,
        chat: bool,
        response_id: str,
    ) -> dict[str, Any]:
        parts = []
        async with aclosing(self.services.text.generate(text_request, usage)) as pieces:
            async for piece in pieces:
                parts.append(piece.text)
        record.first_output_s = time.perf_counter()
        self._count_tokens(record, usage)
        finish = finish_reason(usage, text_request.params.max_tokens)
        build = chat_response if chat else completion_response
        return build(response_id, parsed.model, "".join(parts), finish, usage)

    async def _stream(
        self,
        request: web.Request,
        text_request: TextRequest,
        parsed: OpenAIRequest,
        usage: Usage,
        record: RequestRecord,
        chat: bool,
        response_id: str,
    ) -> web.StreamResponse:
        factory = ChunkFactory(response_id, parsed.model, int(time.time()), chat, parsed.include_usage)
        sse = LazySse(request, {REQUEST_ID_HEADER: record.request_id})
        inter_token = self.services.metrics.inter_token_latency.labels(record.model_kind)
        last_s = 0.0
        try:
            async with aclosing(self.services.text.generate(text_request, usage)) as pieces:
                async for piece in pieces:
                    now_s = time.perf_counter()
                    events = json_event(factory.text(piece.text)) if piece.text else b""
                    if not sse.started:
                        record.first_output_s = now_s
                        if chat:
                            events = json_event(factory.role()) + events
                    else:
                        inter_token.observe(now_s - last_s)
                    last_s = now_s
                    if events:
                        await sse.send(events)
        except RouterError as exc:
            if not sse.started:
                raise
            record.code = mapping_for(exc).code_label
            await sse.send(json_event(openai_error_body(exc)) + DONE_EVENT)
            return await sse.finish()
        tail = json_event(factory.finish(finish_reason(usage, text_request.params.max_tokens)))
        if not sse.started and chat:
            record.first_output_s = time.perf_counter()
            tail = json_event(factory.role()) + tail
        if parsed.include_usage:
            tail += json_event(factory.usage(usage))
        await sse.send(tail + DONE_EVENT)  # one write for the end of the stream
        self._count_tokens(record, usage)
        return await sse.finish()

    def _count_tokens(self, record: RequestRecord, usage: Usage) -> None:
        metrics = self.services.metrics
        metrics.input_tokens.labels(record.model_kind).inc(usage.prompt_tokens)
        metrics.output_tokens.labels(record.model_kind).inc(usage.completion_tokens)


def prepare_text_request(
    services: Services,
    body: Any,
    record: RequestRecord,
    *,
    chat: bool,
    key: str | None,
    internal: bool,
    fairness_id: str | None = None,
    objective: str | None = None,
) -> tuple[OpenAIRequest, TextRequest]:
    """Parse and resolve an OpenAI completion or chat body (``internal``: the batch runner's lines, unary, with no
    API-key check); fills the record's model. ``fairness_id`` and ``objective``: a gateway's headers (the tenant
    and the InferenceObjective). Shared by this front end and the endpoint picker."""
    parsed = parse_chat(body) if chat else parse_completion(body)
    if internal:
        parsed = dataclasses.replace(parsed, stream=False, include_usage=False)
        target = services.fleets.serving(services.fleets.registry.resolve(parsed.model))
    else:
        target = services.resolve(parsed.model, key)
    record.model_kind, record.model = target.model_kind, parsed.model
    prompt = target.base.chat(parsed.messages) if parsed.messages is not None else parsed.prompt or ""
    prompt_tokens = target.base.estimate_tokens(prompt)
    max_tokens = target.base.resolve_max_tokens(prompt_tokens, parsed.max_tokens)
    who = services.request_class(
        target, key, fairness_id=fairness_id, objective=objective, requested=parsed.priority, batch=internal
    )
    text_request = TextRequest(
        request_id=record.request_id,
        target=target,
        prompt=prompt,
        params=parsed.sampling(max_tokens),
        stream=parsed.stream,
        prompt_tokens=prompt_tokens,
        timeout_s=services.settings.request_timeout_s,
        messages=tuple(parsed.messages) if parsed.messages is not None else None,
        blocks=target.base.prompt_blocks(prompt, target.adapter.task_id if target.adapter is not None else 0),
        priority=who.band,
        tenant=who.tenant,
    )
    return parsed, text_request


def _response_id(chat: bool, record: RequestRecord) -> str:
    return ("chatcmpl-" if chat else "cmpl-") + record.request_id


def model_cards(services: Services, key: str | None, created: int) -> list[dict[str, Any]]:
    """``/v1/models``' cards: every served name ``key`` may use (base models, aliases, adapters, merged models)."""
    registry = services.fleets.registry
    cards = [
        model_card(name, created, None)
        for name in [*registry.served_bases(), *registry.aliases]
        if services.visible(name, key)
    ]
    cards += [
        model_card(name, created, registry.bases[a.base_model].variant_of or a.base_model)
        for name, a in registry.adapters.items()
        if services.visible(name, key)
    ]
    cards += [
        model_card(name, created, entry.merged_base)
        for name, entry in registry.merged.items()
        if name not in registry.adapters and services.visible(name, key)
    ]
    return cards
