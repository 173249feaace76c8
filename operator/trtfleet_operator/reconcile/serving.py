"""Rollout state of a serving Deployment (pure): Ready, RollingOut or Degraded.

* **Ready**: the Deployment controller has seen the current spec, runs the current pod template (its
  spec-hash annotation equals the desired one) and ``updated == ready == desired`` with no old pods left.
* **Degraded**: the current template was fully rolled out (the Deployment's Progressing condition says
  ``NewReplicaSetAvailable``, or this object was Ready or Degraded before) and fewer pods are ready than
  desired.
* **RollingOut**: anything else (a new engine or knob rolling, a scale-up, the first pods starting).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

from trtfleet_operator import conditions as cond
from trtfleet_operator.names import ANNOTATION_SPEC_HASH

ROLLOUT_COMPLETE = "RolloutComplete"
SCALED_TO_ZERO = "ScaledToZero"
ROLLING_OUT = "RollingOut"
REPLICAS_UNAVAILABLE = "ReplicasUnavailable"
WAITING_FOR_ENGINE = "WaitingForEngine"


@dataclass(frozen=True)
class ServingState:
    state: Literal["ready", "rolling", "degraded"]
    desired: int
    ready: int
    condition: cond.Condition


def _spec_hash(deployment: Mapping[str, Any]) -> str | None:
    template = deployment.get("spec", {}).get("template", {})
    annotations = template.get("metadata", {}).get("annotations") or {}
    value = annotations.get(ANNOTATION_SPEC_HASH)
    return str(value) if value is not None else None


def serving_state(desired: Mapping[str, Any], observed: Mapping[str, Any] | None, *, was_serving: bool) -> ServingState:
    """Compare the Deployment about to be applied with the one observed before applying it."""
    replicas = int(desired["spec"]["replicas"])
    name = desired["metadata"]["name"]
    if observed is None:
        message = f"creating Deployment {name} ({replicas} pod(s))"
        return ServingState("rolling", replicas, 0, cond.make(cond.READY, cond.FALSE, ROLLING_OUT, message))
    status = observed.get("status") or {}
    ready = int(status.get("readyReplicas") or 0)
    updated = int(status.get("updatedReplicas") or 0)
    total = int(status.get("replicas") or 0)
    current_spec = (
        int(status.get("observedGeneration") or 0) >= int(observed.get("metadata", {}).get("generation") or 0)
        and _spec_hash(observed) == _spec_hash(desired)
        and int(observed.get("spec", {}).get("replicas", -1)) == replicas
    )
    if current_spec and updated == replicas and ready >= replicas and total == replicas:
        if replicas == 0:
            return ServingState(
                "ready",
                0,
                0,
                cond.make(cond.READY, cond.TRUE, SCALED_TO_ZERO, "serving.replicas is 0: no pods run"),
            )
        return ServingState(
            "ready",
            replicas,
            ready,
            cond.make(
                cond.READY,
                cond.TRUE,
                ROLLOUT_COMPLETE,
                f"{ready} of {replicas} pod(s) ready on the current spec",
            ),
        )
    progressing = next((c for c in status.get("conditions") or [] if c.get("type") == "Progressing"), None)
    rolled_out = bool(progressing and progressing.get("reason") == "NewReplicaSetAvailable")
    if current_spec and updated >= replicas and ready < replicas and (rolled_out or was_serving):
        message = (
            f"{ready} of {replicas} pod(s) ready: check `kubectl describe pods -l "
            f"app.kubernetes.io/instance={name}` for crashes, evictions or unschedulable pods"
        )
        return ServingState(
            "degraded", replicas, ready, cond.make(cond.READY, cond.FALSE, REPLICAS_UNAVAILABLE, message)
        )
    message = f"rolling out Deployment {name}: {updated} of {replicas} pod(s) updated, {ready} ready"
    return ServingState("rolling", replicas, ready, cond.make(cond.READY, cond.FALSE, ROLLING_OUT, message))
