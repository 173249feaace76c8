"""Interactive first: the priority class of a routed request and the rule that admits batch lines.

Every request the dispatcher routes carries a :class:`Priority`: ``interactive`` (a client's request)
or ``batch`` (a line of the batch runner). The classes differ in two places only:

* **waiting for capacity** (:mod:`.capacity`): interactive waiters are woken before any batch waiter;
* **admission to a pod**: a batch line starts on the pod its route chose only while
  :func:`batch_may_start` holds: no interactive request of its base model waits for capacity, and the
  pod's load (this router's in-flight requests plus the pod's scraped queue) is below ``pod_slots``
  (below the engine's max batch, so an interactive request finds a free slot without queueing behind
  batch lines: an engine does not preempt a running sequence). Otherwise the line waits in the batch
  lane and routes again when a request ends; after ``capacity_wait_s`` it starts anyway (the bound
  that keeps a batch progressing on a saturated fleet).

TensorRT-LLM's executor has a per-request ``priority`` (``Request(..., PriorityType priority =
kDefaultPriority)``, 0.5, ``cpp/include/tensorrt_llm/executor/executor.h``), but the Triton
``tensorrt_llm`` model's inputs carry none (docs/operations.md, Batches), so a batch line already queued in a pod
cannot be overtaken there: the router keeps batch lines out of the pod's queue instead.

:class:`InteractiveSignal` is what the batch runner backs off on (:mod:`trtfleet.batch.runner`):
interactive requests waiting in the router, and interactive first answers slower than a target.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from enum import StrEnum


class Priority(StrEnum):
    INTERACTIVE = "interactive"
    BATCH = "batch"


def batch_may_start(*, pod_load: int, pod_slots: int, interactive_waiting: int) -> bool:
    """Whether a batch line may start on a pod whose load is ``pod_load`` (pure)."""
    return interactive_waiting == 0 and pod_load < pod_slots


class InteractiveSignal:
    """Per base model: when an interactive first answer last took longer than ``ttft_target_s``
    (None: never compared). Fed by the dispatcher, read by the batch runner's gate."""

    def __init__(self, ttft_target_s: float | None = None, now: Callable[[], float] = time.monotonic) -> None:
        self.ttft_target_s = ttft_target_s
        self._now = now
        self._slow_at_s: dict[str, float] = {}

    def first_answer(self, base_model: str, waited_s: float) -> None:
        """An interactive request of ``base_model`` got its first answer ``waited_s`` after it was routed."""
        if self.ttft_target_s is not None and waited_s > self.ttft_target_s:
            self._slow_at_s[base_model] = self._now()

    def slow_since(self, base_model: str, since_s: float) -> bool:
        """Whether an interactive first answer was slower than the target at or after ``since_s``."""
        return self._slow_at_s.get(base_model, -1.0) >= since_s
