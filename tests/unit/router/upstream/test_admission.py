"""Interactive first: the batch admission rule, the interactive pressure the runner backs off on, the
batch lane of the capacity queue, and the runner's AIMD window (all pure or on the event loop alone)."""

from __future__ import annotations

import asyncio

import pytest
from trtfleet_router.batch.capacity import pressure
from trtfleet_router.upstream.admission import InteractiveSignal, batch_may_start
from trtfleet_router.upstream.capacity import CapacityWaits
from trtfleet_router.upstream.waiting import Priority

from trtfleet.batch.runner import RunnerSettings, admit, next_window


@pytest.mark.parametrize(
    ("pod_load", "pod_slots", "interactive_waiting", "expected"),
    [
        pytest.param(0, 6, 0, True, id="idle-pod"),
        pytest.param(5, 6, 0, True, id="one-slot-of-headroom-left"),
        pytest.param(6, 6, 0, False, id="at-the-slots"),
        pytest.param(9, 6, 0, False, id="pod-queue-counts-as-load"),
        pytest.param(0, 6, 1, False, id="an-interactive-request-waits"),
    ],
)
def test_batch_may_start(pod_load: int, pod_slots: int, interactive_waiting: int, expected: bool) -> None:
    assert (
        batch_may_start(pod_load=pod_load, pod_slots=pod_slots, interactive_waiting=interactive_waiting) is expected
    )


@pytest.mark.parametrize(
    ("waiting", "queues", "slow", "expected"),
    [
        pytest.param(0, (0, None), False, False, id="calm"),
        pytest.param(1, (0, 0), False, True, id="interactive-waits-in-the-router"),
        pytest.param(0, (0, 2), False, True, id="an-engine-queue"),
        pytest.param(0, (), True, True, id="a-slow-first-answer"),
    ],
)
def test_pressure(waiting: int, queues: tuple[int | None, ...], slow: bool, expected: bool) -> None:
    assert pressure(interactive_waiting=waiting, pod_queues=queues, slow_answer=slow) is expected


def test_slow_interactive_answers_are_seen_once_per_look() -> None:
    clock = [10.0]
    signal = InteractiveSignal(ttft_target_s=0.1, now=lambda: clock[0])
    signal.first_answer("m", 0.05)
    assert not signal.slow_since("m", 0.0)  # fast enough
    signal.first_answer("m", 0.5)
    assert signal.slow_since("m", 10.0) and not signal.slow_since("other", 0.0)
    clock[0] = 11.0
    assert not signal.slow_since("m", 10.5)  # the runner looked after it
    assert not InteractiveSignal().slow_since("m", 0.0)


SETTINGS = RunnerSettings(concurrency=16, backoff_interval_s=1.0)


@pytest.mark.parametrize(
    ("window", "pressured", "finished", "since_cut_s", "expected"),
    [
        pytest.param(16.0, True, 0, 5.0, (8.0, True), id="pressure-halves"),
        pytest.param(8.0, True, 3, 0.5, (8.0, False), id="one-cut-per-interval-and-no-growth"),
        pytest.param(1.0, True, 0, 5.0, (1.0, True), id="never-below-one"),
        pytest.param(8.0, False, 4, 0.0, (8.5, False), id="grows-one-per-window-of-finished-lines"),
        pytest.param(15.9, False, 10, 0.0, (16.0, False), id="capped-at-concurrency"),
    ],
)
def test_next_window(
    window: float, pressured: bool, finished: int, since_cut_s: float, expected: tuple[float, bool]
) -> None:
    got = next_window(window, pressure=pressured, finished=finished, since_cut_s=since_cut_s, settings=SETTINGS)
    assert got == pytest.approx(expected)


@pytest.mark.parametrize(
    ("inflight", "window", "expected"),
    [
        pytest.param(3, 4.0, True, id="below-the-window"),
        pytest.param(4, 4.9, False, id="the-window-is-whole-lines"),
        pytest.param(0, 0.2, True, id="at-least-one-line"),
    ],
)
def test_admission_follows_the_window(inflight: int, window: float, expected: bool) -> None:
    got = admit(free_capacity=True, inflight=inflight, since_last_admit_s=0.0, settings=SETTINGS, window=window)
    assert got is expected


def test_interactive_waiters_are_woken_before_earlier_batch_waiters() -> None:
    async def scenario() -> tuple[list[str], int, int]:
        waits = CapacityWaits(max_waiting=1)
        woken: list[str] = []

        async def waiter(name: str, priority: Priority) -> None:
            if await waits.wait("m", 30.0, priority=priority):
                woken.append(name)

        tasks = [asyncio.create_task(waiter(f"batch-{i}", Priority.BATCH)) for i in range(2)]
        await asyncio.sleep(0)
        tasks.append(asyncio.create_task(waiter("live", Priority.INTERACTIVE)))
        await asyncio.sleep(0)
        counts = (waits.waiting("m"), waits.waiting("m", Priority.BATCH))  # batch lines never fill the other queue
        for expected in (1, 2, 3):
            waits.notify("m")
            for _ in range(1000):  # loop turns, not wall time: until the woken task has run
                if len(woken) == expected:
                    break
                await asyncio.sleep(0)
        await asyncio.gather(*tasks)
        return woken, *counts

    woken, interactive, batch = asyncio.run(scenario())
    assert (interactive, batch) == (1, 2)
    assert woken == ["live", "batch-0", "batch-1"]
