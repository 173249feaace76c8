"""The runner over a real local store with a fake executor (the router's dispatch path is tested in
tests/integration/router/test_router_batch.py): resume after a kill, cancel, retries, grouping."""

from __future__ import annotations

import asyncio
import dataclasses
import json
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from trtfleet.batch.book import BatchBook
from trtfleet.batch.errors import InvalidBatchRequest
from trtfleet.batch.lines import BatchLine
from trtfleet.batch.records import BatchStatus
from trtfleet.batch.runner import Answer, BatchRunner, RunnerSettings, admit
from trtfleet.batch.service import BatchService
from trtfleet.batch.store import LocalStore

ENDPOINT = "/v1/completions"
FAST = RunnerSettings(concurrency=4, chunk_lines=3, chunk_interval_s=0.05, min_interval_s=0.0, poll_interval_s=0.01)


class FakeExecutor:
    """Answers ``echo <prompt>``; ``busy`` answers retry-later that many times first; ``gate`` holds every
    line after the first ``hold_after`` until it is set."""

    def __init__(self, busy: int = 0, hold_after: int = 0) -> None:
        self.calls: list[str] = []
        self.busy = busy
        self.gate: asyncio.Event | None = None
        self.hold_after = hold_after

    async def execute(self, endpoint: str, item: BatchLine, request_id: str) -> Answer:
        self.calls.append(item.custom_id)
        if self.gate is not None and len(self.calls) > self.hold_after:
            await self.gate.wait()
        if self.busy > 0:
            self.busy -= 1
            return Answer(503, {"error": {"message": "busy"}}, request_id, retry_after_s=0.0)
        if item.body.get("prompt") == "bad":
            return Answer(400, {"error": {"message": "bad prompt", "type": "invalid_request_error"}}, request_id)
        return Answer(200, {"text": f"echo {item.body['prompt']}"}, request_id)


class AlwaysFree:
    def has_free_capacity(self, model: str) -> bool:
        return True

    def interactive_pressure(self, model: str, since_s: float) -> bool:
        return False

    def lanes(self, model: str) -> int:
        return 1


def _input(n: int, models: tuple[str, ...] = ("m1", "m2")) -> bytes:
    rows = [
        {
            "custom_id": f"c{i}",
            "method": "POST",
            "url": ENDPOINT,
            "body": {"model": models[i % len(models)], "prompt": f"p{i}"},
        }
        for i in range(n)
    ]
    return "".join(json.dumps(r) + "\n" for r in rows).encode()


async def _create(service: BatchService, data: bytes) -> str:
    upload = await service.upload(filename="in.jsonl", purpose="batch", data=data)
    record = await service.create(endpoint=ENDPOINT, input_file_id=upload.id, completion_window="24h")
    return record.id


def _rows(service: BatchService, file_id: str | None) -> list[dict[str, Any]]:
    if file_id is None:
        return []
    return [json.loads(line) for line in service.book.file_content(file_id).splitlines()]


def test_a_killed_runner_resumes_and_answers_every_custom_id_once(tmp_path: Path) -> None:
    async def scenario() -> None:
        service = BatchService(BatchBook(LocalStore(tmp_path)))
        batch_id = await _create(service, _input(20))
        first = FakeExecutor(hold_after=6)
        first.gate = asyncio.Event()  # never set: lines after the sixth hang until the kill
        runner = BatchRunner(service, first, AlwaysFree(), lambda m: True, FAST)
        task = asyncio.create_task(runner.run_batch(batch_id))
        while len(service.book.chunk_numbers(batch_id)) < 3:  # chunk 0 (validation) and two answer chunks
            await asyncio.sleep(0.01)
        task.cancel()  # the kill: whatever was not committed is gone
        await asyncio.gather(task, return_exceptions=True)
        committed = {r["custom_id"] for r in service.book.results(batch_id)}
        assert len(committed) == 6

        second = FakeExecutor()  # a fresh process over the same store
        fresh = BatchService(BatchBook(LocalStore(tmp_path)))
        record = await BatchRunner(fresh, second, AlwaysFree(), lambda m: True, FAST).run_batch(batch_id)
        assert record.status is BatchStatus.COMPLETED
        assert not committed & set(second.calls)  # committed lines never ran again
        rows = _rows(fresh, record.output_file_id)
        assert Counter(r["custom_id"] for r in rows) == Counter(f"c{i}" for i in range(20))
        assert [r["custom_id"] for r in rows] == [f"c{i}" for i in range(20)]  # input order
        assert all(r["response"]["body"]["text"] == f"echo p{r['custom_id'][1:]}" for r in rows)
        assert record.request_counts.total == 20 and record.request_counts.completed == 20
        assert record.error_file_id is None and record.in_progress_at and record.completed_at

    asyncio.run(scenario())


def test_bad_lines_and_failed_answers_go_to_the_error_file(tmp_path: Path) -> None:
    async def scenario() -> None:
        service = BatchService(BatchBook(LocalStore(tmp_path)))
        good = {"custom_id": "ok", "method": "POST", "url": ENDPOINT, "body": {"model": "m1", "prompt": "x"}}
        refused = {**good, "custom_id": "refused", "body": {"model": "m1", "prompt": "bad"}}
        unknown = {**good, "custom_id": "unknown", "body": {"model": "nope"}}
        data = "\n".join([json.dumps(good), json.dumps(refused), json.dumps(unknown), "{broken"]).encode()
        batch_id = await _create(service, data)
        record = await BatchRunner(service, FakeExecutor(), AlwaysFree(), lambda m: m == "m1", FAST).run_batch(batch_id)
        assert record.status is BatchStatus.COMPLETED
        assert [r["custom_id"] for r in _rows(service, record.output_file_id)] == ["ok"]
        errors = {r["custom_id"]: r for r in _rows(service, record.error_file_id)}
        assert errors["refused"]["response"]["status_code"] == 400
        assert errors["unknown"]["error"]["code"] == "model_not_found"
        assert errors[None]["error"]["code"] == "invalid_json_line"
        assert (record.request_counts.total, record.request_counts.completed, record.request_counts.failed) == (4, 1, 3)

    asyncio.run(scenario())


def test_lines_run_grouped_by_model_and_retry_when_the_fleet_is_busy(tmp_path: Path) -> None:
    async def scenario() -> None:
        service = BatchService(BatchBook(LocalStore(tmp_path)))
        batch_id = await _create(service, _input(9, models=("m1", "m2", "m3")))
        executor = FakeExecutor(busy=3)
        settings = RunnerSettings(
            concurrency=1, chunk_lines=2, chunk_interval_s=0.05, min_interval_s=0.0, poll_interval_s=0.01
        )
        record = await BatchRunner(service, executor, AlwaysFree(), lambda m: True, settings).run_batch(batch_id)
        assert record.status is BatchStatus.COMPLETED and record.request_counts.completed == 9
        order = list(dict.fromkeys(executor.calls))
        assert order == ["c0", "c3", "c6", "c1", "c4", "c7", "c2", "c5", "c8"]
        assert executor.calls[:4] == ["c0"] * 4  # three busy answers, then the answer
        with pytest.raises(InvalidBatchRequest, match="Cannot cancel a batch with status 'completed'"):
            await service.cancel(batch_id)

    asyncio.run(scenario())


def test_cancel_finishes_lines_in_flight_and_keeps_their_results(tmp_path: Path) -> None:
    async def scenario() -> None:
        service = BatchService(BatchBook(LocalStore(tmp_path)))
        batch_id = await _create(service, _input(12))
        executor = FakeExecutor()
        executor.gate = asyncio.Event()
        task = asyncio.create_task(
            BatchRunner(service, executor, AlwaysFree(), lambda m: True, FAST).run_batch(batch_id)
        )
        while len(executor.calls) < FAST.concurrency:
            await asyncio.sleep(0.01)
        cancelling = await service.cancel(batch_id)
        assert cancelling.status is BatchStatus.CANCELLING and cancelling.cancelling_at is not None
        executor.gate.set()
        record = await task
        assert record.status is BatchStatus.CANCELLED and record.cancelled_at is not None
        rows = _rows(service, record.output_file_id)
        assert len(rows) == record.request_counts.completed == len(set(executor.calls)) < 12
        assert await service.cancel(batch_id) == record  # cancelling again answers the batch as it is

    asyncio.run(scenario())


@pytest.mark.parametrize(
    ("free", "inflight", "since_s", "expected"),
    [
        pytest.param(True, 0, 0.0, True, id="free-capacity"),
        pytest.param(False, 0, 0.5, False, id="busy-before-the-minimum-rate"),
        pytest.param(False, 0, 1.0, True, id="busy-minimum-rate-due"),
        pytest.param(True, 8, 9.0, False, id="at-concurrency"),
    ],
)
def test_admission(free: bool, inflight: int, since_s: float, expected: bool) -> None:
    assert (
        admit(free_capacity=free, inflight=inflight, since_last_admit_s=since_s, settings=RunnerSettings()) is expected
    )


def test_a_cancel_from_another_process_reaches_the_runner(tmp_path: Path) -> None:
    async def scenario() -> None:
        runner_side = BatchService(BatchBook(LocalStore(tmp_path)))
        api_side = BatchService(BatchBook(LocalStore(tmp_path)))  # another router replica, same store
        batch_id = await _create(api_side, _input(12))
        executor = FakeExecutor(hold_after=2)
        executor.gate = asyncio.Event()
        runner = BatchRunner(runner_side, executor, AlwaysFree(), lambda m: True, FAST)
        task = asyncio.create_task(runner.run_batch(batch_id))
        held = 2 + FAST.concurrency  # two answered, then every slot held at the gate
        while len(executor.calls) < held:
            await asyncio.sleep(0.01)
        assert (await api_side.cancel(batch_id)).status is BatchStatus.CANCELLING
        assert [b.status for b in (await api_side.batches())[0]] == [BatchStatus.CANCELLING]
        executor.gate.set()
        record = await task
        assert record.status is BatchStatus.CANCELLED and (await api_side.batch(batch_id)) == record
        assert record.request_counts.completed == len(_rows(api_side, record.output_file_id)) == held

    asyncio.run(scenario())


def test_overlapping_runners_still_write_each_line_once(tmp_path: Path) -> None:
    async def scenario() -> None:
        service = BatchService(BatchBook(LocalStore(tmp_path)))
        batch_id = await _create(service, _input(10))
        runners = [BatchRunner(service, FakeExecutor(), AlwaysFree(), lambda m: True, FAST) for _ in range(2)]
        records = await asyncio.gather(*(r.run_batch(batch_id) for r in runners))  # what a lost lease allows
        final = await service.batch(batch_id)
        assert {r.status for r in records} == {BatchStatus.COMPLETED}
        rows = _rows(service, final.output_file_id)
        assert sorted(r["custom_id"] for r in rows) == sorted(f"c{i}" for i in range(10))
        assert final.request_counts.completed == 10

    asyncio.run(scenario())


def test_input_order_when_grouping_is_off(tmp_path: Path) -> None:
    async def scenario() -> None:
        service = BatchService(BatchBook(LocalStore(tmp_path)))
        batch_id = await _create(service, _input(6, models=("m1", "m2", "m3")))
        executor = FakeExecutor()
        settings = dataclasses.replace(FAST, concurrency=1, group_by_model=False)
        await BatchRunner(service, executor, AlwaysFree(), lambda m: True, settings).run_batch(batch_id)
        assert executor.calls == [f"c{i}" for i in range(6)]

    asyncio.run(scenario())


def test_lines_for_models_outside_the_creators_key_are_rejected(tmp_path: Path) -> None:
    async def scenario() -> None:
        service = BatchService(BatchBook(LocalStore(tmp_path)))
        upload = await service.upload(filename="in.jsonl", purpose="batch", data=_input(4))
        created = await service.create(
            endpoint=ENDPOINT, input_file_id=upload.id, completion_window="24h", allowed_models=("m1",)
        )
        assert (await service.batch(created.id)).allowed_models == ("m1",)
        executor = FakeExecutor()
        record = await BatchRunner(service, executor, AlwaysFree(), lambda m: True, FAST).run_batch(created.id)
        assert sorted(executor.calls) == ["c0", "c2"]  # the m1 lines
        errors = {r["custom_id"]: r["error"]["code"] for r in _rows(service, record.error_file_id)}
        assert errors == {"c1": "model_not_found", "c3": "model_not_found"}

    asyncio.run(scenario())


def test_a_batch_past_its_window_expires_with_what_finished(tmp_path: Path) -> None:
    async def scenario() -> None:
        now = [1000.0]
        service = BatchService(BatchBook(LocalStore(tmp_path)), clock=lambda: now[0])
        batch_id = await _create(service, _input(12))
        executor = FakeExecutor(hold_after=2)
        executor.gate = asyncio.Event()
        task = asyncio.create_task(
            BatchRunner(service, executor, AlwaysFree(), lambda m: True, FAST).run_batch(batch_id)
        )
        held = 2 + FAST.concurrency
        while len(executor.calls) < held:
            await asyncio.sleep(0.01)
        now[0] += 24 * 3600  # the completion window closes
        executor.gate.set()
        record = await task
        assert record.status is BatchStatus.EXPIRED and record.expired_at is not None
        assert record.finalizing_at is not None and record.completed_at is None
        assert record.request_counts.completed == len(_rows(service, record.output_file_id)) == held

    asyncio.run(scenario())


class TwoPods(AlwaysFree):
    def lanes(self, model: str) -> int:
        return 2


def test_grouped_lines_run_one_model_per_ready_pod_at_once(tmp_path: Path) -> None:
    """With two ready pods two models' lines run side by side (each can stay on the pod that holds it); the
    third model starts when one of them is used up."""

    async def scenario() -> None:
        service = BatchService(BatchBook(LocalStore(tmp_path)))
        batch_id = await _create(service, _input(9, models=("m1", "m2", "m3")))
        executor = FakeExecutor()
        settings = dataclasses.replace(FAST, concurrency=2)
        record = await BatchRunner(service, executor, TwoPods(), lambda m: True, settings).run_batch(batch_id)
        assert record.status is BatchStatus.COMPLETED and record.request_counts.completed == 9
        models = [f"m{int(c[1:]) % 3 + 1}" for c in executor.calls]
        assert set(models[:2]) == {"m1", "m2"}  # both lanes busy from the start
        assert models.index("m3") >= 3  # m3 waits for a group to finish
        assert Counter(models) == Counter({"m1": 3, "m2": 3, "m3": 3})

    asyncio.run(scenario())
