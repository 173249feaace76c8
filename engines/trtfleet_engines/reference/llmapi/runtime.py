"""The reference llmapi model's engine: the reference ``pytorch`` mode's batcher, adapter tiers and generation
behind an asyncio loop thread, driven by Triton requests (the I/O shell; no ``pb_utils`` here).

:class:`LlmapiEngine` builds what :class:`~trtfleet_engines.reference.serve.app.ServeApp` builds (tiny Llama,
:class:`~trtfleet_engines.reference.serve.adapters.PeftAdapterStore` tiers sized by ``lora_config``, the
:class:`~trtfleet_engines.reference.serve.adapters.AdapterGate`) from ``model.yaml``, and runs each request as
a :class:`~trtfleet_engines.reference.serve.generation.Generation` of an equivalent completions request: the
same adapter loading from ``lora_path`` (cold adapter = a read and a wait, never an error), the same outputs.
Responses go to a :class:`ResponseSink` (the Triton response sender in ``models/tensorrt_llm_llmapi``):
streamed ones carry the whole text so far, as upstream's ``CompletionOutput.text`` does.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import Sequence
from concurrent.futures import Future
from contextlib import aclosing
from typing import Protocol

from trtfleet_engines.reference.llmapi.contract import MODEL_NAME, LlmapiRequest, output_text
from trtfleet_engines.reference.serve.app import ServeApp
from trtfleet_engines.reference.serve.generation import Generation, RequestError
from trtfleet_engines.reference.serve.protocol import CompletionRequest, LoraRequestBody
from trtfleet_engines.reference.serve.settings import ServeSettings, settings_from_args

logger = logging.getLogger(__name__)

CANCELLED_TEXT = "Request cancelled by client"


class ResponseSink(Protocol):
    def send(self, text: str, finish_reason: str | None, *, final: bool) -> None: ...
    def fail(self, text: str, *, cancelled: bool = False) -> None: ...
    def is_cancelled(self) -> bool: ...


def settings_for(model_yaml_path: str, model: str, serve_args: Sequence[str] = ()) -> ServeSettings:
    """The ``pytorch`` mode's settings from ``model.yaml`` (its ``model`` key is the checkpoint)."""
    return settings_from_args([model, "--config", model_yaml_path, *serve_args])


def completion_body(request: LlmapiRequest) -> CompletionRequest:
    """The completions request that generates what ``request`` asks for (raises RequestError)."""
    if request.best_of != 1:
        raise RequestError("the reference engine generates one sequence per request (best_of must be 1)")
    lora = request.lora
    return CompletionRequest(
        model=MODEL_NAME, prompt=request.prompt, max_tokens=request.max_tokens, temperature=request.temperature,
        top_k=request.top_k, top_p=request.top_p, seed=request.seed, stop=list(request.stop) or None,
        frequency_penalty=request.frequency_penalty, presence_penalty=request.presence_penalty,
        lora_request=None if lora is None else LoraRequestBody(
            lora_name=lora.name, lora_int_id=lora.lora_id, lora_path=lora.path, lora_ckpt_source=lora.source
        ),
    )


class LlmapiEngine:
    def __init__(self, settings: ServeSettings) -> None:
        self.server = ServeApp(settings)
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="llmapi-events", daemon=True)
        self._by_user: dict[str, set[Future[None]]] = {}
        self._lock = threading.Lock()

    def start(self) -> None:
        self.server.bridge.start()
        self._thread.start()

    def stop(self) -> None:
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=10)
        self.server.bridge.stop()

    def submit(self, request: LlmapiRequest, sink: ResponseSink, *, user_id: str) -> None:
        future = asyncio.run_coroutine_threadsafe(self._run(request, sink), self._loop)
        if user_id:
            with self._lock:
                self._by_user.setdefault(user_id, set()).add(future)
            future.add_done_callback(lambda done: self._forget(user_id, done))

    def stop_user(self, user_id: str) -> None:
        """``stop`` with this request id: cancel its requests (each answers "Request cancelled by client")."""
        with self._lock:
            futures = list(self._by_user.get(user_id, ()))
        for future in futures:
            future.cancel()

    def _forget(self, user_id: str, future: Future[None]) -> None:
        with self._lock:
            futures = self._by_user.get(user_id)
            if futures is not None:
                futures.discard(future)
                if not futures:
                    del self._by_user[user_id]

    async def _run(self, request: LlmapiRequest, sink: ResponseSink) -> None:
        server = self.server
        try:
            body = completion_body(request)
            generation = Generation(server.bridge, server.store, server.gate, server.metrics, server.limits, body)
            await generation.prepare()
        except RequestError as exc:
            sink.fail(exc.message)
            return
        generated, pending = "", None
        try:
            async with aclosing(generation.deltas()) as deltas:  # leaving early cancels the engine request
                async for delta in deltas:
                    generated += delta
                    if sink.is_cancelled():
                        sink.fail(CANCELLED_TEXT, cancelled=True)
                        return
                    if request.streaming and delta:
                        if pending is not None:
                            sink.send(pending, None, final=False)
                        pending = output_text(request, generated)
        except RequestError as exc:
            sink.fail(exc.message)
            return
        except asyncio.CancelledError:
            sink.fail(CANCELLED_TEXT, cancelled=True)
            raise
        outcome = generation.outcome
        if outcome.error is not None:
            sink.fail(outcome.error)
            return
        sink.send(output_text(request, generated), outcome.finish_reason, final=True)
