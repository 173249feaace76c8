"""The router's batch seams: free capacity over pod loads, and router errors as batch answers (retry
later for the retryable ones, an answered error line for the rest)."""

from __future__ import annotations

import asyncio
import dataclasses
from typing import Any

import pytest
from trtfleet_router import errors as e
from trtfleet_router.batch.capacity import free_slots
from trtfleet_router.batch.executor import DispatchExecutor
from trtfleet_router.batch.resources import batch_id_for, status_for

from trtfleet.batch.lines import BatchLine
from trtfleet.batch.records import BatchRecord, BatchStatus, RequestCounts


@pytest.mark.parametrize(
    ("loads", "slots", "free"),
    [
        pytest.param([], 4, 0, id="no-ready-pod"),
        pytest.param([0, 0], 4, 8, id="idle"),
        pytest.param([4, 6], 4, 0, id="saturated"),
        pytest.param([3, 9], 4, 1, id="one-slot-left"),
    ],
)
def test_free_slots(loads: list[int], slots: int, free: int) -> None:
    assert free_slots(loads, slots) == free


class Answerer:
    def __init__(self, outcome: dict[str, Any] | e.RouterError) -> None:
        self.outcome = outcome
        self.chat: bool | None = None

    async def answer(self, body: Any, *, chat: bool, request_id: str) -> dict[str, Any]:
        self.chat = chat
        if isinstance(self.outcome, e.RouterError):
            raise self.outcome
        return self.outcome


@pytest.mark.parametrize(
    ("outcome", "status", "retry"),
    [
        pytest.param({"choices": []}, 200, None, id="answer"),
        pytest.param(e.LimitExceeded("too long"), 400, None, id="bad-request-is-answered"),
        pytest.param(e.UpstreamTimeout("slow"), 504, None, id="timeout-is-answered"),
        pytest.param(e.Overloaded("busy", retry_after_s=3), 429, 3.0, id="busy-retries"),
        pytest.param(e.NoCapacityAvailable("no pod"), 503, 1.0, id="no-pod-retries"),
        pytest.param(e.ShuttingDown("draining"), 503, 1.0, id="draining-retries"),
    ],
)
def test_router_errors_become_answers_or_retries(outcome: Any, status: int, retry: float | None) -> None:
    answerer = Answerer(outcome)
    item = BatchLine(1, "c1", "tiny", {"model": "tiny", "messages": []})
    answer = asyncio.run(DispatchExecutor(answerer).execute("/v1/chat/completions", item, "r1"))
    assert (answer.status_code, answer.retry_after_s, answer.request_id) == (status, retry, "r1")
    assert answerer.chat is True
    if status != 200:
        assert answer.body["error"]["message"] == outcome.message


def _record(status: BatchStatus, completed: int, failed: int, **stamps: int) -> BatchRecord:
    base = BatchRecord("batch_1", "/v1/completions", "file-1", "24h", BatchStatus.VALIDATING, 100, 86500)
    return dataclasses.replace(
        base.moved_to(status, 200), request_counts=RequestCounts(10, completed, failed), **stamps
    )


@pytest.mark.parametrize(
    ("record", "phase", "progress", "complete"),
    [
        pytest.param(_record(BatchStatus.IN_PROGRESS, 3, 2), "Running", 50, "False", id="running"),
        pytest.param(_record(BatchStatus.COMPLETED, 8, 2), "Succeeded", 100, "True", id="succeeded"),
        pytest.param(_record(BatchStatus.CANCELLED, 1, 0), "Cancelled", 10, "True", id="cancelled"),
        pytest.param(_record(BatchStatus.EXPIRED, 4, 0), "Expired", 40, "True", id="expired"),
    ],
)
def test_batch_resource_status_follows_the_record(
    record: BatchRecord, phase: str, progress: int, complete: str
) -> None:
    status = status_for(record, generation=3, output_uri="s3://b/out/output.jsonl")
    assert (status["phase"], status["progressPercent"], status["observedGeneration"]) == (phase, progress, 3)
    assert status["batchId"] == "batch_1" and status["outputUri"] == "s3://b/out/output.jsonl"
    assert status["conditions"][0]["type"] == "Complete" and status["conditions"][0]["status"] == complete


def test_batch_resource_status_without_a_record() -> None:
    failed = status_for(None, generation=1, message="cannot read s3://b/in.jsonl")
    assert failed["phase"] == "Failed" and "s3://b/in.jsonl" in failed["message"]
    assert status_for(None, generation=1, cancelled=True)["phase"] == "Cancelled"
    assert status_for(None, generation=1)["phase"] == "Pending"
    assert batch_id_for({"metadata": {"uid": "ab-cd"}}) == "batch_abcd"
