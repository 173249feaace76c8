"""Outlier detection (pure, on a hand-moved clock): thresholds, back-off, the ejection budget, readmission."""

from __future__ import annotations

from dataclasses import dataclass

import pytest
from trtfleet_router.routing.outlier import OutlierDetectionConfig, OutlierDetector, ejection_budget

CONFIG = OutlierDetectionConfig(
    consecutive_failures=3, base_ejection_time_s=5.0, max_ejection_time_s=40.0, max_ejection_percent=50.0
)


@dataclass(frozen=True)
class BudgetCase:
    pods: int
    percent: float
    budget: int


@pytest.mark.parametrize(
    "case",
    [
        pytest.param(BudgetCase(1, 100.0, 0), id="a lone pod is never ejected"),
        pytest.param(BudgetCase(2, 100.0, 1), id="never all pods"),
        pytest.param(BudgetCase(3, 10.0, 1), id="at least one pod"),
        pytest.param(BudgetCase(3, 50.0, 1), id="half of three is one"),
        pytest.param(BudgetCase(10, 50.0, 5), id="half of ten is five"),
        pytest.param(BudgetCase(4, 0.0, 1), id="zero percent still ejects one"),
    ],
)
def test_ejection_budget(case: BudgetCase) -> None:
    assert ejection_budget(case.pods, case.percent) == case.budget


def test_consecutive_failures_eject_and_a_success_resets_the_count() -> None:
    detector = OutlierDetector(CONFIG)
    assert detector.record_failure("p0", 3, 0.0) is None
    assert detector.record_failure("p0", 3, 0.0) is None
    detector.record_success("p0")
    assert detector.record_failure("p0", 3, 1.0) is None
    assert detector.record_failure("p0", 3, 1.0) is None
    ejection = detector.record_failure("p0", 3, 1.0)
    assert ejection is not None and ejection.duration_s == 5.0 and ejection.consecutive_failures == 3
    assert detector.ejected == {"p0"}


def test_back_off_doubles_up_to_the_maximum_and_needs_a_probe_after_the_ejection_time() -> None:
    detector = OutlierDetector(CONFIG)
    now, durations = 0.0, []
    for _ in range(5):
        ejection = None
        for _ in range(3):
            ejection = detector.record_failure("p0", 3, now)
        assert ejection is not None
        durations.append(ejection.duration_s)
        assert detector.due_for_probe(now + ejection.duration_s - 0.01) == []
        assert not detector.readmit("p0", now + ejection.duration_s - 0.01)  # too early: still out
        now += ejection.duration_s
        assert detector.due_for_probe(now) == ["p0"]
        assert detector.readmit("p0", now)
        assert detector.ejected == frozenset()
    assert durations == [5.0, 10.0, 20.0, 40.0, 40.0]


def test_a_pod_healthy_for_the_maximum_time_starts_its_back_off_afresh() -> None:
    detector = OutlierDetector(CONFIG)
    for _ in range(3):
        detector.record_failure("p0", 3, 0.0)
    assert detector.readmit("p0", 5.0)
    for _ in range(3):
        ejection = detector.record_failure("p0", 3, 5.0 + 40.0)
    assert ejection is not None and ejection.duration_s == 5.0


def test_the_budget_keeps_the_last_pods_in_and_frees_when_one_returns() -> None:
    detector = OutlierDetector(CONFIG)
    for _ in range(3):
        detector.record_failure("p0", 3, 0.0)
    for _ in range(5):
        assert detector.record_failure("p1", 3, 0.0) is None  # counted, but one of three is the budget
    assert detector.ejected == {"p0"}
    assert detector.readmit("p0", 5.0)
    assert detector.record_failure("p1", 3, 5.0) is not None  # p1 still failing: ejected now
    assert detector.ejected == {"p1"}


def test_pods_that_left_are_forgotten() -> None:
    detector = OutlierDetector(CONFIG)
    for _ in range(3):
        detector.record_failure("p0", 3, 0.0)
    detector.retain(["p1"])
    assert detector.ejected == frozenset()
