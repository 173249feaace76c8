"""The offline bound of autoscaling: the pod-seconds an ideal autoscaler needs for a trace (pure).

The ideal autoscaler is instant (a pod serves the moment it is asked for) and knows the whole trace in
advance. It sizes each window of ``window_s`` seconds for that window's work at the same SLO as the
compared policies: a pod kept at ``pod_load`` of its compute capacity meets the SLO, so a window gets
``ceil(work / (window_s * pod_load))`` pods (0 for a window without work, at most ``max_pods``).

A request's work is the compute seconds it takes of a pod running a full batch (:func:`request_work_s`, the
step-time model's cost shared out per request, as ``bench.profiles.pod_capacity_requests_per_s`` shares it
for a mean-sized request). The work is charged to the window its request arrives in, and spread evenly over
that window: a burst shorter than the window is not sized for, so the bound is what no policy can go below
at that SLO, not a fleet size that is sure to meet it.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass

from bench.podsim import StepTimeModel
from bench.traces import TraceRequest


def request_work_s(model: StepTimeModel, batch: int, prompt_tokens: int, output_tokens: int) -> float:
    """Compute seconds one request takes of a pod whose steps run ``batch`` sequences: its share of each decode
    step's fixed and per-sequence cost, its context's attention cost over its steps, and its prefill."""
    steps = max(1, output_tokens)
    per_step = model.fixed_s / batch + model.per_seq_s + model.per_context_token_s * (prompt_tokens + steps / 2)
    return steps * per_step + model.per_prefill_token_s * prompt_tokens


def trace_work(trace: Sequence[TraceRequest], model: StepTimeModel, batch: int) -> list[tuple[float, float]]:
    """``(arrival s, work s)`` per request of ``trace``."""
    return [(r.t_s, request_work_s(model, batch, r.prompt_tokens, r.max_tokens)) for r in trace]


@dataclass(frozen=True, slots=True)
class ScaleBound:
    window_s: float
    duration_s: float
    pods: tuple[int, ...]
    """Pods of each window, the first starting at 0 s; the last window may be cut short by ``duration_s``."""
    capped_windows: int
    """Windows whose work needed more than ``max_pods`` (given ``max_pods``)."""

    @property
    def pod_seconds(self) -> float:
        return sum(pods * self.length_s(index) for index, pods in enumerate(self.pods))

    def length_s(self, index: int) -> float:
        return min(self.window_s, self.duration_s - index * self.window_s)

    def pods_at(self, t_s: float) -> int:
        """Pods the bound has at ``t_s`` (0 outside ``[0, duration_s)``)."""
        if t_s < 0 or t_s >= self.duration_s:
            return 0
        return self.pods[min(len(self.pods) - 1, int(t_s // self.window_s))]


def offline_bound(
    work: Sequence[tuple[float, float]], duration_s: float, window_s: float, pod_load: float, max_pods: int
) -> ScaleBound:
    """The bound for requests ``(arrival s, work s)`` over ``[0, duration_s)``; arrivals outside it are refused."""
    if duration_s <= 0 or window_s <= 0 or not 0 < pod_load <= 1 or max_pods < 1:
        raise ValueError("duration_s and window_s must be positive, pod_load in (0, 1], max_pods at least 1")
    count = math.ceil(duration_s / window_s)
    per_window = [0.0] * count
    for t_s, work_s in work:
        if not 0 <= t_s < duration_s:
            raise ValueError(f"an arrival at {t_s} s is outside the trace's [0, {duration_s}) s")
        per_window[int(t_s // window_s)] += work_s
    pods = []
    capped = 0
    for index, work_s in enumerate(per_window):
        length_s = min(window_s, duration_s - index * window_s)
        needed = math.ceil(work_s / (length_s * pod_load) - 1e-9)
        capped += needed > max_pods
        pods.append(min(needed, max_pods))
    return ScaleBound(window_s, duration_s, tuple(pods), capped)


def busiest_pods(work: Sequence[tuple[float, float]], span_s: float, pod_load: float) -> float:
    """Pods the busiest ``span_s`` stretch of the trace needs at ``pod_load`` (unrounded; any start time, not
    only window starts): what a fleet sized for the trace's peak at that time scale has. ``work`` sorted."""
    window: deque[tuple[float, float]] = deque()
    total = 0.0
    busiest = 0.0
    for t_s, work_s in work:
        window.append((t_s, work_s))
        total += work_s
        while window[0][0] <= t_s - span_s:
            total -= window.popleft()[1]
        busiest = max(busiest, total)
    return busiest / (span_s * pod_load)
