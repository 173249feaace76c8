"""The demo's worker pool: workers join the fleet file once ready, leave it before they stop."""

from __future__ import annotations

from typing import Any

from trtfleet.demo.autoscale import WorkerPool
from trtfleet.demo.fleet import WorkerEndpoint


class FakeChild:
    """Stands in for a worker process (``Child``): records its stop."""

    def __init__(self) -> None:
        self.stopped = False

    def stop(self, timeout_s: float) -> None:
        self.stopped = True


def _pool(events: list[Any], ready: set[str]) -> tuple[WorkerPool, dict[str, FakeChild]]:
    children: dict[str, FakeChild] = {}

    def spawn(index: int) -> tuple[WorkerEndpoint, Any]:
        worker = WorkerEndpoint(f"worker-{index}", 0, 0, 0)
        children[worker.name] = FakeChild()
        events.append(("spawn", worker.name))
        return worker, children[worker.name]

    def drained(worker: WorkerEndpoint) -> bool:
        events.append(("drained?", worker.name))
        return True

    pool = WorkerPool(spawn, lambda w: w.name in ready, lambda ws: events.append(("fleet", [w.name for w in ws])),
                      drained)
    return pool, children


def test_workers_join_when_ready_and_leave_before_they_stop() -> None:
    events: list[Any] = []
    ready: set[str] = set()
    pool, children = _pool(events, ready)
    pool.resize(2)
    assert pool.poll() == [] and pool.size() == 2  # started, not ready: not in the fleet file
    ready.add("worker-2")
    assert [w.name for w in pool.poll()] == ["worker-2"]
    assert events[-1] == ("fleet", ["worker-2"])
    pool.resize(1)  # the one still starting goes first, at once
    assert children["worker-1"].stopped and not children["worker-2"].stopped
    pool.resize(0)  # the serving one leaves the fleet file, drains, then stops
    assert events[-2:] == [("fleet", []), ("drained?", "worker-2")] and children["worker-2"].stopped
    pool.resize(1)
    assert events[-1] == ("spawn", "worker-3")  # names are never reused
