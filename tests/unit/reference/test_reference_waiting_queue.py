"""The executor's waiting queues take out the first ready request and leave the rest in their places."""

from __future__ import annotations

import pytest
from trtfleet_engines.reference.waiting_queue import WaitingQueuePolicy, waiting_queue

# (name, priority, ready)
ITEMS = [("a", 0.5, False), ("b", 0.9, False), ("c", 0.5, True), ("d", 0.9, True), ("e", 0.5, True)]


@pytest.mark.parametrize(
    ("policy", "taken", "left"),
    [
        (WaitingQueuePolicy.FCFS, ["c", "d", "e"], ["a", "b"]),
        (WaitingQueuePolicy.PRIORITY, ["d", "c", "e"], ["b", "a"]),
    ],
)
def test_pop_first_skips_those_not_ready_without_moving_them(
    policy: WaitingQueuePolicy, taken: list[str], left: list[str]
) -> None:
    priority = {name: p for name, p, _ in ITEMS}
    ready = {name for name, _, r in ITEMS if r}
    queue = waiting_queue(policy, priority.__getitem__)
    for name, _, _ in ITEMS:
        queue.append(name)
    got = []
    while (item := queue.pop_first(ready.__contains__)) is not None:
        got.append(item)
    assert got == taken
    assert list(queue) == left  # the skipped ones kept their order
    ready.update(left)
    assert queue.pop_first(ready.__contains__) == left[0] and len(queue) == 1
