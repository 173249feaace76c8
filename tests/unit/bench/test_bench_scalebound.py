"""The offline bound of autoscaling: per-window pods from the window's work, and a request's work."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from bench.podsim import H100_LLAMA3_8B, StepTimeModel
from bench.profiles import h100_llama3_8b_fleet, pod_capacity_requests_per_s
from bench.scalebound import busiest_pods, offline_bound, request_work_s, trace_work
from bench.scalers import FleetSignals, ForesightScaler
from bench.traces import TraceRequest


@dataclass(frozen=True)
class BoundCase:
    work: tuple[tuple[float, float], ...]  # (arrival s, work s)
    duration_s: float
    pods: tuple[int, ...]
    pod_seconds: float


@pytest.mark.parametrize("case", [
    # 60 s windows at pod load 0.5: a pod takes 30 work-seconds a window
    pytest.param(BoundCase(((1.0, 30.0),), 120.0, (1, 0), 60.0), id="one-pod-of-work-then-idle"),
    pytest.param(BoundCase(((1.0, 30.0), (59.9, 0.1)), 120.0, (2, 0), 120.0), id="a-little-more-takes-a-pod"),
    pytest.param(BoundCase(((0.0, 20.0), (70.0, 50.0), (119.0, 40.0)), 120.0, (1, 3), 240.0),
                 id="each-window-its-own-work"),
    pytest.param(BoundCase(((0.0, 15.0), (61.0, 9.0)), 90.0, (1, 1), 90.0), id="a-short-last-window"),
    pytest.param(BoundCase(((0.0, 1000.0),), 60.0, (4,), 240.0), id="capped-at-the-fleet"),
    pytest.param(BoundCase((), 120.0, (0, 0), 0.0), id="no-work-no-pods"),
])
def test_bound_sizes_each_window_for_its_own_work(case: BoundCase) -> None:
    bound = offline_bound(case.work, case.duration_s, window_s=60.0, pod_load=0.5, max_pods=4)
    assert bound.pods == case.pods
    assert bound.pod_seconds == pytest.approx(case.pod_seconds)
    assert bound.capped_windows == (1 if case.work and case.work[0][1] == 1000.0 else 0)


def test_bound_pods_at_a_time_and_outside_the_trace() -> None:
    bound = offline_bound([(0.0, 20.0), (70.0, 50.0)], 120.0, window_s=60.0, pod_load=0.5, max_pods=4)
    assert [bound.pods_at(t) for t in (-1.0, 0.0, 59.9, 60.0, 119.9, 120.0)] == [0, 1, 1, 2, 2, 0]


def test_finer_windows_never_cost_more_when_work_is_even() -> None:
    """Work spread evenly needs the same pods in every window: the window length changes nothing."""
    work = [(t * 0.5, 0.25) for t in range(240)]  # 0.5 work-seconds per second for 120 s
    coarse = offline_bound(work, 120.0, window_s=60.0, pod_load=0.5, max_pods=8)
    fine = offline_bound(work, 120.0, window_s=10.0, pod_load=0.5, max_pods=8)
    assert coarse.pod_seconds == fine.pod_seconds == pytest.approx(120.0)


@pytest.mark.parametrize("bad", [
    pytest.param({"duration_s": 0.0}, id="no-duration"),
    pytest.param({"window_s": -1.0}, id="negative-window"),
    pytest.param({"pod_load": 1.5}, id="load-above-one"),
    pytest.param({"max_pods": 0}, id="no-pods"),
])
def test_bound_refuses_bad_arguments(bad: dict[str, float]) -> None:
    arguments = {"duration_s": 60.0, "window_s": 60.0, "pod_load": 0.5, "max_pods": 4, **bad}
    with pytest.raises(ValueError, match="must be positive"):
        offline_bound([(0.0, 1.0)], **arguments)  # type: ignore[arg-type]


def test_bound_refuses_an_arrival_outside_the_trace() -> None:
    with pytest.raises(ValueError, match="outside the trace"):
        offline_bound([(60.0, 1.0)], 60.0, window_s=60.0, pod_load=0.5, max_pods=4)


def test_request_work_shares_out_the_step_cost() -> None:
    model = StepTimeModel("t", fixed_s=0.064, per_seq_s=0.001, per_context_token_s=0.0001, per_prefill_token_s=0.01)
    # 10 steps of 0.064 / 64 + 0.001 + 0.0001 x (100 + 5), plus 100 prefill tokens x 0.01
    assert request_work_s(model, 64, 100, 10) == pytest.approx(10 * (0.001 + 0.001 + 0.0105) + 1.0)
    assert request_work_s(model, 64, 100, 0) == request_work_s(model, 64, 100, 1)  # the first token is a step


def test_request_work_is_the_inverse_of_a_pods_capacity_for_mean_sized_requests() -> None:
    fleet = h100_llama3_8b_fleet(1)
    capacity = pod_capacity_requests_per_s(fleet, 1000, 400)
    # pod_capacity_requests_per_s rounds the step's token counts to integers: far below 0.1 %
    assert request_work_s(H100_LLAMA3_8B, 64, 1000, 400) == pytest.approx(1 / capacity, rel=1e-3)


def test_busiest_stretch_starts_anywhere() -> None:
    work = [(0.0, 1.0), (55.0, 3.0), (65.0, 3.0), (200.0, 2.0)]
    assert busiest_pods(work, 60.0, 0.5) == pytest.approx(6.0 / 30.0)  # 55 s and 65 s, across windows
    assert busiest_pods(work, 1.0, 0.5) == pytest.approx(3.0 / 0.5)


def test_trace_work_and_the_foresight_scaler_ask_for_the_next_windows_pods() -> None:
    trace = [TraceRequest(0.0, "r0", "a0", 100, 10), TraceRequest(61.0, "r1", "a0", 100, 10)]
    work = trace_work(trace, H100_LLAMA3_8B, 64)
    assert [t for t, _w in work] == [0.0, 61.0]
    bound = offline_bound([(0.0, 0.0), (61.0, 45.0)], 120.0, window_s=60.0, pod_load=0.5, max_pods=4)
    scaler = ForesightScaler(bound)
    assert [scaler.decide(FleetSignals(), 0, t) for t in (0.0, 58.5, 59.0, 60.0, 119.0)] == [0, 0, 2, 2, 2]
