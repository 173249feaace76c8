"""Prefetch pacing (routing/prefetch.py): only idle pods, one at a time, within each pod's link budget."""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest
from trtfleet_router.routing.prefetch import PodIdleness, PrefetchConfig, PrefetchPacer, added_queueing_bound_s

pytestmark = pytest.mark.unit

MB = 1_000_000
CONFIG = PrefetchConfig(link_share=0.25, burst_bytes=100 * MB, max_inflight_per_pod=1, link_bytes_per_s=1000 * MB)


@dataclass(frozen=True)
class Case:
    id: str
    pods: dict[str, tuple[int, int | None]]  # pod -> (load, waiting)
    wanted: tuple[tuple[str, int, int], ...]  # (pod, task id, MB)
    expected: tuple[tuple[str, int], ...]
    inflight: tuple[str, ...] = ()  # prefetches already running
    spent_mb: dict[str, int] = field(default_factory=dict)  # budget already used at t=0


CASES = [
    Case("idle-pods-get-one-each", {"a": (0, 0), "b": (0, 0)}, (("a", 1, 40), ("a", 2, 40), ("b", 3, 40)),
         (("a", 1), ("b", 3))),
    Case("queued-requests-block", {"a": (2, 1), "b": (2, 0)}, (("a", 1, 40), ("b", 2, 40)), (("b", 2),)),
    # loads 1 and 5, mean 3: the pod above the mean waits
    Case("busier-than-the-mean-waits", {"a": (1, 0), "b": (5, 0)}, (("a", 1, 40), ("b", 2, 40)), (("a", 1),)),
    Case("unknown-queue-is-not-busy", {"a": (1, None), "b": (1, None)}, (("a", 1, 40),), (("a", 1),)),
    Case("one-in-flight-per-pod", {"a": (0, 0), "b": (0, 0)}, (("a", 1, 40), ("b", 2, 40)), (("b", 2),),
         inflight=("a",)),
    # a busy pod whose budget holds 30 of the 40 MB waits (the less wanted copies too); an idle one does not
    Case("budget-spent-on-a-busy-pod", {"a": (2, 0), "b": (2, 0)}, (("a", 1, 40), ("a", 2, 10), ("b", 3, 40)),
         (("b", 3),), spent_mb={"a": 70}),
    Case("idle-pod-ignores-the-budget", {"a": (0, 0), "b": (4, 0)}, (("a", 1, 40),), (("a", 1),), spent_mb={"a": 100}),
    Case("not-ready-pods-get-none", {"a": (0, 0)}, (("z", 1, 40),), ()),
]


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_due(case: Case) -> None:
    pacer = PrefetchPacer(CONFIG)
    pods = {pod: PodIdleness(pod, load, waiting) for pod, (load, waiting) in case.pods.items()}
    for pod, spent in case.spent_mb.items():  # spend on an idle view of the pod, at t=0
        assert pacer.due([(pod, 999, spent * MB)], {pod: PodIdleness(pod, 1, 0)}, 0.0) == [(pod, 999)]
        pacer.finished(pod)
    for pod in case.inflight:
        assert pacer.due([(pod, 998, MB)], {pod: PodIdleness(pod, 0, 0)}, 0.0)
    wanted = [(pod, task, size * MB) for pod, task, size in case.wanted]
    assert pacer.due(wanted, pods, 0.0) == list(case.expected)
    for pod, _task in case.expected:
        assert pacer.inflight(pod) == 1 + case.inflight.count(pod)


def test_the_budget_refills_at_the_link_share_and_caps_at_the_burst() -> None:
    pacer = PrefetchPacer(CONFIG)
    busy = {"a": PodIdleness("a", 1, 0)}
    assert pacer.due([("a", 1, 100 * MB)], busy, 0.0) == [("a", 1)]  # the full burst
    pacer.finished("a")
    assert pacer.due([("a", 2, 40 * MB)], busy, 0.1) == []  # 25 MB refilled
    assert pacer.due([("a", 2, 40 * MB)], busy, 0.16) == [("a", 2)]  # 40 MB at 250 MB/s
    pacer.finished("a")
    assert pacer.due([("a", 3, 100 * MB)], busy, 100.0) == [("a", 3)]  # capped at the burst, not 25 GB
    pacer.finished("a")
    assert pacer.due([("a", 4, 10 * MB)], busy, 100.0) == []


def test_finished_and_forget_release_the_pod() -> None:
    pacer = PrefetchPacer(CONFIG)
    idle = {"a": PodIdleness("a", 0, 0)}
    assert pacer.due([("a", 1, MB)], idle, 0.0)
    assert not pacer.due([("a", 2, MB)], idle, 0.0)
    pacer.finished("a")
    assert pacer.due([("a", 2, MB)], idle, 0.0)
    pacer.forget(["a"])
    assert pacer.inflight("a") == 0 and pacer.inflight_total() == 0


def test_the_added_queueing_bound() -> None:
    # one 40 MB transfer at 1.25 GB/s (32 ms), one 5 ms step, one 0.8 ms copy
    bound = added_queueing_bound_s(CONFIG, 40 * MB, 1.25e9, 0.005, 0.0008)
    assert bound == pytest.approx(0.032 + 0.005 + 0.0008)
