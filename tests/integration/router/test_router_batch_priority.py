"""Interactive first, on a real reference worker (tritonserver, tiny Llama) behind the in-process router:
while the pod has no batch headroom, batch lines wait in the router's batch lane and interactive requests
sent meanwhile are all answered ahead of them; once the pod has headroom the batch finishes, every line
once. Counts and conditions only (no timing windows). The pod's load is held by a router ticket (the same
book a request in flight occupies), so the test decides when the headroom returns."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import openai
import pytest
from trtfleet_router.batch.wiring import BatchSettings
from trtfleet_router.routing.config import RoutingConfig
from trtfleet_router.routing.types import Outcome, RouteRequest
from trtfleet_router.upstream.waiting import Priority

from tests.integration.router.support import ConvertedAdapter, reference_workers, router_for
from tests.unit.router.harness import RouterThread
from trtfleet.batch.runner import RunnerSettings

pytestmark = pytest.mark.integration

LINES = 6
CONCURRENCY = 4
INTERACTIVE = 5
WAIT_S = 120.0


@pytest.fixture(scope="module")
def worker() -> Iterator[list[Any]]:
    with reference_workers(count=1) as started:
        yield started


@pytest.fixture
def router(worker: list[Any], converted_adapters: list[ConvertedAdapter], tmp_path: Path) -> Iterator[RouterThread]:
    runner = RunnerSettings(concurrency=CONCURRENCY, chunk_lines=2, chunk_interval_s=0.2, idle_poll_s=0.5)
    batch = BatchSettings(store=str(tmp_path / "store"), runner=runner, pod_slots=1)
    routing = RoutingConfig(capacity_wait_s=600.0)  # the batch lane's bound stays out of the test's way
    with router_for(worker, converted_adapters, batch=batch, routing=routing) as started:
        yield started


def _until(condition: Any, what: str) -> None:
    deadline = time.monotonic() + WAIT_S
    while not condition():
        assert time.monotonic() < deadline, f"never: {what}"
        time.sleep(0.02)


def test_interactive_requests_go_ahead_of_batch_lines_held_for_headroom(router: RouterThread) -> None:
    client = openai.OpenAI(base_url=router.http_url + "/v1", api_key="unused", max_retries=0, timeout=60)
    app = router.router
    fleet, waits = app.fleets.fleet("tiny"), app.dispatcher.admission.capacity

    async def hold() -> Any:  # the pod's load at its one batch slot
        request = RouteRequest("tiny", None, 4, 4, request_id="held-load")
        return fleet.start(fleet.route(request), request)

    ticket = router.loop.run(hold())
    started: list[str] = []  # request ids in the order the router started them on the pod
    real_start = fleet.start

    def recording_start(decision: Any, request: RouteRequest) -> Any:  # a spy: records, then the real start
        started.append("batch" if request.request_id.startswith("batch_req_") else "interactive")
        return real_start(decision, request)

    fleet.start = recording_start
    rows: list[dict[str, Any]] = [
        {
            "custom_id": f"line-{i}",
            "method": "POST",
            "url": "/v1/completions",
            "body": {"model": "tiny", "prompt": f"batch line {i}", "max_tokens": 8, "temperature": 0},
        }
        for i in range(LINES)
    ]
    data = "".join(json.dumps(r) + "\n" for r in rows).encode()
    upload = client.files.create(file=("in.jsonl", data), purpose="batch")
    batch = client.batches.create(input_file_id=upload.id, endpoint="/v1/completions", completion_window="24h")
    _until(lambda: waits.waiting("tiny", Priority.BATCH) == CONCURRENCY, "the runner's lines wait in the batch lane")

    answers = [
        client.completions.create(model="tiny", prompt=f"live {i}", max_tokens=8, temperature=0)
        for i in range(INTERACTIVE)
    ]
    assert all(a.choices[0].text for a in answers)  # every interactive request answered ...
    assert waits.waiting("tiny") == 0  # ... without waiting in the router ...
    _until(lambda: waits.waiting("tiny", Priority.BATCH) == CONCURRENCY, "the woken batch lines are held again")
    assert started == ["interactive"] * INTERACTIVE  # ... and no batch line started on the pod meanwhile
    assert app.batch is not None and app.batch.runner.lines_started == CONCURRENCY

    async def release() -> None:
        fleet.finish(ticket, Outcome.OK)
        waits.notify("tiny")

    router.loop.run(release())
    _until(lambda: client.batches.retrieve(batch.id).status == "completed", "the batch completes")
    done = client.batches.retrieve(batch.id)
    assert done.request_counts is not None and (done.request_counts.completed, done.request_counts.failed) == (LINES, 0)
    output = client.files.content(done.output_file_id or "").text.splitlines()
    assert sorted(json.loads(line)["custom_id"] for line in output) == sorted(r["custom_id"] for r in rows)
    assert started[INTERACTIVE:] == ["batch"] * LINES  # every line started once, after the headroom returned
    fleet.start = real_start
    router.check_books()
