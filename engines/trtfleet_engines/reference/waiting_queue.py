"""The executor's waiting queue, under either of trtllm-serve's ``scheduler_config.waiting_queue_policy`` values.

``fcfs`` (TRT-LLM's default): first come, first served. ``priority``: the request with the highest ``priority``
first (trtllm-serve's per-request float in [0, 1], 0.5 by default), first come, first served among equals; as in
TRT-LLM's ``PriorityWaitingQueue`` (``tensorrt_llm/_torch/pyexecutor/scheduler/waiting_queue.py``, see
docs/engine-fidelity.md) it orders only the queue, never preempting a running request. Pure.
"""

from __future__ import annotations

import heapq
import itertools
from collections import deque
from collections.abc import Callable, Iterator
from enum import StrEnum
from typing import Generic, Protocol, TypeVar

T = TypeVar("T")


class WaitingQueuePolicy(StrEnum):
    FCFS = "fcfs"
    PRIORITY = "priority"


class WaitingQueue(Protocol[T]):
    def append(self, item: T) -> None: ...

    def popleft(self) -> T: ...

    def pop_first(self, ready: Callable[[T], bool]) -> T | None:
        """The first item in the queue's order for which ``ready`` holds, taken out; the others keep their places
        (a request whose LoRA weights are still on the pod's link waits without losing its turn)."""
        ...

    def remove(self, item: T) -> None: ...

    def clear(self) -> None: ...

    def __iter__(self) -> Iterator[T]: ...

    def __len__(self) -> int: ...


class FcfsWaiting(deque[T]):
    """Arrival order."""

    def pop_first(self, ready: Callable[[T], bool]) -> T | None:
        for index, item in enumerate(self):
            if ready(item):
                del self[index]
                return item
        return None


class PriorityWaiting(Generic[T]):
    """Highest ``priority_of(item)`` first, then arrival order."""

    def __init__(self, priority_of: Callable[[T], float]) -> None:
        self._priority_of = priority_of
        self._heap: list[tuple[float, int, T]] = []
        self._arrivals = itertools.count()

    def append(self, item: T) -> None:
        heapq.heappush(self._heap, (-self._priority_of(item), next(self._arrivals), item))

    def popleft(self) -> T:
        return heapq.heappop(self._heap)[2]

    def pop_first(self, ready: Callable[[T], bool]) -> T | None:
        if self._heap and ready(self._heap[0][2]):
            return heapq.heappop(self._heap)[2]
        for entry in sorted(self._heap, key=lambda entry: entry[:2]):
            if ready(entry[2]):
                self._heap.remove(entry)
                heapq.heapify(self._heap)
                return entry[2]
        return None

    def remove(self, item: T) -> None:
        kept = [entry for entry in self._heap if entry[2] is not item]
        if len(kept) == len(self._heap):
            raise ValueError("not waiting")
        self._heap = kept
        heapq.heapify(self._heap)

    def clear(self) -> None:
        self._heap.clear()

    def __iter__(self) -> Iterator[T]:
        return (entry[2] for entry in sorted(self._heap, key=lambda entry: entry[:2]))

    def __len__(self) -> int:
        return len(self._heap)


def waiting_queue(policy: WaitingQueuePolicy, priority_of: Callable[[T], float]) -> WaitingQueue[T]:
    if policy is WaitingQueuePolicy.PRIORITY:
        return PriorityWaiting(priority_of)
    return FcfsWaiting()
