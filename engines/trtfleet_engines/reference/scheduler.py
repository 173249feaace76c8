"""In-flight batching for the reference engine: TRT-LLM's executor loop, as a pure-ish core.

:class:`InflightBatcher` owns the waiting queue and the active requests. It does no I/O and has no
thread or clock of its own: the shell (``loop.py``) calls :meth:`InflightBatcher.submit` and
:meth:`InflightBatcher.cancel_user_request` from Triton's ``execute`` and :meth:`InflightBatcher.step`
from its scheduler thread, and sends the :class:`EngineResponse` objects a step returns.

One :meth:`~InflightBatcher.step`:

1. **fetch**: move waiting requests to the active set while fewer than ``max_batch_size`` are active, in arrival
   order or, under ``waiting_queue_policy: priority``, highest ``priority`` first (:mod:`.waiting_queue`);
   each fetched LoRA request loads (weights + id) and pins (acquire) its adapter in the host tier, or
   fails with the executor's error (cache miss, cache full, validation);
2. **schedule**: decode rows first (one token each), then context rows while the step has
   ``max_num_tokens`` left; a context row takes its longest chain of cached KV-cache blocks for its task id
   from the :class:`~trtfleet_engines.reference.kv_blocks.BlockPool` and computes only the rest of its
   prompt, and waits while the pool cannot reserve its blocks; a LoRA row runs only once its adapter is on
   the device tier (otherwise it waits for a later step);
3. **run** one ``model.step`` over the mixed batch (rows with different adapters share it);
4. **store** the full prompt blocks of the rows that just prefilled in the pool (reuse on), then **sample**
   each row (greedy or seeded), stream the token, and retire finished requests at once (``end_id``,
   ``request_output_len``, stop words, ``max_seq_len``, cancellation), releasing their adapter and blocks.

With a :class:`~trtfleet_engines.reference.speculation.Speculator` a greedy decode row carries its request's
draft after its last token (``1 + k`` tokens, within the step's ``max_num_tokens`` and the request's remaining
output), the model returns the logits of every token of that row (``step_rows``), and the row keeps the drafts
its greedy choice agrees with plus that choice; the rejected positions leave the KV cache again
(``state.length``). So a step can give a request several tokens and the output is the one greedy decoding
gives. The speculator's counters go into :class:`BatcherStats` and each final response carries the request's
drafted and accepted tokens (Triton's ``total_draft_tokens`` / ``total_accepted_draft_tokens``).

Output semantics follow the TRT-LLM backend: a streaming response carries only the new tokens; the one
non-streaming response carries the prompt plus the output unless ``exclude_input_in_output``; ``end_id``
is never part of the output. Errors go out as responses with ``error`` set (the shell wraps nothing:
the texts are final); :class:`~trtfleet_engines.reference.errors.EnqueueRejected` is raised by ``submit``.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Generic, Protocol, TypeVar, cast

import numpy as np
from numpy.typing import NDArray

from trtfleet_engines.reference.batch_types import (
    KV_TOKENS_PER_BLOCK,
    BatcherStats,
    BatchLimits,
    EngineResponse,
    GenerationRequest,
    LoraInputs,
)
from trtfleet_engines.reference.errors import (
    PROMPT_TOO_LONG_TEXT,
    EnqueueRejected,
    ExecutorRequestFailed,
    QueueFullError,
)
from trtfleet_engines.reference.kv_blocks import Allocation, BlockPool, KvCacheSettings
from trtfleet_engines.reference.numpy_llama import StepRow
from trtfleet_engines.reference.sampling import sample_token
from trtfleet_engines.reference.speculation import Speculator
from trtfleet_engines.reference.waiting_queue import WaitingQueue, WaitingQueuePolicy, waiting_queue

logger = logging.getLogger(__name__)

H = TypeVar("H")

__all__ = [
    "KV_TOKENS_PER_BLOCK",
    "AdapterCache",
    "BatchLimits",
    "BatcherStats",
    "EngineResponse",
    "GenerationRequest",
    "InflightBatcher",
    "LoraInputs",
    "PrefixModel",
    "StepModel",
]


class StepModel(Protocol):
    """What the batcher needs from a model (``numpy_llama.TinyLlama`` implements it)."""

    def new_sequence(self) -> Any: ...

    def step(self, rows: Sequence[StepRow]) -> NDArray[Any]: ...


class VerifyingModel(StepModel, Protocol):
    """A model that returns the logits of every token of a row (needed to verify drafts)."""

    def step_rows(self, rows: Sequence[StepRow]) -> list[NDArray[Any]]: ...


class PrefixModel(StepModel, Protocol):
    """A model whose prefill can start from cached K/V (needed for block reuse)."""

    def export_kv(self, state: Any, start: int, stop: int) -> Any: ...

    def sequence_from(self, prefix: Sequence[Any]) -> Any: ...


class AdapterCache(Protocol):
    """The LoRA cache as the batcher uses it (``adapters.AdapterStore`` implements it)."""

    def admit(self, request_id: int, lora: LoraInputs) -> Any:
        """Load (if weights came) and pin the adapter; returns the model's adapter object.

        Raises ExecutorRequestFailed with TRT-LLM's text on a miss, a full cache or bad tensors."""
        ...

    def ensure_device(self, task_id: int) -> bool: ...

    def release(self, task_id: int) -> None: ...

    @property
    def copied_bytes_total(self) -> int:
        """Bytes copied from the host tier to the device tier so far (whole cache pages)."""
        ...


def _priority_of(seq: _Active[Any]) -> float:
    return seq.request.priority


@dataclass(eq=False)
class _Active(Generic[H]):
    request_id: int
    request: GenerationRequest
    handle: H
    rng: np.random.Generator
    task_id: int | None = None
    adapter: Any = None
    state: Any = None
    allocation: Allocation | None = None
    cached_tokens: int = 0
    generated: list[int] = field(default_factory=list)
    draft: tuple[int, ...] = ()
    """The draft verified in the current step."""
    drafted: int = 0
    accepted: int = 0
    steps: int = 0
    """Steps that gave this request tokens (its prefill included)."""

    @property
    def in_context(self) -> bool:
        return self.state is None


class InflightBatcher(Generic[H]):
    """The executor: a waiting queue, an active set and one model step at a time. Not thread-safe."""

    def __init__(
        self,
        model: StepModel,
        limits: BatchLimits,
        adapters: AdapterCache | None = None,
        kv_cache: BlockPool | None = None,
        speculator: Speculator | None = None,
        waiting_policy: WaitingQueuePolicy = WaitingQueuePolicy.FCFS,
    ) -> None:
        """``kv_cache`` None: a pool of ``max_batch_size x max_seq_len`` tokens without reuse (accounting
        only). A pool with reuse needs a :class:`PrefixModel`, a ``speculator`` a :class:`VerifyingModel`.
        ``waiting_policy``: the waiting queue's order (``priority``: by each request's ``priority``)."""
        self.model = model
        self.speculator = speculator
        self.limits = limits
        self.adapters = adapters
        self.kv_cache = kv_cache or BlockPool(
            KvCacheSettings(
                max_blocks=math.ceil(limits.max_batch_size * limits.max_seq_len / KV_TOKENS_PER_BLOCK),
                enable_block_reuse=False,
            )
        )
        self._prompt_tokens = 0
        self._computed_tokens = 0
        self._next_request_id = 1
        self._waiting: WaitingQueue[_Active[H]] = waiting_queue(waiting_policy, _priority_of)
        self._active: list[_Active[H]] = []
        self._cancelled: set[int] = set()
        self._iterations = 0
        self._last_scheduled = 0
        self._last_context = 0
        self._last_context_tokens = 0
        self._request_steps = 0
        self._output_tokens = 0
        self._last_generation_tokens = 0

    # -- called from Triton's execute ------------------------------------------------------
    def submit(self, request: GenerationRequest, handle: H) -> int:
        """Queue a request; returns its executor request id. Raises EnqueueRejected / QueueFullError."""
        limits = self.limits
        if limits.max_queue_size and len(self._waiting) >= limits.max_queue_size:
            raise QueueFullError(limits.max_queue_size)
        if not request.prompt:
            raise EnqueueRejected("input_ids must contain at least one token")
        if len(request.prompt) > limits.max_input_len:
            raise EnqueueRejected(
                PROMPT_TOO_LONG_TEXT.format(length=len(request.prompt), max_input_len=limits.max_input_len)
            )
        if len(request.prompt) > limits.max_num_tokens:  # no chunked context: a prompt must fit one step
            raise EnqueueRejected(
                f"Prompt length ({len(request.prompt)}) exceeds max_num_tokens ({limits.max_num_tokens}), "
                "the most tokens one step can schedule"
            )
        if request.max_new_tokens < 1:
            raise EnqueueRejected("request_output_len must be at least 1")
        pool = self.kv_cache
        needed = pool.blocks_for(len(request.prompt) + self._max_new_tokens(request))
        if needed > pool.settings.max_blocks:
            raise EnqueueRejected(
                f"the request needs {needed} KV-cache blocks of {pool.settings.tokens_per_block} tokens "
                f"(prompt + output) and the cache has {pool.settings.max_blocks}"
            )
        request_id = self._next_request_id
        self._next_request_id += 1
        self._waiting.append(_Active(request_id, request, handle, request.sampling.new_generator()))
        logger.debug("queued request %s user_id=%r prompt=%d", request_id, request.user_id, len(request.prompt))
        return request_id

    def cancel_user_request(self, user_id: str) -> int:
        """A ``stop`` request: cancel every request with Triton request id ``user_id``; returns how many."""
        ids = [s.request_id for s in (*self._waiting, *self._active) if user_id and s.request.user_id == user_id]
        self._cancelled.update(ids)
        return len(ids)

    def cancel(self, request_id: int) -> None:
        """The client went away: end ``request_id`` at the next step."""
        self._cancelled.add(request_id)

    # -- queries ---------------------------------------------------------------------------
    def has_work(self) -> bool:
        return bool(self._waiting or self._active)

    def handles(self) -> list[tuple[int, H]]:
        """(request id, handle) of every waiting and active request (for cancellation polling)."""
        return [(s.request_id, s.handle) for s in (*self._waiting, *self._active)]

    @property
    def computed_prompt_tokens(self) -> int:
        """Prompt positions the model computed so far (reused KV blocks skipped); cheaper than :meth:`stats`."""
        return self._computed_tokens

    def stats(self) -> BatcherStats:
        limits = self.limits
        pool = self.kv_cache
        private = sum(
            pool.blocks_for(len(s.request.prompt) + len(s.generated)) - len(s.allocation.shared)
            for s in self._active
            if s.allocation is not None
        )
        counters = pool.counters
        speculator = self.speculator
        iteration = speculator.last_iteration if speculator is not None else None
        generation = self._last_scheduled - self._last_context
        return BatcherStats(
            active_requests=len(self._active),
            max_active_requests=limits.max_batch_size,
            scheduled_requests=self._last_scheduled,
            context_requests=self._last_context,
            generation_requests=self._last_scheduled - self._last_context,
            waiting_requests=len(self._waiting),
            paused_requests=0,
            context_tokens=self._last_context_tokens,
            iterations=self._iterations,
            kv_max_blocks=pool.settings.max_blocks,
            kv_used_blocks=private + pool.held_cached_blocks,
            kv_tokens_per_block=pool.settings.tokens_per_block,
            kv_reused_blocks=counters.reused_blocks,
            kv_missed_blocks=counters.missed_blocks,
            kv_alloc_total_blocks=counters.alloc_total_blocks,
            kv_alloc_new_blocks=counters.alloc_new_blocks,
            kv_cache_hit_rate=counters.cache_hit_rate,
            prefill_tokens_computed=self._computed_tokens,
            prompt_tokens=self._prompt_tokens,
            request_steps=self._request_steps,
            output_tokens=self._output_tokens,
            avg_decoded_tokens_per_iter=self._last_generation_tokens / generation if generation else 0.0,
            speculative=speculator is not None,
            spec_draft_tokens=speculator.total.drafted if speculator else 0,
            spec_accepted_tokens=speculator.total.accepted if speculator else 0,
            spec_steps_with_drafts=speculator.total.steps_with_drafts if speculator else 0,
            spec_iter_draft_tokens=iteration.num_draft_tokens if iteration else 0,
            spec_iter_accepted_tokens=iteration.num_accepted_tokens if iteration else 0,
            spec_iter_requests_with_drafts=iteration.num_requests_with_draft_tokens if iteration else 0,
            spec_by_adapter=tuple(sorted((task, c.drafted, c.accepted) for task, c in speculator.by_adapter.items()))
            if speculator else (),
        )

    # -- the scheduler loop ----------------------------------------------------------------
    def next_arrival_s(self) -> float | None:
        """The earliest ``arrives_at_s`` of the waiting requests, when it is later than every fetched one's (their
        weights still on the link); None when none waits with one."""
        pending = [seq.request.arrives_at_s for seq in self._waiting if seq.request.arrives_at_s > -math.inf]
        return min(pending) if pending else None

    @property
    def copied_adapter_bytes(self) -> int:
        """Bytes of adapters copied to the device tier so far (0 without LoRA)."""
        return self.adapters.copied_bytes_total if self.adapters is not None else 0

    def step(self, now_s: float = math.inf) -> list[EngineResponse[H]]:
        """One iteration: cancel, fetch, schedule, run, sample, retire. Returns the responses to send. Requests
        that arrive after ``now_s`` (``arrives_at_s``: weights still on the link) are not fetched yet."""
        out: list[EngineResponse[H]] = []
        self._retire_cancelled(out)
        self._fetch(out, now_s)
        rows, scheduled = self._schedule()
        if not rows:
            return out
        self._iterations += 1
        prefilling = [seq for seq in scheduled if not seq.generated]
        if self.speculator is None:
            logits: Sequence[NDArray[Any]] = list(self.model.step(rows))
        else:
            logits = cast(VerifyingModel, self.model).step_rows(rows)
        for seq in prefilling:
            self._store_prompt_blocks(seq)
        verified: list[tuple[int | None, int, int]] = []
        self._last_generation_tokens = 0
        for seq, row_logits in zip(scheduled, logits, strict=True):
            decoding = bool(seq.generated)
            tokens = self._verify(seq, row_logits, verified) if seq.draft else (
                sample_token(row_logits if row_logits.ndim == 1 else row_logits[-1], seq.request.sampling, seq.rng),)
            if decoding:
                self._last_generation_tokens += len(tokens)
            self._advance(seq, tokens, out)
        if self.speculator is not None:
            self.speculator.record_iteration(verified)
        return out

    def _verify(self, seq: _Active[H], logits: NDArray[Any], verified: list[tuple[int | None, int, int]]) -> tuple[
            int, ...]:
        """The tokens a draft gives: the drafts the greedy choice agrees with, then that choice; the rejected
        drafts leave the KV cache."""
        draft, accepted = seq.draft, 0
        choices = [int(np.argmax(row)) for row in logits]
        while accepted < len(draft) and choices[accepted] == draft[accepted]:
            accepted += 1
        seq.state.length -= len(draft) - accepted
        seq.drafted += len(draft)
        seq.accepted += accepted
        verified.append((seq.task_id, len(draft), accepted))
        seq.draft = ()
        return (*draft[:accepted], choices[accepted])

    def _max_new_tokens(self, request: GenerationRequest) -> int:
        return max(min(request.max_new_tokens, self.limits.max_seq_len - len(request.prompt)), 0)

    def _store_prompt_blocks(self, seq: _Active[H]) -> None:
        if seq.allocation is None or not self.kv_cache.settings.enable_block_reuse:
            return
        model = cast(PrefixModel, self.model)  # reuse requires one (see __init__)
        state = seq.state
        self.kv_cache.store(seq.allocation, lambda start, stop: model.export_kv(state, start, stop))

    def abort_all(self, text: str) -> list[EngineResponse[H]]:
        """Fail every waiting and active request with ``text`` (the model is being unloaded)."""
        out = [
            EngineResponse(seq.handle, seq.request_id, (), final=True, error=text)
            for seq in (*self._waiting, *self._active)
        ]
        for seq in list(self._active):
            self._retire(seq)
        self._waiting.clear()
        return out

    def _retire_cancelled(self, out: list[EngineResponse[H]]) -> None:
        if not self._cancelled:
            return
        for seq in [s for s in self._waiting if s.request_id in self._cancelled]:
            self._waiting.remove(seq)
            out.append(self._final(seq, new_tokens=()))
        for seq in [s for s in self._active if s.request_id in self._cancelled]:
            self._retire(seq)
            out.append(self._final(seq, new_tokens=()))
        self._cancelled.clear()

    def _fetch(self, out: list[EngineResponse[H]], now_s: float = math.inf) -> None:
        def arrived(seq: _Active[H]) -> bool:  # one still on the link keeps its place in the queue
            return seq.request.arrives_at_s <= now_s

        while len(self._active) < self.limits.max_batch_size:
            seq = self._waiting.pop_first(arrived)
            if seq is None:
                break
            lora = seq.request.lora
            if lora is not None and self.adapters is not None and _uses_lora(lora):
                try:
                    seq.adapter = self.adapters.admit(seq.request_id, lora)
                except ExecutorRequestFailed as exc:
                    logger.debug("request %s failed at fetch: %s", seq.request_id, exc.reason)
                    out.append(EngineResponse(seq.handle, seq.request_id, (), final=True, error=exc.text))
                    continue
                seq.task_id = lora.task_id
            self._active.append(seq)

    def _schedule(self) -> tuple[list[StepRow], list[_Active[H]]]:
        budget = self.limits.max_num_tokens
        rows: list[StepRow] = []
        scheduled: list[_Active[H]] = []
        self._last_context = self._last_context_tokens = 0
        ordered = [s for s in self._active if not s.in_context] + [s for s in self._active if s.in_context]
        pool = self.kv_cache
        for seq in ordered:
            prompt = seq.request.prompt
            if seq.in_context:
                cached = len(pool.match(prompt, seq.task_id)) * pool.settings.tokens_per_block
                tokens = prompt[cached:]
            else:
                seq.draft = self._draft(seq, budget)
                tokens = (seq.generated[-1], *seq.draft)
            if len(tokens) > budget:
                continue
            if seq.task_id is not None and self.adapters is not None and not self.adapters.ensure_device(seq.task_id):
                continue  # every device page is pinned: wait for a later step
            if seq.in_context:
                allocation = pool.allocate(prompt, seq.task_id, self._max_new_tokens(seq.request))
                if allocation is None:
                    continue  # the KV cache cannot hold it yet: wait for requests to finish
                seq.allocation = allocation
                seq.cached_tokens = allocation.reused_tokens
                tokens = prompt[seq.cached_tokens :]
                shared = [block.payload for block in allocation.shared]
                seq.state = cast(PrefixModel, self.model).sequence_from(shared) if shared else self.model.new_sequence()
                self._last_context += 1
                self._last_context_tokens += len(tokens)
                self._prompt_tokens += len(prompt)
                self._computed_tokens += len(tokens)
            budget -= len(tokens)
            rows.append(StepRow(seq.state, np.asarray(tokens, dtype=np.int32), seq.adapter, bool(seq.draft)))
            scheduled.append(seq)
        self._last_scheduled = len(scheduled)
        return rows, scheduled

    def _draft(self, seq: _Active[H], budget: int) -> tuple[int, ...]:
        """The draft a greedy decode row verifies this step (none without a speculator or room for one)."""
        speculator, request = self.speculator, seq.request
        if speculator is None or not request.sampling.greedy:
            return ()
        length = len(request.prompt) + len(seq.generated)
        room = min(
            speculator.draft_len(len(self._active)),
            request.max_new_tokens - len(seq.generated) - 1,  # the verification adds one token of its own
            self.limits.max_seq_len - length - 1,
            budget - 1,
        )
        if room < 1:
            return ()
        return speculator.propose(seq.request_id, (*request.prompt, *seq.generated), room)

    def _advance(self, seq: _Active[H], tokens: Sequence[int], out: list[EngineResponse[H]]) -> None:
        """Append a step's tokens to ``seq`` up to the first that ends it; stream or finish."""
        request = seq.request
        seq.steps += 1
        emitted: list[int] = []
        for token in tokens:
            if request.end_id is not None and token == request.end_id:
                self._retire(seq)
                out.append(self._final(seq, new_tokens=tuple(emitted)))
                return
            seq.generated.append(token)
            emitted.append(token)
            self._output_tokens += 1
            total = len(request.prompt) + len(seq.generated)
            if (
                len(seq.generated) >= request.max_new_tokens
                or total >= self.limits.max_seq_len
                or _ends_with_stop_word(seq.generated, request.stop_words)
            ):
                self._retire(seq)
                out.append(self._final(seq, new_tokens=tuple(emitted)))
                return
        if self.speculator is not None:
            self.speculator.observe(seq.request_id, (*request.prompt, *seq.generated))
        if request.streaming:
            out.append(EngineResponse(seq.handle, seq.request_id, tuple(emitted), final=False))

    def _retire(self, seq: _Active[H]) -> None:
        if seq in self._active:
            self._active.remove(seq)
            self._request_steps += seq.steps
            if self.speculator is not None:
                self.speculator.release(seq.request_id)
            if seq.task_id is not None and self.adapters is not None:
                self.adapters.release(seq.task_id)
        if seq.allocation is not None:
            self.kv_cache.release(seq.allocation)
            seq.allocation = None
        seq.state = None

    def _final(self, seq: _Active[H], *, new_tokens: tuple[int, ...]) -> EngineResponse[H]:
        request = seq.request
        if request.streaming:
            output = new_tokens
        elif request.exclude_input_in_output:
            output = tuple(seq.generated)
        else:
            output = request.prompt + tuple(seq.generated)
        logger.debug("request %s done: %d tokens", seq.request_id, len(seq.generated))
        return EngineResponse(seq.handle, seq.request_id, output, final=True, cached_tokens=seq.cached_tokens,
                              draft_tokens=seq.drafted, accepted_draft_tokens=seq.accepted)


def _uses_lora(lora: LoraInputs) -> bool:
    return lora.task_id is not None or lora.weights is not None or lora.config is not None


def _ends_with_stop_word(generated: Sequence[int], stop_words: Sequence[tuple[int, ...]]) -> bool:
    return any(word and tuple(generated[-len(word) :]) == word for word in stop_words)
