"""The local store's atomic writes and the book's files, batches and paging over it (s3:// is tested
against moto in tests/integration/test_s3_storage.py)."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from trtfleet.batch.book import BatchBook
from trtfleet.batch.errors import InvalidBatchRequest, NotFound, StoreError
from trtfleet.batch.records import BatchRecord, BatchStatus
from trtfleet.batch.service import BatchService
from trtfleet.batch.store import LocalStore, S3Store, open_store


def test_local_writes_replace_whole_objects_and_leave_no_temp_files(tmp_path: Path) -> None:
    store = LocalStore(tmp_path)
    store.put("a/b.json", b"one")
    store.put("a/b.json", b"two")
    assert store.get("a/b.json") == b"two" and store.keys("a/") == ["a/b.json"]
    (tmp_path / "a" / ".b.json.x.tmp").write_bytes(b"half")  # what a kill mid-write leaves behind
    assert store.keys("a/") == ["a/b.json"]
    with pytest.raises(NotFound):
        store.get("a/missing")
    for bad in ("../x", "/abs", "a//b", ""):
        with pytest.raises(StoreError):
            store.put(bad, b"")


def test_open_store_picks_the_implementation(tmp_path: Path) -> None:
    assert isinstance(open_store(str(tmp_path)), LocalStore)
    assert isinstance(open_store(f"file://{tmp_path}"), LocalStore)
    assert isinstance(open_store("s3://bucket/prefix"), S3Store)
    with pytest.raises(StoreError, match="unsupported"):
        open_store("gs://bucket")


def test_files_batches_and_pages(tmp_path: Path) -> None:
    async def scenario() -> None:
        clock = iter(range(100, 200))
        service = BatchService(BatchBook(LocalStore(tmp_path)), clock=lambda: float(next(clock)))
        upload = await service.upload(filename="in.jsonl", purpose="batch", data=b'{"x": 1}\n')
        assert (await service.file(upload.id)) == upload and await service.file_content(upload.id) == b'{"x": 1}\n'
        with pytest.raises(InvalidBatchRequest, match="purpose"):
            await service.upload(filename="x", purpose="fine-tune", data=b"x")
        ids = []
        for _ in range(5):
            created = await service.create(endpoint="/v1/completions", input_file_id=upload.id, completion_window="24h")
            assert created.status is BatchStatus.VALIDATING and created.expires_at == created.created_at + 86400
            ids.append(created.id)
        page, more = await service.batches(limit=2)
        assert [b.id for b in page] == ids[::-1][:2] and more
        page, more = await service.batches(limit=10, after=page[-1].id)
        assert [b.id for b in page] == ids[::-1][2:] and not more
        for field, kwargs in {
            "endpoint": {"endpoint": "/v1/embeddings", "input_file_id": upload.id, "completion_window": "24h"},
            "completion_window": {"endpoint": "/v1/completions", "input_file_id": upload.id, "completion_window": "1d"},
            "input_file_id": {"endpoint": "/v1/completions", "input_file_id": "file-nope", "completion_window": "24h"},
        }.items():
            with pytest.raises(InvalidBatchRequest) as caught:
                await service.create(**kwargs)
            assert caught.value.param == field
        with pytest.raises(InvalidBatchRequest, match="unfinished batch"):
            await service.delete_file(upload.id)
        stored = await service.batch(ids[0])
        assert BatchRecord.from_json(stored.to_json()) == stored
        with pytest.raises(NotFound):
            await service.batch("batch_missing")

    asyncio.run(scenario())
