"""Interactive first: the priority class of a routed request and the rule that admits batch lines.

Every request the dispatcher routes carries a :class:`Priority`: ``interactive`` (a client's request)
or ``batch`` (a line of the batch runner). The classes differ in two places only:

* **waiting for capacity** (:mod:`.capacity`): interactive waiters are woken before any batch waiter;
* **admission to a pod**: a batch line starts on the pod its route chose only while
  :func:`batch_may_start` holds: no interactive request of its base model waits for capacity, and the
  pod's load (this router's in-flight requests plus the pod's scraped queue) is below ``pod_slots``
  (below the engine's max batch, so an interactive request finds a free slot without queueing behind
  batch lines: an engine does not preempt a running sequence), and no interactive prompt there still
  waits for its first answer (:class:`PrefillGate`: a batch prompt that starts then shares the pod's
  next steps with that prefill and lengthens them; ``fleet`` widens this to every pod of the base
  model, ``off`` drops it). Otherwise the line waits in the batch lane and routes again when a request
  ends or an interactive first answer arrives; after ``capacity_wait_s`` it starts anyway (the bound
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
from collections.abc import Callable, Iterable
from enum import StrEnum
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from trtfleet_router.routing.fleet import Fleet


class Priority(StrEnum):
    INTERACTIVE = "interactive"
    BATCH = "batch"


class PrefillGate(StrEnum):
    """Where an interactive prompt still waiting for its first answer holds batch lines back."""

    POD = "pod"
    """On its own pod (the default): the steps its prefill is in."""
    FLEET = "fleet"
    """On every pod of its base model: also the router's and any shared host's CPU."""
    OFF = "off"


def interactive_prefilling(
    gate: PrefillGate, pod: str, pending_tokens: Callable[[str], int], pods: Iterable[str]
) -> bool:
    """Whether ``gate`` holds a batch line back from ``pod`` (pure): ``pending_tokens(pod)`` is the
    interactive prefill booked on a pod and not yet answered (batch lines book none)."""
    if gate is PrefillGate.POD:
        return pending_tokens(pod) > 0
    if gate is PrefillGate.FLEET:
        return any(pending_tokens(other) > 0 for other in pods)
    return False


def batch_may_start(*, pod_load: int, pod_slots: int, interactive_waiting: int, prefilling: bool = False) -> bool:
    """Whether a batch line may start on a pod whose load is ``pod_load`` (pure)."""
    return interactive_waiting == 0 and not prefilling and pod_load < pod_slots


def batch_admits(fleet: Fleet, pod: str, pod_slots: int, interactive_waiting: int, gate: PrefillGate) -> bool:
    """:func:`batch_may_start` for a batch line routed to ``pod`` of ``fleet`` now."""
    held = interactive_prefilling(gate, pod, fleet.prefix_index.pending_prefill_tokens, fleet.pods)
    return batch_may_start(
        pod_load=fleet.load_of(pod), pod_slots=pod_slots, interactive_waiting=interactive_waiting, prefilling=held
    )


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
