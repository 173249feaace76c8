"""The batch book: files, batches and committed result chunks laid out in a :class:`BlobStore`.

Layout::

    files/<file id>.json           the File object
    files/<file id>.data           its bytes
    batches/<batch id>.json        the Batch object (plus ``source``)
    chunks/<batch id>/<seq>.jsonl  committed result lines, one atomic object per chunk

A chunk is written once and never changed: the custom_ids in a batch's chunks are exactly the lines
that are done, so a runner that restarts after SIGKILL skips them and answers each custom_id once.
Should two runners ever overlap on a batch (a lost lease), the result files still hold each line once:
finalizing keeps the first committed row per result id.
Chunk 0 holds the rejected input lines (written when validation ends); later chunks hold answers.
Finalizing concatenates the chunks into the output and error files (ids derived from the batch's, so
a second finalization after a crash writes the same files).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from typing import Any, Final

from trtfleet.batch.errors import NotFound
from trtfleet.batch.lines import BatchLine, is_success, order_results
from trtfleet.batch.records import BatchRecord, FileRecord, error_file_id, output_file_id
from trtfleet.batch.store import BlobStore

CHUNK_DIGITS: Final = 8
VALIDATION_CHUNK: Final = 0


def _jsonl(results: Iterable[Mapping[str, Any]]) -> bytes:
    return b"".join(json.dumps(r, separators=(",", ":"), ensure_ascii=False).encode() + b"\n" for r in results)


def _read_jsonl(data: bytes) -> list[dict[str, Any]]:
    return [json.loads(line) for line in data.splitlines() if line.strip()]


class BatchBook:
    def __init__(self, store: BlobStore) -> None:
        self.store = store

    # -- files -----------------------------------------------------------------------------------------
    def put_file(self, record: FileRecord, data: bytes) -> None:
        """Bytes first, then the record: a file is listed only once its content is whole."""
        self.store.put(f"files/{record.id}.data", data)
        self.store.put(f"files/{record.id}.json", json.dumps(record.to_json()).encode())

    def file(self, file_id: str) -> FileRecord:
        try:
            return FileRecord.from_json(json.loads(self.store.get(f"files/{_safe(file_id)}.json")))
        except NotFound as exc:
            raise NotFound(f"No such File object: {file_id}", param="file_id") from exc

    def file_content(self, file_id: str) -> bytes:
        self.file(file_id)
        return self.store.get(f"files/{_safe(file_id)}.data")

    def files(self) -> list[FileRecord]:
        keys = [k for k in self.store.keys("files/") if k.endswith(".json")]
        return [FileRecord.from_json(json.loads(self.store.get(k))) for k in keys]

    def delete_file(self, file_id: str) -> None:
        self.file(file_id)
        self.store.delete(f"files/{_safe(file_id)}.json")
        self.store.delete(f"files/{_safe(file_id)}.data")

    # -- batches ---------------------------------------------------------------------------------------
    def put_batch(self, record: BatchRecord) -> None:
        self.store.put(f"batches/{record.id}.json", json.dumps(record.to_json()).encode())

    def batch(self, batch_id: str) -> BatchRecord:
        try:
            return BatchRecord.from_json(json.loads(self.store.get(f"batches/{_safe(batch_id)}.json")))
        except NotFound as exc:
            raise NotFound(f"No such Batch object: {batch_id}", param="batch_id") from exc

    def batches(self) -> list[BatchRecord]:
        """Every batch, newest first (ties by id, so pages are stable)."""
        keys = [k for k in self.store.keys("batches/") if k.endswith(".json")]
        records = [BatchRecord.from_json(json.loads(self.store.get(k))) for k in keys]
        return sorted(records, key=lambda r: (-r.created_at, r.id))

    def request_cancel(self, batch_id: str, now_s: int) -> None:
        """A cancel marker: written by any process, read by the runner (the only writer of records after
        their creation), so a cancel never races the runner's own writes."""
        self.store.put(f"cancels/{_safe(batch_id)}.json", json.dumps({"requested_at": now_s}).encode())

    def cancel_requests(self) -> list[str]:
        """Ids of the batches with a cancel marker."""
        return [k.removeprefix("cancels/").removesuffix(".json") for k in self.store.keys("cancels/")]

    def cancel_requested_at(self, batch_id: str) -> int | None:
        try:
            return int(json.loads(self.store.get(f"cancels/{_safe(batch_id)}.json"))["requested_at"])
        except NotFound:
            return None

    # -- result chunks ---------------------------------------------------------------------------------
    def chunk_numbers(self, batch_id: str) -> list[int]:
        prefix = f"chunks/{_safe(batch_id)}/"
        return sorted(int(k[len(prefix) :].split(".")[0]) for k in self.store.keys(prefix) if k.endswith(".jsonl"))

    def commit_chunk(self, batch_id: str, number: int, results: Iterable[Mapping[str, Any]]) -> None:
        self.store.put(f"chunks/{_safe(batch_id)}/{number:0{CHUNK_DIGITS}d}.jsonl", _jsonl(results))

    def results(self, batch_id: str) -> list[dict[str, Any]]:
        """Every committed result line, chunk by chunk."""
        found: list[dict[str, Any]] = []
        for number in self.chunk_numbers(batch_id):
            found.extend(_read_jsonl(self.store.get(f"chunks/{_safe(batch_id)}/{number:0{CHUNK_DIGITS}d}.jsonl")))
        return found

    def write_result_files(
        self, record: BatchRecord, lines: Iterable[BatchLine], now_s: int
    ) -> tuple[str | None, str | None, int, int]:
        """The output and error files from the committed chunks (in input order); returns their ids
        (None for an empty one, as OpenAI leaves it unset) and the completed / failed counts."""
        unique = {row["id"]: row for row in reversed(self.results(record.id))}  # the first commit of a line wins
        ordered = order_results(list(unique.values())[::-1], list(lines))
        outputs = [r for r in ordered if is_success(r)]
        errors = [r for r in ordered if not is_success(r)]
        ids: list[str | None] = []
        for file_id, rows, suffix in (
            (output_file_id(record.id), outputs, "output"),
            (error_file_id(record.id), errors, "errors"),
        ):
            if not rows:
                ids.append(None)
                continue
            data = _jsonl(rows)
            name = f"{record.id}_{suffix}.jsonl"
            self.put_file(FileRecord(file_id, "batch_output", len(data), name, now_s, record.owner), data)
            ids.append(file_id)
        return ids[0], ids[1], len(outputs), len(errors)


def _safe(identifier: str) -> str:
    """An id as a key part; an id with a path separator or dots cannot name a stored object."""
    if not identifier or "/" in identifier or identifier.startswith(".") or len(identifier) > 200:
        raise NotFound(f"No such object: {identifier!r}")
    return identifier
