"""The Files and Batches HTTP layer through the official openai client and raw requests, on a router in
front of echo upstreams (the reference-worker round trip is tests/integration/router/test_router_batch.py):
streamed uploads above --max-body-bytes, the file limit, bad forms, OpenAI error bodies, paging."""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import openai
import pytest
from trtfleet_router.batch.wiring import BatchSettings
from trtfleet_router.server.common import FrontendSettings

from tests.unit.router.harness import EchoFleet
from trtfleet.batch.runner import RunnerSettings

MAX_BODY_BYTES = 4096
MAX_FILE_BYTES = 64 * 1024


@pytest.fixture
def fleet(tmp_path: Path) -> Iterator[EchoFleet]:
    batch = BatchSettings(
        store=str(tmp_path / "store"),
        runner=RunnerSettings(chunk_interval_s=0.1, idle_poll_s=0.5),
        max_file_bytes=MAX_FILE_BYTES,
    )
    started = EchoFleet(tmp_path, batch=batch, frontend=FrontendSettings(max_body_bytes=MAX_BODY_BYTES))
    try:
        yield started
    finally:
        started.close()


def _client(fleet: EchoFleet) -> openai.OpenAI:
    return openai.OpenAI(base_url=fleet.router.http_url + "/v1", api_key="unused", max_retries=0, timeout=30)


def _rows(count: int, model: str = "a1") -> bytes:
    return b"".join(
        json.dumps(
            {
                "custom_id": f"c{i}",
                "method": "POST",
                "url": "/v1/completions",
                "body": {"model": model, "prompt": f"p{i}"},
            }
        ).encode()
        + b"\n"
        for i in range(count)
    )


def test_uploads_stream_past_the_body_limit_up_to_the_file_limit(fleet: EchoFleet) -> None:
    client = _client(fleet)
    data = _rows(200)
    assert MAX_BODY_BYTES < len(data) < MAX_FILE_BYTES
    upload = client.files.create(file=("big.jsonl", data), purpose="batch")
    assert upload.bytes == len(data) and client.files.content(upload.id).content == data
    with pytest.raises(openai.APIStatusError) as caught:
        client.files.create(file=("huge.jsonl", b"x" * (MAX_FILE_BYTES + 1)), purpose="batch")
    assert caught.value.status_code == 413
    with pytest.raises(openai.BadRequestError, match="purpose"):
        client.files.create(file=("x.jsonl", data), purpose="fine-tune")
    listed = client.files.list()
    assert [f.id for f in listed.data] == [upload.id]


def _post(url: str, body: bytes, content_type: str) -> tuple[int, Any]:
    request = urllib.request.Request(url, data=body, headers={"content-type": content_type}, method="POST")
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


@pytest.mark.parametrize(
    ("body", "content_type", "status", "param"),
    [
        pytest.param(b'{"purpose": "batch"}', "application/json", 400, None, id="not-multipart"),
        pytest.param(
            b'--b\r\ncontent-disposition: form-data; name="purpose"\r\n\r\nbatch\r\n--b--\r\n',
            "multipart/form-data; boundary=b",
            400,
            "file",
            id="no-file",
        ),
        pytest.param(
            b'--b\r\ncontent-disposition: form-data; name="file"; filename="a.jsonl"\r\n\r\n{}\r\n--b--\r\n',
            "multipart/form-data; boundary=b",
            400,
            "purpose",
            id="no-purpose",
        ),
    ],
)
def test_bad_upload_forms_get_openai_errors(
    fleet: EchoFleet, body: bytes, content_type: str, status: int, param: str | None
) -> None:
    code, answer = _post(fleet.router.http_url + "/v1/files", body, content_type)
    assert code == status and answer["error"]["type"] == "invalid_request_error"
    assert answer["error"]["param"] == param


def test_batches_create_list_page_and_missing_ids(fleet: EchoFleet) -> None:
    client = _client(fleet)
    upload = client.files.create(file=("in.jsonl", _rows(3)), purpose="batch")
    ids = [
        client.batches.create(input_file_id=upload.id, endpoint="/v1/completions", completion_window="24h").id
        for _ in range(3)
    ]
    first = client.batches.list(limit=2)
    assert len(first.data) == 2 and first.has_more
    assert sorted(b.id for b in client.batches.list(limit=2)) == sorted(ids)  # the client follows `after`
    code, answer = _post(fleet.router.http_url + "/v1/batches", b'{"endpoint": "/v1/completions"}', "application/json")
    assert code == 400 and answer["error"]["param"] == "input_file_id"
    with pytest.raises(openai.NotFoundError):
        client.files.content("file-missing")
    deadline = time.monotonic() + 30
    while any(client.batches.retrieve(i).status != "completed" for i in ids):
        assert time.monotonic() < deadline, "the batches did not complete"
        time.sleep(0.05)
    output = client.files.content(client.batches.retrieve(ids[0]).output_file_id or "").text.splitlines()
    assert [json.loads(line)["response"]["body"]["choices"][0]["text"] for line in output] == [
        "[101] p0",
        "[101] p1",
        "[101] p2",
    ]


def test_the_reserved_pods_gauge_follows_the_reserve(tmp_path: Path) -> None:
    """``trtfleet_router_batch_reserved_pods`` says how many pods the reserve keeps free of batch lines: none
    before an interactive request, one after (the routing file's hold made a lifetime here: the test does not
    race the default 30 s)."""
    from trtfleet_router.routing.policies import parse_routing_config

    batch = BatchSettings(store=str(tmp_path / "store"), reserve_pods=1)
    routing = parse_routing_config({"batchReserve": {"holdS": 1e9}})
    started = EchoFleet(tmp_path, batch=batch, routing=routing)
    try:

        def gauge() -> list[str]:
            with urllib.request.urlopen(started.router.metrics_url, timeout=10) as response:
                text = response.read().decode()
            return [line for line in text.splitlines() if line.startswith("trtfleet_router_batch_reserved_pods")]

        assert gauge() == ['trtfleet_router_batch_reserved_pods{base_model="tiny"} 0.0']
        _client(started).completions.create(model="a1", prompt="hello", max_tokens=4)
        assert gauge() == ['trtfleet_router_batch_reserved_pods{base_model="tiny"} 1.0']
    finally:
        started.close()


def test_no_reserved_pods_gauge_without_a_reserve(fleet: EchoFleet) -> None:
    with urllib.request.urlopen(fleet.router.metrics_url, timeout=10) as response:
        assert b"trtfleet_router_batch_reserved_pods" not in response.read()
