"""OpenAI's Files and Batches API on the router, driven by the official ``openai`` client, in front of three
real reference workers (tritonserver, tiny Llama, converted adapters): answers equal the same requests
sent online, bad lines land in the error file, cancel keeps what finished; and a ``trtfleet router``
process killed with SIGKILL mid-batch, restarted on the same store, answers every custom_id once."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import openai
import pytest
from trtfleet_router.batch.wiring import BatchSettings

from tests.integration.router.support import ConvertedAdapter, fleet_config, reference_workers, router_for
from tests.integration.router.test_router_cli import _router_port, _wait_ready
from tests.unit.router.harness import RouterThread
from trtfleet.batch.runner import RunnerSettings

pytestmark = pytest.mark.integration

MAX_TOKENS = 16
BATCH_WAIT_S = 300.0
FAST_RUNNER = RunnerSettings(concurrency=4, chunk_lines=8, chunk_interval_s=0.2, idle_poll_s=0.5)


@pytest.fixture(scope="module")
def workers() -> Iterator[list[Any]]:
    with reference_workers() as started:
        yield started


@pytest.fixture
def router(workers: list[Any], converted_adapters: list[ConvertedAdapter], tmp_path: Path) -> Iterator[RouterThread]:
    batch = BatchSettings(store=str(tmp_path / "store"), runner=FAST_RUNNER)
    with router_for(workers, converted_adapters, batch=batch) as started:
        yield started
        started.check_books()


def _client(url: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=url + "/v1", api_key="unused", max_retries=0, timeout=60)


def _lines(models: list[str], count: int, url: str = "/v1/completions") -> list[dict[str, Any]]:
    rows = []
    for i in range(count):
        body: dict[str, Any] = {"model": models[i % len(models)], "max_tokens": MAX_TOKENS, "temperature": 0}
        if url == "/v1/completions":
            body["prompt"] = f"line {i} says hello"
        else:
            body["messages"] = [{"role": "user", "content": f"line {i} says hello"}]
        rows.append({"custom_id": f"req-{i}", "method": "POST", "url": url, "body": body})
    return rows


def _jsonl(rows: list[dict[str, Any]]) -> bytes:
    return "".join(json.dumps(r) + "\n" for r in rows).encode()


def _wait_final(client: openai.OpenAI, batch_id: str) -> Any:
    deadline = time.monotonic() + BATCH_WAIT_S
    while True:
        batch = client.batches.retrieve(batch_id)
        if batch.status in ("completed", "failed", "expired", "cancelled"):
            return batch
        assert time.monotonic() < deadline, f"batch still {batch.status} after {BATCH_WAIT_S} s"
        time.sleep(0.2)


def _results(client: openai.OpenAI, file_id: str | None) -> list[dict[str, Any]]:
    if file_id is None:
        return []
    return [json.loads(line) for line in client.files.content(file_id).content.splitlines()]


def test_batch_round_trip_equals_online_answers(
    router: RouterThread, converted_adapters: list[ConvertedAdapter]
) -> None:
    client = _client(router.http_url)
    models = ["tiny", *(a.name for a in converted_adapters)]
    rows = _lines(models, 15)
    bad = [
        {
            "custom_id": "unknown-model",
            "method": "POST",
            "url": "/v1/completions",
            "body": {"model": "nope", "prompt": "x"},
        },
        {"custom_id": "wrong-url", "method": "POST", "url": "/v1/chat/completions", "body": {"model": "tiny"}},
        {
            "custom_id": "too-long",
            "method": "POST",
            "url": "/v1/completions",
            "body": {"model": "tiny", "prompt": "x", "max_tokens": 10**6},
        },
    ]
    upload = client.files.create(file=("in.jsonl", _jsonl(rows + bad)), purpose="batch")
    assert upload.purpose == "batch" and upload.bytes == len(_jsonl(rows + bad))
    assert client.files.retrieve(upload.id).filename == "in.jsonl"
    created = client.batches.create(
        input_file_id=upload.id, endpoint="/v1/completions", completion_window="24h", metadata={"job": "it"}
    )
    assert created.status == "validating" and created.metadata == {"job": "it"}
    batch = _wait_final(client, created.id)
    assert batch.status == "completed", batch
    assert batch.request_counts is not None
    assert (batch.request_counts.total, batch.request_counts.completed, batch.request_counts.failed) == (18, 15, 3)
    outputs = _results(client, batch.output_file_id)
    assert [r["custom_id"] for r in outputs] == [r["custom_id"] for r in rows]  # input order, each once
    for row, result in zip(rows, outputs, strict=True):
        assert result["error"] is None and result["response"]["status_code"] == 200
        online = client.completions.create(**row["body"])
        assert result["response"]["body"]["choices"][0]["text"] == online.choices[0].text, row["custom_id"]
    errors = {r["custom_id"]: r for r in _results(client, batch.error_file_id)}
    assert errors["unknown-model"]["error"]["code"] == "model_not_found"
    assert errors["wrong-url"]["error"]["code"] == "invalid_url"
    assert errors["too-long"]["response"]["status_code"] == 400  # answered by the router, as online
    assert batch.id in [b.id for b in client.batches.list(limit=5)]
    with pytest.raises(openai.BadRequestError, match="Cannot cancel"):
        client.batches.cancel(batch.id)
    with pytest.raises(openai.NotFoundError):
        client.batches.retrieve("batch_missing")
    with pytest.raises(openai.BadRequestError, match="endpoint"):
        client.batches.create(input_file_id=upload.id, endpoint="/v1/embeddings", completion_window="24h")  # type: ignore[arg-type]
    assert client.files.delete(upload.id).deleted
    with pytest.raises(openai.NotFoundError):
        client.files.retrieve(upload.id)


def test_chat_batch_and_cancel(router: RouterThread, converted_adapters: list[ConvertedAdapter]) -> None:
    client = _client(router.http_url)
    rows = _lines([a.name for a in converted_adapters], 4, url="/v1/chat/completions")
    upload = client.files.create(file=("chat.jsonl", _jsonl(rows)), purpose="batch")
    batch = _wait_final(
        client,
        client.batches.create(input_file_id=upload.id, endpoint="/v1/chat/completions", completion_window="24h").id,
    )
    outputs = _results(client, batch.output_file_id)
    assert batch.status == "completed" and len(outputs) == 4
    online = client.chat.completions.create(**rows[0]["body"])
    assert outputs[0]["response"]["body"]["choices"][0]["message"]["content"] == online.choices[0].message.content

    many = _lines(["tiny"], 200)
    upload = client.files.create(file=("many.jsonl", _jsonl(many)), purpose="batch")
    created = client.batches.create(input_file_id=upload.id, endpoint="/v1/completions", completion_window="24h")
    cancelling = client.batches.cancel(created.id)
    assert cancelling.status in ("cancelling", "cancelled")
    batch = _wait_final(client, created.id)
    assert batch.status == "cancelled" and batch.cancelled_at is not None
    done = [r["custom_id"] for r in _results(client, batch.output_file_id)]
    assert len(done) == len(set(done)) == batch.request_counts.completed < 200  # type: ignore[union-attr]


def test_a_batch_may_use_only_its_creators_models(
    workers: list[Any], converted_adapters: list[ConvertedAdapter], tmp_path: Path
) -> None:
    keys = tmp_path / "keys.yaml"
    allowed = converted_adapters[0].name
    keys.write_text(json.dumps({"keys": [{"name": "team", "key": "sk-team-0001", "models": [allowed]}]}))
    batch = BatchSettings(store=str(tmp_path / "store"), runner=FAST_RUNNER)
    with router_for(workers, converted_adapters, batch=batch, api_keys_path=keys) as router:
        anonymous = _client(router.http_url)
        with pytest.raises(openai.AuthenticationError):
            anonymous.batches.list()
        client = openai.OpenAI(base_url=router.http_url + "/v1", api_key="sk-team-0001", max_retries=0, timeout=60)
        rows = _lines([allowed, "tiny"], 4)
        upload = client.files.create(file=("in.jsonl", _jsonl(rows)), purpose="batch")
        created = client.batches.create(input_file_id=upload.id, endpoint="/v1/completions", completion_window="24h")
        done = _wait_final(client, created.id)
        assert [r["custom_id"] for r in _results(client, done.output_file_id)] == ["req-0", "req-2"]
        errors = {r["custom_id"]: r["error"]["code"] for r in _results(client, done.error_file_id)}
        assert errors == {"req-1": "model_not_found", "req-3": "model_not_found"}


def _start_router(config: Path, store: Path, logs: list[str]) -> tuple[subprocess.Popen[bytes], int]:
    process = subprocess.Popen(
        [
            str(Path(sys.executable).parent / "trtfleet"),
            "router",
            "--host",
            "127.0.0.1",
            "--fleet-config",
            str(config),
            "--http-port",
            "0",
            "--grpc-port",
            "-1",
            "--metrics-port",
            "-1",
            "--batch-store",
            str(store),
            "--batch-concurrency",
            "2",
        ],
        stderr=subprocess.PIPE,
    )
    port = _router_port(process, logs)
    _wait_ready(f"http://127.0.0.1:{port}/v2/health/ready", process)
    return process, port


def test_router_killed_mid_batch_resumes_with_every_custom_id_once(
    workers: list[Any], converted_adapters: list[ConvertedAdapter], tmp_path: Path
) -> None:
    config = tmp_path / "fleet.json"
    config.write_text(json.dumps(fleet_config(workers, converted_adapters)))
    store = tmp_path / "store"
    rows = _lines(["tiny", *(a.name for a in converted_adapters)], 120)
    logs: list[str] = []
    process, port = _start_router(config, store, logs)
    try:
        client = _client(f"http://127.0.0.1:{port}")
        upload = client.files.create(file=("in.jsonl", _jsonl(rows)), purpose="batch")
        batch_id = client.batches.create(
            input_file_id=upload.id, endpoint="/v1/completions", completion_window="24h"
        ).id
        chunks = store / "chunks" / batch_id
        deadline = time.monotonic() + BATCH_WAIT_S
        while len(list(chunks.glob("*.jsonl"))) < 2:  # validation chunk and one chunk of answers
            assert time.monotonic() < deadline, "no answers were committed"
            time.sleep(0.05)
        process.send_signal(signal.SIGKILL)
        process.wait(timeout=30)
        committed = sum(len(p.read_bytes().splitlines()) for p in chunks.glob("*.jsonl"))
        assert 0 < committed < len(rows), "the kill did not land mid-batch"

        process, port = _start_router(config, store, logs)
        client = _client(f"http://127.0.0.1:{port}")
        batch = _wait_final(client, batch_id)
        assert batch.status == "completed" and batch.error_file_id is None
        outputs = _results(client, batch.output_file_id)
        assert Counter(r["custom_id"] for r in outputs) == Counter(r["custom_id"] for r in rows)
        for row, result in list(zip(rows, outputs, strict=True))[:: len(rows) // 6]:
            online = client.completions.create(**row["body"])
            assert result["response"]["body"]["choices"][0]["text"] == online.choices[0].text
    finally:
        if process.poll() is None:
            process.send_signal(signal.SIGTERM)
            try:
                process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                process.kill()
