"""The Files and Batches operations over a :class:`BatchBook`.

Writers: a batch record is written by the process that creates it and afterwards only by the runner
(under this service's lock). A cancel is a marker object of its own (``cancels/<id>``), written by
whichever router answers ``POST /v1/batches/{id}/cancel``; reads overlay it (a cancellable batch with a
marker reads as ``cancelling``) and the runner's next write makes that durable in the record. So any
router replica may serve the API while one runner works. Store calls run in a worker thread.

Ownership: every read, list, delete and cancel takes the ``caller`` (the sha256 of the API key that
asks; None: unrestricted, when keys are off and for the runner). An object another key owns answers as
if it did not exist (404 ``No such ... object``), as OpenAI does (:func:`~trtfleet.batch.records.visible_to`).
"""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Callable
from typing import Any, Final

from trtfleet.batch.book import BatchBook
from trtfleet.batch.errors import InvalidBatchRequest, NotFound
from trtfleet.batch.records import BatchRecord, BatchStatus, FileRecord, new_batch, visible_to

UPLOAD_PURPOSES: Final = ("batch",)
LIST_LIMIT_DEFAULT: Final = 20
LIST_LIMIT_MAX: Final = 100


def _new_id(prefix: str) -> str:
    return prefix + os.urandom(12).hex()


class BatchService:
    def __init__(self, book: BatchBook, *, clock: Callable[[], float] = time.time) -> None:
        self.book = book
        self.clock = clock
        self.lock = asyncio.Lock()
        self.changed = asyncio.Event()
        """Set when a batch is created or cancelled (the runner waits on it between batches)."""

    def now_s(self) -> int:
        return int(self.clock())

    async def _io(self, call: Callable[..., Any], *args: Any) -> Any:
        return await asyncio.to_thread(call, *args)

    # -- files -----------------------------------------------------------------------------------------
    async def upload(
        self, *, filename: str, purpose: str, data: bytes, file_id: str | None = None, owner: str | None = None
    ) -> FileRecord:
        if purpose not in UPLOAD_PURPOSES:
            raise InvalidBatchRequest(
                f"purpose must be one of {', '.join(UPLOAD_PURPOSES)} on this server, not {purpose!r}", param="purpose"
            )
        if not data:
            raise InvalidBatchRequest("the file is empty", param="file")
        record = FileRecord(file_id or _new_id("file-"), purpose, len(data), filename, self.now_s(), owner)
        await self._io(self.book.put_file, record, data)
        return record

    async def file(self, file_id: str, caller: str | None = None) -> FileRecord:
        record: FileRecord = await self._io(self.book.file, file_id)
        if not visible_to(record.owner, caller):
            raise NotFound(f"No such File object: {file_id}", param="file_id")
        return record

    async def files(self, purpose: str | None = None, caller: str | None = None) -> list[FileRecord]:
        records: list[FileRecord] = await self._io(self.book.files)
        return sorted(
            (r for r in records if (purpose is None or r.purpose == purpose) and visible_to(r.owner, caller)),
            key=lambda r: (-r.created_at, r.id),
        )

    async def file_content(self, file_id: str, caller: str | None = None) -> bytes:
        await self.file(file_id, caller)
        data: bytes = await self._io(self.book.file_content, file_id)
        return data

    async def delete_file(self, file_id: str, caller: str | None = None) -> None:
        await self.file(file_id, caller)
        async with self.lock:
            batches: list[BatchRecord] = await self._io(self.book.batches)
            users = [b.id for b in batches if b.input_file_id == file_id and not b.status.is_final]
            if users:
                raise InvalidBatchRequest(
                    f"file {file_id} is the input of unfinished batch {users[0]}; cancel it first", param="file_id"
                )
            await self._io(self.book.delete_file, file_id)

    # -- batches ---------------------------------------------------------------------------------------
    async def create(
        self,
        *,
        endpoint: Any,
        input_file_id: Any,
        completion_window: Any,
        metadata: Any = None,
        source: str = "api",
        batch_id: str | None = None,
        priority: int = 0,
        allowed_models: tuple[str, ...] | None = None,
        owner: str | None = None,
    ) -> BatchRecord:
        if not isinstance(input_file_id, str):
            raise InvalidBatchRequest("input_file_id must be a string", param="input_file_id")
        try:
            input_file = await self.file(input_file_id, owner)
        except NotFound as exc:
            raise InvalidBatchRequest(f"No such File object: {input_file_id}", param="input_file_id") from exc
        record = new_batch(
            batch_id=batch_id or _new_id("batch_"),
            endpoint=endpoint,
            input_file=input_file,
            completion_window=completion_window,
            metadata=metadata,
            now_s=self.now_s(),
            source=source,
            priority=priority,
            allowed_models=allowed_models,
            owner=owner,
        )
        async with self.lock:
            await self._io(self.book.put_batch, record)
        self.changed.set()
        return record

    async def batch(self, batch_id: str, caller: str | None = None) -> BatchRecord:
        """The record with a pending cancel request applied."""
        record: BatchRecord = await self._io(self.book.batch, batch_id)
        if not visible_to(record.owner, caller):
            raise NotFound(f"No such Batch object: {batch_id}", param="batch_id")
        if record.status.cancellable:
            requested_at = await self._io(self.book.cancel_requested_at, batch_id)
            if requested_at is not None:
                record = record.moved_to(BatchStatus.CANCELLING, requested_at)
        return record

    async def batches(
        self, *, limit: int = LIST_LIMIT_DEFAULT, after: str | None = None, caller: str | None = None
    ) -> tuple[list[BatchRecord], bool]:
        """A page of batches, newest first, after the batch ``after``; and whether more follow."""
        if not 1 <= limit <= LIST_LIMIT_MAX:
            raise InvalidBatchRequest(f"limit must be from 1 to {LIST_LIMIT_MAX}", param="limit")
        records: list[BatchRecord] = [r for r in await self._io(self.book.batches) if visible_to(r.owner, caller)]
        cancelled: set[str] = set(await self._io(self.book.cancel_requests))
        records = [await self.batch(r.id) if r.id in cancelled and r.status.cancellable else r for r in records]
        start = 0
        if after is not None:
            ids = [r.id for r in records]
            if after not in ids:
                raise InvalidBatchRequest(f"No such Batch object: {after}", param="after")
            start = ids.index(after) + 1
        page = records[start : start + limit]
        return page, start + limit < len(records)

    async def cancel(self, batch_id: str, caller: str | None = None) -> BatchRecord:
        """``validating``/``in_progress`` -> ``cancelling`` (the runner finishes the lines in flight, then
        ``cancelled``); a batch already cancelling or cancelled is answered as it is; others are refused."""
        record = await self.batch(batch_id, caller)
        if record.status in (BatchStatus.CANCELLING, BatchStatus.CANCELLED):
            return record
        if not record.status.cancellable:
            raise InvalidBatchRequest(
                f"Cannot cancel a batch with status '{record.status.value}'.", code="batch_not_cancellable"
            )
        await self._io(self.book.request_cancel, batch_id, self.now_s())
        self.changed.set()
        return await self.batch(batch_id)

    async def update(self, batch_id: str, change: Callable[[BatchRecord], BatchRecord]) -> BatchRecord:
        """Read, change and write a batch record under the lock (written only when it changed)."""
        async with self.lock:
            record = await self.batch(batch_id)
            changed = change(record)
            if changed != record:
                await self._io(self.book.put_batch, changed)
            return changed
