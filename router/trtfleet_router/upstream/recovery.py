"""The dispatcher's recovery rules as one pure function: what to do after an attempt failed.

:func:`next_step` takes the classified failure and where the request stands, and answers with a
:class:`Step`. The rules, in order:

1. a failure after the first response reached the client is never retried (the client already has part
   of the answer): the stream ends with :class:`~trtfleet_router.errors.StreamInterrupted`;
2. a LoRA cache miss of an id-only attempt is retried once on the same pod *with* the weights;
3. a full queue or cache, a broken pod or a pod that stayed silent past the stream timeouts is retried on
   another pod while attempts are left;
4. anything else (invalid request, the request deadline, an unknown error) ends the request.

Independently, :attr:`Step.blames_pod` says whether the failure counts against the pod for outlier
detection (see ``routing/outlier.py``): only a broken or silent pod does, never a request error.
:func:`final_error` is the one translation of an upstream failure into the client-facing error.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from typing import Final

from trtfleet_router.errors import (
    NoCapacityAvailable,
    Overloaded,
    RouterError,
    StreamInterrupted,
    Unavailable,
    UpstreamFailed,
    UpstreamRejected,
    UpstreamTimeout,
)
from trtfleet_router.upstream.protocol import FailureKind, UpstreamFailure


class Action(StrEnum):
    RETRY_WITH_WEIGHTS = "retry_with_weights"  # same pod, the adapter's weights attached
    RETRY_ELSEWHERE = "retry_elsewhere"  # another pod (this one excluded)
    GIVE_UP = "give_up"  # answer the client with final_error


@dataclass(frozen=True, slots=True)
class AttemptState:
    """Where the request stands when an attempt failed."""

    attempts: int  # attempts made, this one included
    max_attempts: int
    yielded: bool  # a response of this attempt reached the client
    miss_recovered: bool  # the one miss recovery was already used
    sent_weights: bool  # this attempt carried the adapter's weights
    has_adapter: bool


@dataclass(frozen=True, slots=True)
class Step:
    action: Action
    blames_pod: bool

    @property
    def retries(self) -> bool:
        return self.action is not Action.GIVE_UP


def next_step(failure: UpstreamFailure, state: AttemptState) -> Step:
    """What to do after ``failure`` (the rules of the module docstring)."""
    blame = failure.blames_pod
    if state.yielded:
        return Step(Action.GIVE_UP, blame)
    if failure.kind is FailureKind.MISS and state.has_adapter and not state.miss_recovered and not state.sent_weights:
        return Step(Action.RETRY_WITH_WEIGHTS, blame)
    if failure.retry_elsewhere and state.attempts < state.max_attempts:
        return Step(Action.RETRY_ELSEWHERE, blame)
    return Step(Action.GIVE_UP, blame)


_OVERLOAD: Final = frozenset({FailureKind.CACHE_FULL, FailureKind.QUEUE_FULL})


def final_error(failure: UpstreamFailure, pod: str, *, yielded: bool = False, retry_after_s: int = 1) -> RouterError:
    """The client-facing error once no retry is left."""
    kind = failure.kind
    if yielded:
        return StreamInterrupted(f"the stream from pod {pod} broke after it started: {failure.message}")
    if kind in _OVERLOAD:
        return Overloaded(f"the serving pods are busy: {failure.message}", retry_after_s=retry_after_s)
    if kind in (FailureKind.POD_FAILED, FailureKind.STALLED):
        return Unavailable(f"pod {pod} failed: {failure.message}", retry_after_s=retry_after_s)
    if kind is FailureKind.INVALID:
        return UpstreamRejected(f"the engine rejected the request: {failure.message}")
    if kind is FailureKind.TIMEOUT:
        return UpstreamTimeout(f"no answer from pod {pod} before the deadline")
    if kind is FailureKind.MISS:
        return UpstreamFailed(f"pod {pod} did not accept the adapter's weights: {failure.message}")
    return UpstreamFailed(f"pod {pod} failed: {failure.message}")


def no_pod_error(reason: str, last: UpstreamFailure | None, retry_after_s: int) -> RouterError:
    """The client-facing error when the fleet has no pod left for the request (after any wait)."""
    if last is not None and last.kind in _OVERLOAD:
        return Overloaded(f"every pod tried is busy ({last.message}); retry later", retry_after_s=retry_after_s)
    if last is not None:
        return Unavailable(f"no pod could serve the request; last error: {last.message}", retry_after_s=retry_after_s)
    return NoCapacityAvailable(reason, retry_after_s=retry_after_s)
