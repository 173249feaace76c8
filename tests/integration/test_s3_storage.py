"""s3:// paths through the real boto3 client against moto's S3 server (an S3 API emulator started as a
local process: no real S3 can be reached from this machine). Covers the three places trtfleet talks to
S3: engines published by ``trtfleet engines build --out s3://...``, checkpoints fetched from an s3://
source, and adapter artifacts the router's weight store reads from s3://."""

from __future__ import annotations

import asyncio
import json
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import boto3
import numpy as np
import pytest
from trtfleet_engines import runner
from trtfleet_engines.plan import FetchStep
from trtfleet_router.errors import WeightsUnavailable
from trtfleet_router.weights import ArtifactRef, SchemeReader, WeightStore

from tests.integration.engines.test_engines_runner import Builds
from tests.unit.router.harness import write_artifact

pytestmark = pytest.mark.integration

BUCKET = "trtfleet-test"


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@pytest.fixture(scope="module")
def s3_endpoint() -> Iterator[str]:
    """moto's S3 server on loopback (from the dev dependencies; the venv's ``moto_server``)."""
    port = _free_port()
    server = Path(sys.executable).parent / "moto_server"
    assert server.is_file(), f"{server} is missing: run make install (moto[server] is a dev dependency)"
    proc = subprocess.Popen(
        [str(server), "-H", "127.0.0.1", "-p", str(port)], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE
    )
    deadline = time.monotonic() + 60
    while True:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            break
        except OSError:
            if proc.poll() is not None or time.monotonic() > deadline:
                proc.kill()
                stderr = proc.stderr.read() if proc.stderr else b""
                raise RuntimeError(f"moto_server did not start: {stderr!r}") from None
            time.sleep(0.1)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        proc.terminate()
        proc.wait(timeout=10)


@pytest.fixture
def s3(s3_endpoint: str, monkeypatch: pytest.MonkeyPatch) -> Any:
    """boto3's environment pointed at the server (what users set for S3-compatible stores), a fresh bucket."""
    for name, value in {
        "AWS_ENDPOINT_URL_S3": s3_endpoint,
        "AWS_ACCESS_KEY_ID": "test",
        "AWS_SECRET_ACCESS_KEY": "test",
        "AWS_DEFAULT_REGION": "us-east-1",
    }.items():
        monkeypatch.setenv(name, value)
    client = boto3.client("s3")
    for bucket in client.list_buckets().get("Buckets", []):
        objects = client.list_objects_v2(Bucket=bucket["Name"]).get("Contents", [])
        for item in objects:
            client.delete_object(Bucket=bucket["Name"], Key=item["Key"])
        client.delete_bucket(Bucket=bucket["Name"])
    client.create_bucket(Bucket=BUCKET)
    return client


def _keys(client: Any, prefix: str) -> list[str]:
    return sorted(item["Key"] for item in client.list_objects_v2(Bucket=BUCKET, Prefix=prefix).get("Contents", []))


def test_engine_build_publishes_to_s3_and_a_rerun_builds_nothing(s3: Any, tmp_path: Path) -> None:
    world = Builds(tmp_path)
    out = f"s3://{BUCKET}/engines/{world.plan.engine_hash_short}"
    result = runner.run_build(world.plan, out, env=world.env(), progress=lambda _line: None)
    assert result.status == "built"
    prefix = f"engines/{world.plan.engine_hash_short}/"
    keys = _keys(s3, prefix)
    manifest = json.loads(s3.get_object(Bucket=BUCKET, Key=prefix + "manifest.json")["Body"].read())
    assert manifest["engineHash"] == world.plan.engine_hash
    assert {prefix + entry["path"] for entry in manifest["files"]} | {prefix + "manifest.json"} == set(keys)
    for entry in manifest["files"]:
        data = s3.get_object(Bucket=BUCKET, Key=prefix + entry["path"])["Body"].read()
        assert len(data) == entry["bytes"]
    steps_run = world.ran()
    again = runner.run_build(world.plan, out, env=world.env(), progress=lambda _line: None)
    assert again.status == "already-built" and world.ran() == steps_run  # no step ran twice


def test_s3_source_is_downloaded_for_the_build(s3: Any, tmp_path: Path) -> None:
    for name, body in {"config.json": b"{}", "model.safetensors": b"weights", "tokenizer/vocab.txt": b"a\n"}.items():
        s3.put_object(Bucket=BUCKET, Key=f"models/tiny/{name}", Body=body)
    s3.put_object(Bucket=BUCKET, Key="models/tiny-other/config.json", Body=b"not this one")
    local = tmp_path / "source"
    step = FetchStep("fetch", "s3", f"s3://{BUCKET}/models/tiny", None, str(local), True)
    runner._download_s3(step)
    got = {p.relative_to(local).as_posix(): p.read_bytes() for p in local.rglob("*") if p.is_file()}
    assert got == {"config.json": b"{}", "model.safetensors": b"weights", "tokenizer/vocab.txt": b"a\n"}


def test_router_weight_store_reads_s3_artifacts(s3: Any, tmp_path: Path) -> None:
    sha = write_artifact(tmp_path / "upper", rows=3, width=8)
    for path in (tmp_path / "upper").iterdir():
        s3.upload_file(str(path), BUCKET, f"adapters/upper/{path.name}")
    store = WeightStore(reader=SchemeReader())
    weights = asyncio.run(store.get(ArtifactRef(f"s3://{BUCKET}/adapters/upper", sha)))
    assert weights.weights_raw == np.load(tmp_path / "upper" / "model.lora_weights.npy").tobytes()
    assert weights.weights_sha256 == sha
    with pytest.raises(WeightsUnavailable, match="was expected"):
        asyncio.run(WeightStore(reader=SchemeReader()).get(ArtifactRef(f"s3://{BUCKET}/adapters/upper", "0" * 64)))
    with pytest.raises(WeightsUnavailable, match=r"cannot fetch s3://trtfleet-test/adapters/missing/"):
        asyncio.run(WeightStore(reader=SchemeReader()).get(ArtifactRef(f"s3://{BUCKET}/adapters/missing")))


def test_batch_store_on_s3_keeps_files_batches_and_chunks(s3: Any) -> None:
    from trtfleet.batch.book import BatchBook
    from trtfleet.batch.errors import NotFound
    from trtfleet.batch.records import FileRecord
    from trtfleet.batch.store import open_store

    store = open_store(f"s3://{BUCKET}/batches-root")
    book = BatchBook(store)
    record = FileRecord("file-1", "batch", 3, "in.jsonl", 100)
    book.put_file(record, b"abc")
    assert book.file("file-1") == record and book.file_content("file-1") == b"abc" and book.files() == [record]
    book.commit_chunk("batch_1", 0, [])
    book.commit_chunk("batch_1", 1, [{"id": "r1", "custom_id": "c1", "response": None, "error": None}])
    book.commit_chunk("batch_1", 1, [{"id": "r1", "custom_id": "c1", "response": None, "error": None}])  # a rerun
    assert book.chunk_numbers("batch_1") == [0, 1] and [r["custom_id"] for r in book.results("batch_1")] == ["c1"]
    assert _keys(s3, "batches-root/chunks/") == [
        "batches-root/chunks/batch_1/00000000.jsonl",
        "batches-root/chunks/batch_1/00000001.jsonl",
    ]
    book.delete_file("file-1")
    with pytest.raises(NotFound):
        book.file("file-1")
