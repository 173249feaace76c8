"""Kubernetes-style conditions (metav1.Condition) on the wire: types, reasons and a pure merge.

BaseModel conditions: ``CapacityPlanned``, ``EngineBuilt``, ``Ready``, with InferencePools on
``InferencePoolReady``, with ``spec.autoscaling`` the autoscaler's ``ScalingActive`` and, while a deletion waits
for Adapters, ``DeletionBlocked``. Adapter conditions: ``Validated``, ``Converted``, ``Ready``, and the merge
timer's ``MergeRecommended`` (kept by the reconciler, :func:`keep`). Every reason is CamelCase and every message
says what to do about it.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

CAPACITY_PLANNED = "CapacityPlanned"
ENGINE_BUILT = "EngineBuilt"
READY = "Ready"
DELETION_BLOCKED = "DeletionBlocked"
SCALING_ACTIVE = "ScalingActive"
VALIDATED = "Validated"
CONVERTED = "Converted"
BASE_VARIANT_READY = "BaseVariantReady"
MERGE_RECOMMENDED = "MergeRecommended"
INFERENCE_POOL_READY = "InferencePoolReady"

_ORDER = (
    VALIDATED, CAPACITY_PLANNED, ENGINE_BUILT, CONVERTED, BASE_VARIANT_READY, READY, INFERENCE_POOL_READY,
    SCALING_ACTIVE, MERGE_RECOMMENDED, DELETION_BLOCKED
)

TRUE = "True"
FALSE = "False"
UNKNOWN = "Unknown"

MESSAGE_LIMIT = 4000
"""Longest message kept (a termination message is 4 KiB at most; conditions stay readable)."""

Condition = dict[str, Any]


def make(type_: str, status: str, reason: str, message: str = "", *, generation: int | None = None) -> Condition:
    """One condition without its transition time (set by :func:`merge`)."""
    condition: Condition = {
        "type": type_,
        "status": status,
        "reason": reason,
        "message": message[:MESSAGE_LIMIT],
    }
    if generation is not None:
        condition["observedGeneration"] = generation
    return condition


def merge(old: Sequence[Condition] | None, new: Iterable[Condition], *, now: str) -> list[Condition]:
    """The new conditions, keeping ``lastTransitionTime`` of those whose status did not change.

    Conditions of ``old`` whose type is not in ``new`` are dropped. Output order is fixed.
    """
    previous = {c.get("type"): c for c in old or ()}
    merged = []
    for condition in new:
        before = previous.get(condition["type"])
        changed = before is None or before.get("status") != condition["status"]
        stamp = now if changed or not before or not before.get("lastTransitionTime") else before["lastTransitionTime"]
        merged.append({**condition, "lastTransitionTime": stamp})
    return sorted(merged, key=lambda c: (_ORDER.index(c["type"]) if c["type"] in _ORDER else 99, c["type"]))


def keep(new: Sequence[Condition], old: Sequence[Condition] | None, types: Iterable[str]) -> list[Condition]:
    """``new`` plus the conditions of ``types`` from ``old`` that ``new`` lacks (another writer's), in order."""
    have = {c["type"] for c in new}
    kept = [c for c in old or () if c.get("type") in set(types) and c.get("type") not in have]
    return sorted([*new, *kept], key=lambda c: (_ORDER.index(c["type"]) if c["type"] in _ORDER else 99, c["type"]))


def find(conditions: Sequence[Condition] | None, type_: str) -> Condition | None:
    for condition in conditions or ():
        if condition.get("type") == type_:
            return condition
    return None
