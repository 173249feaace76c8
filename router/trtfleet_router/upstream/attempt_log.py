"""The dispatcher's log lines for an attempt's end (under the dispatcher's logger name)."""

from __future__ import annotations

import logging

from trtfleet_router.routing.types import Decision
from trtfleet_router.upstream.call import UpstreamCall
from trtfleet_router.upstream.protocol import UpstreamFailure

log = logging.getLogger("trtfleet_router.upstream.dispatch")


def tracing() -> bool:
    """Whether :func:`log_done` writes its line: the dispatcher measures what goes in it only then."""
    return log.isEnabledFor(logging.DEBUG)


def log_done(
    call: UpstreamCall,
    decision: Decision,
    adapter_label: str,
    attempts: int,
    *,
    decided_s: float,
    first_answer_s: float | None,
    pod_load: int,
) -> None:
    """The debug line of an attempt that answered: where a request's time went (with a batch running, say).

    ``decided_s``: from the call's start to its last attempt's decision (capacity, hold and batch-lane waits
    included); ``first_answer_s``: from that decision to the pod's first answer (weights fetched and sent,
    the pod's queue and prefill); ``pod_load``: the pod's load as the attempt started, this request included."""
    log.debug(
        "upstream done",
        extra={
            "ctx": {
                "request_id": call.request_id,
                "pod": decision.pod,
                "adapter": adapter_label,
                "warm": decision.warm,
                "reason": decision.reason,
                "attempts": attempts,
                "priority": call.priority.value,
                "send_weights": decision.send_weights,
                "pod_load": pod_load,
                "decided_ms": round(decided_s * 1000, 1),
                "first_answer_ms": None if first_answer_s is None else round(first_answer_s * 1000, 1),
            }
        },
    )


def log_failure(call: UpstreamCall, decision: Decision, failure: UpstreamFailure, yielded: bool) -> None:
    log.warning(
        "upstream attempt failed",
        extra={
            "ctx": {
                "request_id": call.request_id,
                "pod": decision.pod,
                "warm": decision.warm,
                "adapter": call.target.adapter.served_name if call.target.adapter else None,
                "kind": failure.kind.value,
                "after_first_response": yielded,
                "error": failure.message[:500],
            }
        },
    )
