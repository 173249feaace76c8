"""One OpenAI request through the reference engine: admit, prepare the adapter, run, and say why it ended.

Phases (each a method of :class:`Generation`): **prepare** the ``GenerationRequest`` (prompt format, length
checks, sampling, stop words) and the adapter (read from ``lora_path`` off the event loop when its id is not
cached); **admit** through the :class:`~trtfleet_engines.reference.serve.adapters.AdapterGate`; **run** on the
:class:`~trtfleet_engines.reference.serve.bridge.EngineBridge`, yielding text deltas; **finish** with a
``finish_reason`` (stop, length, cancelled) and the request metrics. Leaving the iteration early (the client
went away) cancels the engine request and frees its adapter.

Errors: :class:`RequestError` carries the HTTP status and the ``ErrorResponse`` message the server answers.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncGenerator, AsyncIterator
from dataclasses import dataclass, field

from trtfleet_engines.reference.batch_types import DEFAULT_REQUEST_PRIORITY
from trtfleet_engines.reference.errors import RequestRejected
from trtfleet_engines.reference.sampling import SamplingParams
from trtfleet_engines.reference.scheduler import GenerationRequest
from trtfleet_engines.reference.serve.adapters import AdapterGate, AdapterLoadError, PeftAdapterStore, PeftLoraInputs
from trtfleet_engines.reference.serve.bridge import EngineBridge, Submitted
from trtfleet_engines.reference.serve.metrics import ServeMetrics
from trtfleet_engines.reference.serve.protocol import ChatCompletionRequest, CompletionRequest
from trtfleet_engines.reference.text import IncrementalDecoder
from trtfleet_engines.reference.tokenizer import EOS_ID, encode, prompt_ids


class RequestError(Exception):
    """A request the server refuses with ``ErrorResponse`` (``message``) and ``status``."""

    def __init__(self, message: str, status: int = 400) -> None:
        super().__init__(message)
        self.message = message
        self.status = status


@dataclass(frozen=True)
class EngineLimits:
    max_num_tokens: int
    max_seq_len: int


@dataclass
class Outcome:
    """Filled while a request runs; final once ``finish_reason`` is set."""

    prompt_tokens: int
    completion_tokens: int = 0
    cached_tokens: int = 0
    finish_reason: str | None = None
    error: str | None = None
    first_token_s: float | None = None
    started_s: float = field(default_factory=time.monotonic)


@dataclass
class Generation:
    """One request's life; ``deltas()`` runs it."""

    bridge: EngineBridge
    store: PeftAdapterStore | None
    gate: AdapterGate | None
    metrics: ServeMetrics
    limits: EngineLimits
    body: CompletionRequest | ChatCompletionRequest
    outcome: Outcome = field(init=False)
    request: GenerationRequest = field(init=False)
    task_id: int | None = field(init=False, default=None)

    async def prepare(self) -> None:
        """Build the engine request; raises RequestError for what upstream refuses before generating."""
        problem = self.body.unsupported()
        if problem is not None:
            raise RequestError(problem)
        text = self.body.prompt_text()
        if text is None:
            raise RequestError("the reference engine takes one prompt per request")
        ids = prompt_ids(text)
        if len(ids) > self.limits.max_num_tokens:
            raise RequestError(f"The sum of prompt length ({len(ids)}) should not exceed max_num_tokens "
                               f"({self.limits.max_num_tokens})")
        if len(ids) >= self.limits.max_seq_len:
            raise RequestError(f"The prompt length ({len(ids)}) must be less than max_seq_len "
                               f"({self.limits.max_seq_len})")
        remaining = self.limits.max_seq_len - len(ids)
        wanted = self.body.output_limit() if isinstance(self.body, ChatCompletionRequest) else self.body.max_tokens
        body = self.body
        self.outcome = Outcome(prompt_tokens=len(ids))
        self.request = GenerationRequest(
            prompt=tuple(ids),
            max_new_tokens=min(wanted or remaining, remaining),
            end_id=None if body.ignore_eos else EOS_ID,
            streaming=True,
            sampling=SamplingParams(
                temperature=1.0 if body.temperature is None else body.temperature,
                top_k=body.top_k or 0,
                top_p=body.top_p or 0.0,
                seed=body.seed or 0,
            ),
            stop_words=tuple(tuple(encode(stop)) for stop in body.stop_strings() if stop),
            lora=await self._lora(),
            priority=DEFAULT_REQUEST_PRIORITY if body.priority is None else body.priority,
        )

    async def _lora(self) -> PeftLoraInputs | None:
        lora = self.body.lora_request
        if lora is None or self.store is None:  # no lora_config: answered from the base model, as upstream
            return None
        loaded = None
        if not self.store.is_cached(lora.lora_int_id):
            try:
                loaded = await asyncio.to_thread(self.store.load, lora.lora_path)
            except AdapterLoadError as exc:
                raise RequestError(f"Failed to load LoRA adapter: {exc}") from exc
        self.task_id = lora.lora_int_id
        return PeftLoraInputs(task_id=lora.lora_int_id, name=lora.lora_name, path=lora.lora_path, loaded=loaded)

    async def deltas(self) -> AsyncGenerator[str, None]:
        """Text deltas until the request ends; the first one may be empty. Raises RequestError when the engine
        refuses before the first token. Closing the iterator early cancels the request."""
        if self.task_id is not None and self.gate is not None:
            await self.gate.acquire(self.task_id)
        submitted: Submitted | None = None
        try:
            try:
                submitted = self.bridge.submit(self.request)
            except RequestRejected as exc:
                raise RequestError(exc.text) from exc
            async for text in self._run(submitted):
                yield text
        finally:
            if submitted is not None and self.outcome.finish_reason is None:
                self.outcome.finish_reason = "cancelled"
                self.bridge.cancel(submitted.user_id)
            if self.task_id is not None and self.gate is not None:
                self.gate.release(self.task_id)
            self._record()

    async def _run(self, submitted: Submitted) -> AsyncIterator[str]:
        decoder = IncrementalDecoder()
        outcome = self.outcome
        async for response in self.bridge.responses(submitted):
            if response.error is not None:
                outcome.finish_reason, outcome.error = "error", response.error
                if outcome.completion_tokens == 0:
                    raise RequestError(response.error)
                return
            if response.output_ids and outcome.first_token_s is None:
                outcome.first_token_s = time.monotonic()
            outcome.completion_tokens += len(response.output_ids)
            text = decoder.feed(response.output_ids)
            if response.final:
                outcome.cached_tokens = response.cached_tokens
                text += decoder.flush()
                outcome.finish_reason = self._finish_reason(bool(response.output_ids))
            yield text

    def _finish_reason(self, ended_with_token: bool) -> str:
        generated = self.outcome.completion_tokens
        if not ended_with_token:
            return "stop"  # end_id
        at_limit = self.outcome.prompt_tokens + generated >= self.limits.max_seq_len
        if generated >= self.request.max_new_tokens or at_limit:
            return "length"
        return "stop"  # a stop word

    def _record(self) -> None:
        outcome = self.outcome
        if outcome.finish_reason in (None, "error"):
            return
        ttft = None if outcome.first_token_s is None else outcome.first_token_s - outcome.started_s
        self.metrics.finished(reason=outcome.finish_reason, latency_s=time.monotonic() - outcome.started_s,
                              ttft_s=ttft, prompt=outcome.prompt_tokens, generated=outcome.completion_tokens)
