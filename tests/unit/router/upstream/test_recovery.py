"""The dispatcher's recovery rules (``next_step``), the upstream error classification, and the
client-facing errors they end in: one table each."""

from __future__ import annotations

from dataclasses import dataclass

import grpc
import pytest
from trtfleet_router.errors import (
    Overloaded,
    RouterError,
    StreamInterrupted,
    Unavailable,
    UpstreamFailed,
    UpstreamRejected,
    UpstreamTimeout,
)
from trtfleet_router.upstream.capacity import DrainRate
from trtfleet_router.upstream.protocol import FailureKind, UpstreamFailure, classify_upstream_error
from trtfleet_router.upstream.recovery import Action, AttemptState, final_error, next_step


def _state(**changes: object) -> AttemptState:
    fields: dict[str, object] = {
        "attempts": 1,
        "max_attempts": 3,
        "yielded": False,
        "miss_recovered": False,
        "sent_weights": False,
        "has_adapter": True,
    }
    fields.update(changes)
    return AttemptState(**fields)  # type: ignore[arg-type]


@dataclass(frozen=True)
class StepCase:
    kind: FailureKind
    state: AttemptState
    action: Action
    blames_pod: bool


@pytest.mark.parametrize(
    "case",
    [
        pytest.param(StepCase(FailureKind.MISS, _state(), Action.RETRY_WITH_WEIGHTS, False), id="miss: weights"),
        pytest.param(
            StepCase(FailureKind.MISS, _state(miss_recovered=True), Action.GIVE_UP, False), id="miss twice: give up"
        ),
        pytest.param(
            StepCase(FailureKind.MISS, _state(sent_weights=True), Action.GIVE_UP, False), id="miss with weights"
        ),
        pytest.param(StepCase(FailureKind.CACHE_FULL, _state(), Action.RETRY_ELSEWHERE, False), id="cache full"),
        pytest.param(StepCase(FailureKind.QUEUE_FULL, _state(), Action.RETRY_ELSEWHERE, False), id="queue full"),
        pytest.param(StepCase(FailureKind.POD_FAILED, _state(), Action.RETRY_ELSEWHERE, True), id="broken pod"),
        pytest.param(StepCase(FailureKind.STALLED, _state(), Action.RETRY_ELSEWHERE, True), id="silent pod"),
        pytest.param(StepCase(FailureKind.POD_FAILED, _state(attempts=3), Action.GIVE_UP, True), id="no attempt left"),
        pytest.param(
            StepCase(FailureKind.STALLED, _state(yielded=True), Action.GIVE_UP, True), id="stalled after tokens"
        ),
        pytest.param(
            StepCase(FailureKind.QUEUE_FULL, _state(yielded=True), Action.GIVE_UP, False), id="never after tokens"
        ),
        pytest.param(StepCase(FailureKind.INVALID, _state(), Action.GIVE_UP, False), id="invalid: not the pod"),
        pytest.param(StepCase(FailureKind.TIMEOUT, _state(), Action.GIVE_UP, False), id="deadline: not the pod"),
        pytest.param(StepCase(FailureKind.INTERNAL, _state(), Action.GIVE_UP, False), id="unknown: not the pod"),
    ],
)
def test_next_step(case: StepCase) -> None:
    step = next_step(UpstreamFailure(case.kind, "text"), case.state)
    assert (step.action, step.blames_pod) == (case.action, case.blames_pod)


@dataclass(frozen=True)
class ClassifyCase:
    message: str
    code: grpc.StatusCode | None
    kind: FailureKind


@pytest.mark.parametrize(
    "case",
    [
        pytest.param(
            ClassifyCase("Stub process 'tensorrt_llm_bls_0_0' is not healthy.", None, FailureKind.POD_FAILED),
            id="dead stub",
        ),
        pytest.param(
            ClassifyCase(
                "Failed to process the request(s) for model 'tensorrt_llm_bls_0_0', message: Stub process "
                "'tensorrt_llm_bls_0_0' is not healthy.",
                grpc.StatusCode.INTERNAL,
                FailureKind.POD_FAILED,
            ),
            id="dead stub as INTERNAL",
        ),
        pytest.param(ClassifyCase("Socket closed", grpc.StatusCode.UNAVAILABLE, FailureKind.POD_FAILED), id="reset"),
        pytest.param(
            ClassifyCase("LoRA task 41 not found in cache. Please send LoRA weights", None, FailureKind.MISS),
            id="a miss is not a pod failure",
        ),
        pytest.param(
            ClassifyCase("unexpected inference input 'foo' for model 'm'", None, FailureKind.INVALID),
            id="bad input",
        ),
        pytest.param(
            ClassifyCase("input byte size mismatch, Stub process x is not healthy", None, FailureKind.INVALID),
            id="request errors win over pod texts",
        ),
        pytest.param(
            ClassifyCase("max_tokens is required", grpc.StatusCode.INVALID_ARGUMENT, FailureKind.INVALID),
            id="INVALID_ARGUMENT",
        ),
        pytest.param(
            ClassifyCase(
                "invalid value type for 'user_tag' parameter, expected int64_param, bool_param, or string_param.",
                None,
                FailureKind.INVALID,
            ),
            id="Triton refusing a parameter type",
        ),
        pytest.param(ClassifyCase("something odd", None, FailureKind.INTERNAL), id="unknown stays internal"),
        pytest.param(
            ClassifyCase("Deadline Exceeded", grpc.StatusCode.DEADLINE_EXCEEDED, FailureKind.TIMEOUT), id="deadline"
        ),
    ],
)
def test_classify_upstream_error(case: ClassifyCase) -> None:
    assert classify_upstream_error(case.message, case.code).kind is case.kind


@pytest.mark.parametrize(
    ("kind", "yielded", "error"),
    [
        pytest.param(FailureKind.QUEUE_FULL, False, Overloaded, id="busy: 429"),
        pytest.param(FailureKind.POD_FAILED, False, Unavailable, id="broken: 503"),
        pytest.param(FailureKind.STALLED, False, Unavailable, id="silent: 503"),
        pytest.param(FailureKind.INVALID, False, UpstreamRejected, id="invalid: 400"),
        pytest.param(FailureKind.TIMEOUT, False, UpstreamTimeout, id="deadline: 504"),
        pytest.param(FailureKind.INTERNAL, False, UpstreamFailed, id="unknown: 502"),
        pytest.param(FailureKind.STALLED, True, StreamInterrupted, id="after tokens: interrupted"),
    ],
)
def test_final_error(kind: FailureKind, yielded: bool, error: type[RouterError]) -> None:
    assert type(final_error(UpstreamFailure(kind, "text"), "p0", yielded=yielded, retry_after_s=4)) is error


def test_overload_answers_carry_the_drain_estimate() -> None:
    error = final_error(UpstreamFailure(FailureKind.QUEUE_FULL, "full"), "p0", retry_after_s=7)
    assert isinstance(error, Overloaded) and error.retry_after_s == 7


def test_drain_rate_estimates_from_request_ends() -> None:
    now = [0.0]
    drain = DrainRate(lambda: now[0])
    assert drain.wait_s("m", 3) is None  # no estimate before two ends
    for _ in range(5):
        drain.record_end("m")
        now[0] += 0.5
    now[0] -= 0.5
    assert drain.seconds_per_end("m") == pytest.approx(0.5)
    assert drain.wait_s("m", 3) == pytest.approx(2.0)  # four ends to wait for
    now[0] += 10.0  # nothing ended for 10 s: the drain is slower than the mean says
    assert drain.seconds_per_end("m") == pytest.approx(10.0)
