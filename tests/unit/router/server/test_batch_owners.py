"""Files and batches are private to the API key that created them: through the official openai client
with two keys against a router with ``--api-keys``, another key's objects answer 404 (as OpenAI does), are
absent from its lists and cannot be cancelled or deleted; the store keeps only the key's sha256."""

from __future__ import annotations

import hashlib
import json
import time
from collections.abc import Iterator
from pathlib import Path

import openai
import pytest
from trtfleet_router.batch.wiring import BatchSettings

from tests.unit.router.harness import EchoFleet
from trtfleet.batch.records import visible_to
from trtfleet.batch.runner import RunnerSettings

ALICE, BOB = "sk-alice-0123456789", "sk-bob-9876543210"


@pytest.fixture
def fleet(tmp_path: Path) -> Iterator[EchoFleet]:
    keys = tmp_path / "keys.yaml"
    keys.write_text(json.dumps({"keys": [{"name": "alice", "key": ALICE}, {"name": "bob", "key": BOB}]}))
    batch = BatchSettings(store=str(tmp_path / "store"), runner=RunnerSettings(chunk_interval_s=0.1, idle_poll_s=0.5))
    started = EchoFleet(tmp_path, batch=batch, api_keys_path=keys)
    try:
        yield started
    finally:
        started.close()


def _client(fleet: EchoFleet, key: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=fleet.router.http_url + "/v1", api_key=key, max_retries=0, timeout=30)


def _rows(count: int) -> bytes:
    rows = (
        {"custom_id": f"c{i}", "method": "POST", "url": "/v1/completions", "body": {"model": "a1", "prompt": f"p{i}"}}
        for i in range(count)
    )
    return "".join(json.dumps(r) + "\n" for r in rows).encode()


@pytest.mark.parametrize(
    ("owner", "caller", "expected"),
    [
        pytest.param("a", "a", True, id="own-object"),
        pytest.param("a", "b", False, id="another-keys-object"),
        pytest.param(None, "b", True, id="unowned-object"),
        pytest.param("a", None, True, id="unrestricted-caller"),
    ],
)
def test_visibility(owner: str | None, caller: str | None, expected: bool) -> None:
    assert visible_to(owner, caller) is expected


def test_files_and_batches_are_private_to_their_key(fleet: EchoFleet, tmp_path: Path) -> None:
    alice, bob = _client(fleet, ALICE), _client(fleet, BOB)
    upload = alice.files.create(file=("in.jsonl", _rows(3)), purpose="batch")
    created = alice.batches.create(input_file_id=upload.id, endpoint="/v1/completions", completion_window="24h")

    assert [f.id for f in alice.files.list()] == [upload.id]
    assert [f.id for f in bob.files.list()] == []
    assert [b.id for b in bob.batches.list()] == []
    for call in (
        lambda: bob.files.retrieve(upload.id),
        lambda: bob.files.content(upload.id),
        lambda: bob.files.delete(upload.id),
        lambda: bob.batches.retrieve(created.id),
        lambda: bob.batches.cancel(created.id),
    ):
        with pytest.raises(openai.NotFoundError):
            call()
    with pytest.raises(openai.BadRequestError, match="No such File object"):  # another key's input file
        bob.batches.create(input_file_id=upload.id, endpoint="/v1/completions", completion_window="24h")

    deadline = time.monotonic() + 30
    while (batch := alice.batches.retrieve(created.id)).status != "completed":
        assert time.monotonic() < deadline, f"the batch is still {batch.status}"
        time.sleep(0.05)
    assert batch.output_file_id is not None
    assert len(alice.files.content(batch.output_file_id).text.splitlines()) == 3
    with pytest.raises(openai.NotFoundError):  # the results belong to the batch's key too
        bob.files.content(batch.output_file_id)
    assert sorted(f.id for f in alice.files.list()) == sorted([upload.id, batch.output_file_id])

    stored = b"".join(p.read_bytes() for p in (tmp_path / "store").rglob("*.json"))
    assert ALICE.encode() not in stored and BOB.encode() not in stored
    assert hashlib.sha256(ALICE.encode()).hexdigest().encode() in stored
