"""The aiohttp application: trtllm-serve's routes over the reference engine (the I/O shell).

Routes (``tensorrt_llm/serve/openai_server.py``): ``GET /health`` (200 empty, 503 "LLM is unavailable...");
``GET /health_generate`` (one-token chat, "Generation health check OK"); ``GET /version``; ``GET /v1/models``
(only the served name: adapters are not models); ``POST /v1/completions`` and ``/v1/chat/completions``
(streaming and not); ``GET /metrics`` (JSON iteration stats, drained per call); ``GET /prometheus/metrics``
(only with ``return_perf_metrics``); ``POST /kv_cache_events`` (the KV-cache events since the last call, in
``KVCacheEventSerializer``'s JSON; ``[]`` unless ``kv_cache_config.event_buffer_max_size`` > 0).
Reference-only: ``GET /reference/lora_cache`` (residency and eviction
history of the two LoRA tiers, which upstream does not expose).

Status codes are mapped here only: body validation -> 400 ``{"error": ...}``; :class:`RequestError` ->
its status with ``ErrorResponse``; an engine error after a stream started -> completions send
``data: {"error": {...}}`` then ``[DONE]``, chat ends the stream, as upstream does.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import AsyncGenerator
from typing import Any

from aiohttp import web
from pydantic import ValidationError

from trtfleet.version import __version__
from trtfleet_engines.reference.engine import build_block_pool, build_speculator, fit_limits
from trtfleet_engines.reference.numpy_llama import LlamaWeights, TinyLlama
from trtfleet_engines.reference.scheduler import BatchLimits, InflightBatcher
from trtfleet_engines.reference.serve.adapters import AdapterGate, PeftAdapterStore, TierSizes
from trtfleet_engines.reference.serve.bridge import EngineBridge, TokenStream
from trtfleet_engines.reference.serve.generation import EngineLimits, Generation, RequestError
from trtfleet_engines.reference.serve.metrics import ServeMetrics
from trtfleet_engines.reference.serve.protocol import (
    ChatCompletionRequest,
    ChatMessage,
    CompletionRequest,
    chat_body,
    chat_chunk,
    completion_body,
    completion_chunk,
    error_response,
    now_s,
    usage_chunk,
)
from trtfleet_engines.reference.serve.settings import ServeSettings

UNHEALTHY_TEXT = "LLM is unavailable. Please check the server logs for more details."
SSE_HEADERS = {"Content-Type": "text/event-stream", "Cache-Control": "no-cache"}


def validation_error_text(exc: ValidationError) -> str:
    """FastAPI's ``str(RequestValidationError)``: the error list, each ``loc`` under ``body``."""
    return str([{**error, "loc": ("body", *error["loc"])} for error in exc.errors(include_url=False)])


def _sse(payload: dict[str, Any] | str) -> bytes:
    data = payload if isinstance(payload, str) else json.dumps(payload, separators=(",", ":"))
    return f"data: {data}\n\n".encode()


class ServeApp:
    """Engine, LoRA store and metrics of one server; :meth:`application` builds the aiohttp app."""

    def __init__(self, settings: ServeSettings) -> None:
        self.settings = settings
        weights = LlamaWeights.load(settings.model_dir)
        limits = fit_limits(
            BatchLimits(
                max_batch_size=settings.max_batch_size, max_num_tokens=settings.max_num_tokens,
                max_input_len=settings.max_seq_len - 1, max_seq_len=settings.max_seq_len,
                max_queue_size=settings.max_queue_size,
            ),
            weights.config,
        )
        self.limits = EngineLimits(limits.max_num_tokens, limits.max_seq_len)
        self.store: PeftAdapterStore | None = None
        self.gate: AdapterGate | None = None
        if settings.lora is not None:
            lora = settings.lora
            sizes = TierSizes(lora.max_loras, lora.max_cpu_loras, lora.max_lora_rank, lora.target_modules,
                              lora.optimal_adapter_size, lora.max_adapter_size)
            self.store = PeftAdapterStore(weights.config, sizes, settings.read_bytes_per_s)
            self.gate = AdapterGate(max(self.store.host_adapters, 1))
        pool = build_block_pool(settings.kv_cache, limits)
        batcher: InflightBatcher[TokenStream] = InflightBatcher(
            TinyLlama(weights), limits, self.store, pool, build_speculator(settings.speculation),
            waiting_policy=settings.waiting_policy)
        self.bridge = EngineBridge(
            batcher, min_step_s=settings.min_step_s, prefill_s_per_token=settings.prefill_s_per_token,
            pcie_bytes_per_s=settings.pcie_bytes_per_s,
        )
        store = self.store
        self.metrics = ServeMetrics(self.bridge.stats, store.snapshot if store is not None else lambda: None)

    def application(self) -> web.Application:
        app = web.Application()
        app.router.add_get("/health", self.health)
        app.router.add_get("/health_generate", self.health_generate)
        app.router.add_get("/version", self.version)
        app.router.add_get("/v1/models", self.models)
        app.router.add_get("/metrics", self.iteration_stats)
        app.router.add_post("/kv_cache_events", self.kv_cache_events)
        app.router.add_post("/v1/completions", self.completions)
        app.router.add_post("/v1/chat/completions", self.chat)
        app.router.add_get("/reference/lora_cache", self.lora_cache)
        if self.settings.return_perf_metrics:
            app.router.add_get("/prometheus/metrics", self.prometheus)
        app.on_startup.append(self._start)
        app.on_cleanup.append(self._stop)
        return app

    async def _start(self, _app: web.Application) -> None:
        self.bridge.start()

    async def _stop(self, _app: web.Application) -> None:
        self.bridge.stop()

    # -- small routes ---------------------------------------------------------------------
    async def health(self, _request: web.Request) -> web.Response:
        if self.bridge.healthy:
            return web.Response(status=200)
        return web.Response(status=503, text=UNHEALTHY_TEXT)

    async def health_generate(self, _request: web.Request) -> web.Response:
        body = ChatCompletionRequest(model=self.settings.served_model_name, max_completion_tokens=1,
                                     temperature=0.0, messages=[ChatMessage(role="user", content="hi")])
        try:
            generation = self._generation(body)
            await generation.prepare()
            async for _ in generation.deltas():
                pass
        except RequestError as exc:
            return web.Response(status=500, text=f"Generation health check failed: {exc.message}")
        return web.Response(status=200, text="Generation health check OK")

    async def version(self, _request: web.Request) -> web.Response:
        return web.json_response({"version": f"trtfleet-reference-{__version__}"})

    async def models(self, _request: web.Request) -> web.Response:
        card = {"id": self.settings.served_model_name, "object": "model", "created": now_s(),
                "owned_by": "tensorrt_llm"}
        return web.json_response({"object": "list", "data": [card]})

    async def iteration_stats(self, _request: web.Request) -> web.Response:
        return web.json_response(self.bridge.drain_iteration_stats())

    async def kv_cache_events(self, _request: web.Request) -> web.Response:
        return web.json_response(self.bridge.drain_kv_cache_events())

    async def prometheus(self, _request: web.Request) -> web.Response:
        return web.Response(body=self.metrics.render(), content_type="text/plain", charset="utf-8")

    async def lora_cache(self, _request: web.Request) -> web.Response:
        if self.store is None:
            return web.json_response(error_response("started without lora_config", status=404), status=404)
        return web.json_response({**self.store.snapshot(), "inFlight": self.gate.in_flight() if self.gate else {}})

    # -- generation ------------------------------------------------------------------------
    async def completions(self, request: web.Request) -> web.StreamResponse:
        return await self._serve(request, chat=False)

    async def chat(self, request: web.Request) -> web.StreamResponse:
        return await self._serve(request, chat=True)

    def _generation(self, body: CompletionRequest | ChatCompletionRequest) -> Generation:
        return Generation(self.bridge, self.store, self.gate, self.metrics, self.limits, body)

    async def _serve(self, request: web.Request, *, chat: bool) -> web.StreamResponse:
        try:
            raw = await request.json()
        except ValueError as exc:
            return web.json_response({"error": f"malformed JSON body: {exc}"}, status=400)
        model = ChatCompletionRequest if chat else CompletionRequest
        try:
            body = model.model_validate(raw)
        except ValidationError as exc:
            return web.json_response({"error": validation_error_text(exc)}, status=400)
        generation = self._generation(body)
        try:
            await generation.prepare()
        except RequestError as exc:
            return web.json_response(error_response(exc.message, status=exc.status), status=exc.status)
        deltas = generation.deltas()
        try:
            first = await anext(deltas)  # engine refusals arrive before the first token: still a JSON error
        except RequestError as exc:
            return web.json_response(error_response(exc.message, status=exc.status), status=exc.status)
        except StopAsyncIteration:
            first = ""
        if body.stream:
            return await self._stream(request, generation, deltas, first, chat=chat)
        try:
            text = first + "".join([delta async for delta in deltas])
        finally:
            await deltas.aclose()  # a client that went away cancels the engine request here
        outcome = generation.outcome
        if outcome.error is not None:
            return web.json_response(error_response(outcome.error), status=400)
        if isinstance(body, CompletionRequest) and body.echo:
            text = (body.prompt_text() or "") + text
        build = chat_body if chat else completion_body
        prefix = "chatcmpl-" if chat else "cmpl-"
        return web.json_response(build(
            request_id=f"{prefix}{uuid.uuid4().hex}", model=body.model, text=text,
            finish_reason=outcome.finish_reason or "stop", prompt_tokens=outcome.prompt_tokens,
            completion_tokens=outcome.completion_tokens, cached_tokens=outcome.cached_tokens,
        ))

    async def _stream(self, request: web.Request, generation: Generation, deltas: AsyncGenerator[str, None],
                      first: str, *, chat: bool) -> web.StreamResponse:
        body = generation.body
        request_id = f"{'chatcmpl' if chat else 'cmpl'}-{uuid.uuid4().hex[:16]}"
        response = web.StreamResponse(status=200, headers=SSE_HEADERS)
        try:
            await response.prepare(request)
            if chat:
                await response.write(_sse(chat_chunk(request_id=request_id, model=body.model,
                                                     delta={"role": "assistant", "content": ""}, finish_reason=None)))
            pending = first
            async for delta in deltas:
                await self._send_delta(response, request_id, body.model, pending, None, chat=chat)
                pending = delta
            outcome = generation.outcome
            if outcome.error is not None:
                if not chat:
                    error = {"message": outcome.error, "type": "server_error", "code": None, "param": None}
                    await response.write(_sse({"error": error}))
                    await response.write(_sse("[DONE]"))
                return response
            await self._send_delta(response, request_id, body.model, pending, outcome.finish_reason, chat=chat)
            options = body.stream_options
            if options is not None and options.include_usage:
                await response.write(_sse(usage_chunk(request_id=request_id, model=body.model, chat=chat,
                                                      prompt_tokens=outcome.prompt_tokens,
                                                      completion_tokens=outcome.completion_tokens,
                                                      cached_tokens=outcome.cached_tokens)))
            await response.write(_sse("[DONE]"))
        finally:
            await deltas.aclose()  # a client that went away cancels the engine request here
        return response

    @staticmethod
    async def _send_delta(response: web.StreamResponse, request_id: str, model: str, text: str,
                          finish_reason: str | None, *, chat: bool) -> None:
        if chat:
            delta = {"content": text} if text else {}
            if not delta and finish_reason is None:
                return
            chunk = chat_chunk(request_id=request_id, model=model, delta=delta, finish_reason=finish_reason)
        else:
            if not text and finish_reason is None:
                return
            chunk = completion_chunk(request_id=request_id, model=model, text=text, finish_reason=finish_reason)
        await response.write(_sse(chunk))
