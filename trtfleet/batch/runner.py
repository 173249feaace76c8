"""The batch runner: takes each unfinished batch from the store and drives it to a final status.

Per batch: validate the input (rejected lines to chunk 0, then ``in_progress``); run the lines not yet
in a committed chunk, grouped by model (:func:`~trtfleet.batch.lines.order_by_model`), one model per
ready pod at once (:mod:`~trtfleet.batch.lanes`, the gate's :meth:`CapacityGate.lanes`), at most
``window`` lines at once, each admitted by :func:`admit` (free capacity, or the minimum rate); the window
follows interactive load AIMD-style (:func:`next_window`: halved at most once per ``backoff_interval_s``
while the gate reports interactive pressure, grown by one line per window of finished lines up to
``concurrency`` otherwise); commit
answers in chunks of ``chunk_lines`` (or every ``chunk_interval_s``); then finalize. A runner killed at
any point resumes from the chunks: a line whose answer was not committed runs again, a committed one
never does. Retryable answers (the fleet is busy, has no pod, or is shutting down) are retried after
a back-off until the batch ends; every other answer is a result line.

What executes a line and what says whether the fleet has free capacity are seams
(:class:`LineExecutor`, :class:`CapacityGate`): the router passes its own dispatch path and load view.
Only one runner may work on a store at a time (see docs/operations.md).
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Final, Protocol

from trtfleet.batch.errors import BatchLayerError, NotFound
from trtfleet.batch.lanes import LineLanes
from trtfleet.batch.lines import (
    BatchLine,
    ParsedInput,
    is_success,
    order_by_model,
    parse_input,
    response_line,
    result_id,
)
from trtfleet.batch.records import BatchRecord, BatchStatus, LineErrorSummary, RequestCounts
from trtfleet.batch.service import BatchService

log = logging.getLogger(__name__)

RETRY_BACKOFF_MAX_S: Final = 5.0
CONCURRENCY_DEFAULT: Final = 8


@dataclass(frozen=True, slots=True)
class Answer:
    """What executing one line gave: an HTTP status and OpenAI body; ``retry_after_s`` set when the
    line should run again later instead of being answered (the fleet was busy or had no pod)."""

    status_code: int
    body: Mapping[str, Any]
    request_id: str
    retry_after_s: float | None = None


class LineExecutor(Protocol):
    async def execute(self, endpoint: str, item: BatchLine, request_id: str) -> Answer: ...


class CapacityGate(Protocol):
    def has_free_capacity(self, model: str) -> bool:
        """Whether the pods serving ``model`` have a free slot beyond interactive traffic."""
        ...

    def interactive_pressure(self, model: str, since_s: float) -> bool:
        """Whether interactive requests for ``model``'s pods waited (or answered slowly) at or after
        ``since_s`` (on the runner's monotonic clock)."""
        ...

    def lanes(self, model: str) -> int:
        """How many models' lines to run at once: the ready pods serving ``model`` (at least 1)."""
        ...


@dataclass(frozen=True, slots=True)
class RunnerSettings:
    concurrency: int = CONCURRENCY_DEFAULT
    """Lines in flight at once, at most."""
    chunk_lines: int = 64
    chunk_interval_s: float = 2.0
    min_interval_s: float = 1.0
    """The minimum rate: a line is admitted at least this often even with no free capacity."""
    poll_interval_s: float = 0.05
    idle_poll_s: float = 5.0
    """Between scans of the store when nothing changed (a Batch resource or another writer)."""
    group_by_model: bool = True
    """Run each model's lines together (False: input order, for comparison in bench.batch)."""
    backoff_interval_s: float = 1.0
    """The window is halved at most this often while interactive pressure lasts."""


def admit(
    *,
    free_capacity: bool,
    inflight: int,
    since_last_admit_s: float,
    settings: RunnerSettings,
    window: float | None = None,
) -> bool:
    """Whether the next line may start: below the window (``concurrency`` when None), and free capacity or
    the minimum rate due."""
    limit = settings.concurrency if window is None else max(1, int(window))
    if inflight >= limit:
        return False
    return free_capacity or since_last_admit_s >= settings.min_interval_s


def next_window(
    window: float, *, pressure: bool, finished: int, since_cut_s: float, settings: RunnerSettings
) -> tuple[float, bool]:
    """AIMD on the lines in flight (pure): (new window, whether this was a cut). Under interactive pressure
    the window halves (down to 1) once per ``backoff_interval_s`` and does not grow; without it, each
    finished line adds ``1 / window`` (one line per window's worth), up to ``concurrency``."""
    if pressure:
        if since_cut_s >= settings.backoff_interval_s:
            return max(1.0, window / 2), True
        return window, False
    return min(float(settings.concurrency), window + finished / max(window, 1.0)), False


class BatchRunner:
    def __init__(
        self,
        service: BatchService,
        executor: LineExecutor,
        gate: CapacityGate,
        serves: Callable[[str], bool],
        settings: RunnerSettings | None = None,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        self.service = service
        self.executor = executor
        self.gate = gate
        self.serves = serves
        self.settings = settings or RunnerSettings()
        self.monotonic = monotonic
        self.lines_started = 0
        self.window_cuts = 0

    async def run(self) -> None:
        """Forever: run every unfinished batch (highest priority, then oldest first), then wait for a change
        or ``idle_poll_s``."""
        while True:
            self.service.changed.clear()
            try:
                await self.run_pending()
            except Exception:  # a bug or an unreadable record must not end batch processing for good
                log.exception("batch runner pass failed; retrying after the idle poll")
            try:
                await asyncio.wait_for(self.service.changed.wait(), self.settings.idle_poll_s)
            except TimeoutError:
                pass

    async def run_pending(self) -> None:
        records: list[BatchRecord] = await asyncio.to_thread(self.service.book.batches)
        for record in sorted(records, key=lambda r: (-r.priority, r.created_at, r.id)):
            if not record.status.is_final:
                try:
                    await self.run_batch(record.id)
                except BatchLayerError as exc:
                    log.warning("batch not finished", extra={"ctx": {"batch": record.id, "error": exc.message}})

    async def run_batch(self, batch_id: str) -> BatchRecord:
        record = await self.service.batch(batch_id)
        if record.status is BatchStatus.VALIDATING:
            record = await self._validate(record)
        if record.status in (BatchStatus.IN_PROGRESS, BatchStatus.CANCELLING, BatchStatus.FINALIZING):
            parsed = await self._parsed(record, lambda _model: True)
            if record.status is BatchStatus.IN_PROGRESS:
                await self._execute(record, parsed)
            record = await self._finalize(batch_id, parsed)
        return record

    async def _parsed(self, record: BatchRecord, serves: Callable[[str], bool]) -> ParsedInput:
        data = await self.service.file_content(record.input_file_id)
        return parse_input(data, batch_id=record.id, endpoint=record.endpoint, serves=serves)

    async def _validate(self, record: BatchRecord) -> BatchRecord:
        book, now_s = self.service.book, self.service.now_s()
        allowed = record.allowed_models

        def serves(model: str) -> bool:
            return self.serves(model) and (allowed is None or model in allowed)

        try:
            parsed = await self._parsed(record, serves)
        except NotFound:
            summary = LineErrorSummary("file_not_found", f"the input file {record.input_file_id} is gone")
            return await self._move(record.id, BatchStatus.FAILED, errors=(summary,))
        if parsed.total == 0:
            summary = LineErrorSummary("empty_file", "the input file has no request lines")
            return await self._move(record.id, BatchStatus.FAILED, errors=(summary,))
        await asyncio.to_thread(book.commit_chunk, record.id, 0, parsed.rejected)
        counts = RequestCounts(total=parsed.total, completed=0, failed=len(parsed.rejected))

        def start(current: BatchRecord) -> BatchRecord:
            if current.status is not BatchStatus.VALIDATING:  # cancelled meanwhile
                return dataclasses.replace(current, request_counts=counts)
            return dataclasses.replace(current.moved_to(BatchStatus.IN_PROGRESS, now_s), request_counts=counts)

        record = await self.service.update(record.id, start)
        log.info("batch started", extra={"ctx": {"batch": record.id, "lines": parsed.total}})
        return record

    async def _move(self, batch_id: str, status: BatchStatus, **changes: Any) -> BatchRecord:
        now_s = self.service.now_s()
        return await self.service.update(batch_id, lambda r: dataclasses.replace(r.moved_to(status, now_s), **changes))

    async def _execute(self, record: BatchRecord, parsed: ParsedInput) -> None:
        book, s = self.service.book, self.settings
        done = {row["id"] for row in await asyncio.to_thread(book.results, record.id)}
        ordered = order_by_model(parsed.lines) if s.group_by_model else list(parsed.lines)
        pending = LineLanes(i for i in ordered if result_id(record.id, i.custom_id, i.line) not in done)
        lines_of: dict[asyncio.Task[dict[str, Any] | None], BatchLine] = {}
        numbers = await asyncio.to_thread(book.chunk_numbers, record.id)
        next_chunk = max(numbers, default=0) + 1
        buffer: list[dict[str, Any]] = []
        inflight: set[asyncio.Task[dict[str, Any] | None]] = set()
        stop = asyncio.Event()
        last_admit_s = last_commit_s = checked_s = cut_s = self.monotonic()
        window, finished_count = float(s.concurrency), 0
        current = record
        while (pending and not stop.is_set()) or inflight:
            now = self.monotonic()
            lanes = 1
            if pending:
                lanes = self.gate.lanes(pending.peek().model) if s.group_by_model else 1
                pressure = self.gate.interactive_pressure(pending.peek(lanes).model, checked_s)
                window, cut = next_window(
                    window, pressure=pressure, finished=finished_count, since_cut_s=now - cut_s, settings=s
                )
                checked_s, finished_count = now, 0
                if cut:
                    cut_s = now
                    self.window_cuts += 1
            if not stop.is_set() and (
                current.status is not BatchStatus.IN_PROGRESS or self.service.now_s() >= current.expires_at
            ):
                stop.set()  # cancelled or expired: no new line; the ones in flight finish
            if pending and not stop.is_set():
                item = pending.peek(lanes)
                if admit(
                    free_capacity=self.gate.has_free_capacity(item.model),
                    inflight=len(inflight),
                    since_last_admit_s=now - last_admit_s,
                    settings=s,
                    window=window,
                ):
                    pending.take(lanes)
                    last_admit_s = now
                    self.lines_started += 1
                    task = asyncio.create_task(self._line(record, item, stop))
                    inflight.add(task)
                    lines_of[task] = item
                    continue
            finished, _ = await asyncio.wait(inflight, timeout=s.poll_interval_s) if inflight else (set(), set())
            if not inflight:
                await asyncio.sleep(s.poll_interval_s)
            finished_count += len(finished)
            for task in finished:
                inflight.discard(task)
                pending.done(lines_of.pop(task))
                result = task.result()
                if result is not None:
                    buffer.append(result)
            if buffer and (len(buffer) >= s.chunk_lines or self.monotonic() - last_commit_s >= s.chunk_interval_s):
                current = await self._commit(record.id, next_chunk, buffer)
                next_chunk, buffer, last_commit_s = next_chunk + 1, [], self.monotonic()
            elif self.monotonic() - last_commit_s >= s.chunk_interval_s:
                current, last_commit_s = await self.service.batch(record.id), self.monotonic()
        if buffer:
            await self._commit(record.id, next_chunk, buffer)

    async def _line(self, record: BatchRecord, item: BatchLine, stop: asyncio.Event) -> dict[str, Any] | None:
        """One line's result row; None when the batch stopped while the fleet kept asking to retry."""
        backoff_s = self.settings.poll_interval_s
        while True:
            answer = await self.executor.execute(record.endpoint, item, result_id(record.id, item.custom_id, item.line))
            if answer.retry_after_s is None:
                return response_line(record.id, item, answer.status_code, answer.request_id, answer.body)
            if stop.is_set():
                return None
            backoff_s = min(RETRY_BACKOFF_MAX_S, max(backoff_s * 2, answer.retry_after_s))
            try:
                await asyncio.wait_for(stop.wait(), backoff_s)
            except TimeoutError:
                continue

    async def _commit(self, batch_id: str, number: int, rows: list[dict[str, Any]]) -> BatchRecord:
        await asyncio.to_thread(self.service.book.commit_chunk, batch_id, number, rows)
        completed = sum(1 for r in rows if is_success(r))
        failed = len(rows) - completed

        def count(current: BatchRecord) -> BatchRecord:
            c = current.request_counts
            return dataclasses.replace(
                current, request_counts=RequestCounts(c.total, c.completed + completed, c.failed + failed)
            )

        return await self.service.update(batch_id, count)

    async def _finalize(self, batch_id: str, parsed: ParsedInput) -> BatchRecord:
        """Result files from the chunks, then the final status: ``cancelled`` after a cancel, else
        ``completed`` when every line has a result and ``expired`` when the window closed first."""
        record = await self.service.batch(batch_id)
        cancelled = record.status is BatchStatus.CANCELLING
        if not cancelled:
            record = await self._move(batch_id, BatchStatus.FINALIZING)
        now_s = self.service.now_s()
        output_id, error_id, completed, failed = await asyncio.to_thread(
            self.service.book.write_result_files, record, parsed.lines, now_s
        )
        if cancelled:
            final = BatchStatus.CANCELLED
        else:
            final = BatchStatus.COMPLETED if completed + failed >= parsed.total else BatchStatus.EXPIRED
        counts = RequestCounts(parsed.total, completed, failed)
        record = await self._move(
            batch_id, final, output_file_id=output_id, error_file_id=error_id, request_counts=counts
        )
        log.info(
            "batch finished",
            extra={"ctx": {"batch": batch_id, "status": final.value, "completed": completed, "failed": failed}},
        )
        return record
