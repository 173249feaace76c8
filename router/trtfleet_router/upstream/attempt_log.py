"""The dispatcher's log lines for an attempt's end (under the dispatcher's logger name)."""

from __future__ import annotations

import logging

from trtfleet_router.routing.types import Decision
from trtfleet_router.upstream.call import UpstreamCall
from trtfleet_router.upstream.protocol import UpstreamFailure

log = logging.getLogger("trtfleet_router.upstream.dispatch")


def log_done(call: UpstreamCall, decision: Decision, adapter_label: str, attempts: int) -> None:
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
