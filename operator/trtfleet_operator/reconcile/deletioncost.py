"""Least-valuable scale-down (pure): which serving pod the Deployment should remove first.

Before it lowers ``spec.serving.replicas``, the autoscaler sets Kubernetes' pod-deletion-cost annotation
on every serving pod whose cost changed: the requests in the routers' activity window for the adapters
warm on that pod (``trtfleet_router_pod_warm_demand``, summed over router replicas). The ReplicaSet
controller removes, among pods equal in its earlier rules (not ready before ready, ...), the one with the
lowest cost first, so the pod whose warm set is worth least goes and the hot adapters stay warm. A pod no
router reports (not ready yet, or unknown to them) costs 0. Only on a scale-down: Kubernetes advises
against updating the annotation often, and it matters only then.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Final

from trtfleet_operator.reconcile.types import Obj

DELETION_COST: Final = "controller.kubernetes.io/pod-deletion-cost"
COST_MAX: Final = 2**31 - 1
"""The annotation is an int32."""


def deletion_cost(warm_demand: float) -> int:
    if warm_demand != warm_demand or warm_demand <= 0:  # NaN or nothing warm
        return 0
    return min(COST_MAX, round(warm_demand))


def deletion_cost_patches(pods: Sequence[Obj], warm_demand: Mapping[str, float]) -> list[tuple[str, str]]:
    """``(pod name, annotation value)`` for every pod whose deletion cost must change."""
    patches = []
    for pod in pods:
        meta = pod.get("metadata") or {}
        name = meta.get("name")
        if not name or meta.get("deletionTimestamp"):
            continue
        cost = str(deletion_cost(warm_demand.get(name, 0.0)))
        if (meta.get("annotations") or {}).get(DELETION_COST) != cost:
            patches.append((name, cost))
    return patches
