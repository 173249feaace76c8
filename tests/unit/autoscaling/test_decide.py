"""The autoscaling decision: one table per rule, then whole traces (noise, idle -> burst -> idle)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import pytest

from trtfleet.api import AutoscalingSpec
from trtfleet.autoscaling import DemandSignals, Recommended, ScaleReason, decide, recommend

SPEC = AutoscalingSpec(
    min_replicas=0,
    max_replicas=10,
    target_requests_per_pod=4,
    target_kv_cache_fraction=0.8,
    scale_down_stabilization_seconds=60,
    scale_to_zero_after_seconds=120,
)


@dataclass(frozen=True)
class RecommendCase:
    id: str
    signals: DemandSignals
    pages_per_pod: int | None
    want: int
    spec: AutoscalingSpec = SPEC


RECOMMEND = [
    RecommendCase("idle", DemandSignals(), 100, 0),
    RecommendCase("requests-round-up", DemandSignals(router_requests=9), None, 3),
    RecommendCase("router-and-pods-not-added", DemandSignals(router_requests=8, pod_requests=6), None, 2),
    RecommendCase("pods-see-more", DemandSignals(router_requests=2, pod_requests=13), None, 4),
    RecommendCase("held-needs-one", DemandSignals(router_requests=1, held_requests=1), None, 1),
    RecommendCase("kv-cache", DemandSignals(router_requests=4, kv_cache_fraction=0.9, ready_pods=4), None, 5),
    RecommendCase("kv-exactly-on-target", DemandSignals(kv_cache_fraction=0.8, ready_pods=3), None, 3),
    RecommendCase("kv-target-off", DemandSignals(kv_cache_fraction=0.9, ready_pods=4), None, 0,
                  SPEC.model_copy(update={"target_kv_cache_fraction": None})),
    RecommendCase("adapter-pages", DemandSignals(router_requests=1, active_adapter_pages=250), 100, 3),
    RecommendCase("adapter-pages-unknown-capacity", DemandSignals(active_adapter_pages=250), None, 0),
    RecommendCase("adapter-sizing-off", DemandSignals(active_adapter_pages=250), 100, 0,
                  SPEC.model_copy(update={"adapter_working_set": False})),
]


@pytest.mark.parametrize("case", RECOMMEND, ids=lambda c: c.id)
def test_recommend(case: RecommendCase) -> None:
    assert recommend(case.spec, case.signals, case.pages_per_pod)[0] == case.want


@dataclass(frozen=True)
class DecideCase:
    id: str
    signals: DemandSignals | None
    current: int
    want: int
    reason: ScaleReason
    history: Sequence[Recommended] = field(default_factory=tuple)
    now_s: float = 1000.0
    spec: AutoscalingSpec = SPEC


DECIDE = [
    DecideCase("up-at-once", DemandSignals(router_requests=20), 2, 5, ScaleReason.SCALED_UP),
    DecideCase("up-capped", DemandSignals(router_requests=100), 2, 10, ScaleReason.SCALED_UP),
    DecideCase("steady", DemandSignals(router_requests=8), 2, 2, ScaleReason.STEADY, (Recommended(0, 2),)),
    DecideCase(
        "down-held-by-window", DemandSignals(router_requests=4), 3, 3, ScaleReason.DOWNSCALE_STABILIZED,
        (Recommended(900, 3), Recommended(950, 2)),
    ),
    DecideCase(
        "down-after-window", DemandSignals(router_requests=4), 3, 2, ScaleReason.SCALED_DOWN,
        (Recommended(900, 3), Recommended(920, 2)),
    ),
    DecideCase("no-history-no-shrink", DemandSignals(router_requests=4), 3, 3, ScaleReason.DOWNSCALE_STABILIZED),
    DecideCase(
        "idle-keeps-one-before-zero-delay", DemandSignals(), 2, 1, ScaleReason.SCALED_DOWN,
        (Recommended(800, 2), Recommended(900, 0)),
    ),
    DecideCase(
        "idle-to-zero", DemandSignals(), 1, 0, ScaleReason.SCALED_TO_ZERO, (Recommended(800, 2), Recommended(870, 0)),
    ),
    DecideCase("zero-stays-zero", DemandSignals(), 0, 0, ScaleReason.STEADY, (Recommended(0, 0),)),
    DecideCase(
        "from-zero-on-held", DemandSignals(router_requests=1, held_requests=1), 0, 1, ScaleReason.SCALED_FROM_ZERO,
        (Recommended(0, 0),), spec=SPEC.model_copy(update={"scale_up_stabilization_seconds": 300}),
    ),
    DecideCase(
        "from-zero-to-demand", DemandSignals(router_requests=11, held_requests=11), 0, 3, ScaleReason.SCALED_FROM_ZERO,
    ),
    DecideCase(
        "min-one-never-zero", DemandSignals(), 1, 1, ScaleReason.LIMITED, (Recommended(0, 0),),
        spec=SPEC.model_copy(update={"min_replicas": 1}),
    ),
    DecideCase(
        "up-window-waits", DemandSignals(router_requests=20), 2, 2, ScaleReason.UPSCALE_STABILIZED,
        (Recommended(900, 2), Recommended(990, 5)), spec=SPEC.model_copy(update={"scale_up_stabilization_seconds": 30}),
    ),
    DecideCase(
        "up-window-lowest", DemandSignals(router_requests=20), 2, 4, ScaleReason.SCALED_UP,
        (Recommended(900, 4), Recommended(990, 5)), spec=SPEC.model_copy(update={"scale_up_stabilization_seconds": 30}),
    ),
    DecideCase("no-signals-hold", None, 3, 3, ScaleReason.NO_SIGNALS),
    DecideCase("no-signals-into-range", None, 12, 10, ScaleReason.SCALED_DOWN),
]


@pytest.mark.parametrize("case", DECIDE, ids=lambda c: c.id)
def test_decide(case: DecideCase) -> None:
    decision = decide(case.spec, case.signals, case.history, case.current, case.now_s)
    assert (decision.replicas, decision.reason) == (case.want, case.reason), decision.message


def _run(spec: AutoscalingSpec, readings: Sequence[DemandSignals], step_s: float, start: int) -> list[int]:
    """Apply each decision at once (as the operator does), one reading every ``step_s``."""
    history: tuple[Recommended, ...] = ()
    current, seen = start, []
    for tick, signals in enumerate(readings):
        decision = decide(spec, signals, history, current, tick * step_s)
        history, current = decision.history, decision.replicas
        seen.append(current)
    return seen


def test_noisy_signal_does_not_flap() -> None:
    # 14 +- 3 requests at 4 per pod: raw recommendations jump between 3 and 5 on every tick
    noise = [14 + (3 if i % 3 == 0 else -3 if i % 3 == 1 else 0) for i in range(120)]
    seen = _run(SPEC, [DemandSignals(router_requests=n) for n in noise], step_s=5, start=4)
    changes = sum(1 for a, b in zip([4, *seen], seen, strict=False) if a != b)
    assert changes == 1 and seen[-1] == 5, seen  # one step up to the noise's peak, never down inside the window


def test_idle_burst_idle_goes_zero_n_zero() -> None:
    idle = [DemandSignals()] * 40
    burst = [DemandSignals(router_requests=1, held_requests=1)] + [DemandSignals(router_requests=30)] * 20
    seen = _run(SPEC, [*idle, *burst, *idle], step_s=5, start=0)
    assert seen[:40] == [0] * 40
    assert seen[40] == 1 and max(seen) == 8
    tail = seen[61:]
    assert tail[-1] == 0 and tail == sorted(tail, reverse=True)  # down only, to zero
    # the down window (60 s) holds 8 pods, the zero delay (120 s) one pod
    assert tail.index(1) * 5 >= 60 and tail.index(0) * 5 >= 120


def test_history_is_bounded_and_conservative() -> None:
    spec = SPEC.model_copy(update={"scale_down_stabilization_seconds": 86_400})
    history: tuple[Recommended, ...] = ()
    for tick in range(1000):
        history = decide(spec, DemandSignals(router_requests=4 * (1 + tick % 2)), history, 2, tick).history
    assert len(history) <= 256
    assert max(h.replicas for h in history) == 2
