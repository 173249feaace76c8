"""Kubernetes Events and metric counters derived from a status change (pure).

An event is emitted when a condition's status or reason changes, and when the phase changes; so a
reconcile that changes nothing says nothing, however often it runs.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from trtfleet_operator import conditions as cond
from trtfleet_operator.reconcile.types import Counter, Event

BUILD_FAILURE_REASONS = frozenset({"BuildFailed", "BuildRetrying", "PrepareFailed", "PrepareRetrying"})
WARNING_REASONS = frozenset(
    {
        *BUILD_FAILURE_REASONS,
        "AdaptersRemaining",
        "BaseModelInvalid",
        "BaseModelNotFound",
        "CRDNotServed",
        "ConversionFailed",
        "DimensionsUnknown",
        "DoesNotFit",
        "DtypeMismatch",
        "InvalidSpec",
        "LoraNotEnabled",
        "ModulesNotTargeted",
        "PickerServiceMissing",
        "RankTooHigh",
        "ReplicasUnavailable",
        "Unsupported",
        "UnknownGpu",
    }
)
"""Reasons that need a person: their transitions are Warning events, every other one Normal."""


def status_events(old: Mapping[str, Any], new: Mapping[str, Any]) -> tuple[list[Event], list[Counter]]:
    events: list[Event] = []
    counters: list[Counter] = []
    before = {c.get("type"): c for c in old.get("conditions") or []}
    for condition in new.get("conditions") or []:
        prior = before.get(condition["type"])
        if prior is not None and (prior.get("status"), prior.get("reason")) == (
            condition["status"],
            condition["reason"],
        ):
            continue
        if prior is None and condition["status"] == cond.UNKNOWN:
            continue
        warning = condition["reason"] in WARNING_REASONS
        events.append(Event("Warning" if warning else "Normal", condition["reason"], condition.get("message", "")))
        if condition["type"] == cond.ENGINE_BUILT and condition["reason"] in BUILD_FAILURE_REASONS:
            if prior is None or prior.get("reason") not in BUILD_FAILURE_REASONS:
                counters.append("build_failed")
    if old.get("phase") != new.get("phase") and new.get("phase"):
        phase = str(new["phase"])
        text = f"phase {old.get('phase') or 'none'} -> {phase}"
        events.append(Event("Warning" if phase in ("Failed", "Degraded") else "Normal", f"Phase{phase}", text))
    return events, counters
