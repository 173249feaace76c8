"""The BaseModel's InferencePool step (pure): what to apply and the ``InferencePoolReady`` condition.

Only with the operator's ``--inference-pool-picker`` (the chart's ``gateway.inferencePool``). Then:

* the cluster does not serve ``inference.networking.k8s.io/v1`` InferencePools: nothing is applied, the condition
  is False (``CRDNotServed``) and says how to get one; the next reconcile after the CRD is installed creates it,
  without an error or a retry loop meanwhile;
* served: the pool is applied (server-side, like every other object); the condition is True (``Applied``), or
  False (``PickerServiceMissing``) when the picker Service, or its port, is not in the BaseModel's namespace,
  where the pool's ``endpointPickerRef`` looks for it.
"""

from __future__ import annotations

from dataclasses import dataclass

from trtfleet.api.basemodel import BaseModelSpec
from trtfleet_operator import conditions as cond
from trtfleet_operator.builders.inferencepool import (
    INFERENCE_POOL_API_VERSION,
    build_inference_pool,
    failure_mode,
    http_port,
)
from trtfleet_operator.config import InferencePoolConfig
from trtfleet_operator.reconcile.types import Obj

APPLIED = "Applied"
CRD_NOT_SERVED = "CRDNotServed"
PICKER_SERVICE_MISSING = "PickerServiceMissing"


@dataclass(frozen=True)
class PoolObserved:
    """What the cluster says: whether it serves InferencePools, and the picker Service of the namespace."""

    crd_served: bool
    picker_service: Obj | None


@dataclass(frozen=True)
class PoolOutcome:
    apply: tuple[Obj, ...]
    condition: cond.Condition


def _service_ports(service: Obj) -> set[int]:
    return {int(p["port"]) for p in (service.get("spec") or {}).get("ports") or () if "port" in p}


def inference_pool_step(
    spec: BaseModelSpec,
    *,
    name: str,
    namespace: str,
    owner: Obj,
    basemodel: str,
    picker: InferencePoolConfig,
    observed: PoolObserved,
    generation: int,
) -> PoolOutcome:
    """The pool to apply (none while the CRD is not served) and what the condition says about it."""
    if not observed.crd_served:
        message = (
            f"the cluster does not serve {INFERENCE_POOL_API_VERSION} InferencePools, so none is created: install "
            "the Gateway API Inference Extension's CRD (v1.0 or later), and the next reconcile creates InferencePool "
            f"{name}"
        )
        return PoolOutcome((), cond.make(cond.INFERENCE_POOL_READY, cond.FALSE, CRD_NOT_SERVED, message,
                                         generation=generation))
    pool = build_inference_pool(spec, name=name, namespace=namespace, owner=owner, basemodel=basemodel, picker=picker)
    service = observed.picker_service
    target = f"Service {picker.picker_service} port {picker.picker_port}"
    if service is None or picker.picker_port not in _service_ports(service):
        missing = "has no such port" if service is not None else "does not exist"
        message = (
            f"InferencePool {name} is applied, but its endpoint picker, {target}, {missing} in namespace "
            f"{namespace}: an InferencePool's endpointPickerRef names a Service of its own namespace. Install the "
            f"trtfleet chart's picker there (gateway.inferencePool.enabled, gateway.picker.service.name "
            f"{picker.picker_service}) or create this BaseModel in the picker's namespace"
        )
        return PoolOutcome((pool,), cond.make(cond.INFERENCE_POOL_READY, cond.FALSE, PICKER_SERVICE_MISSING,
                                              message, generation=generation))
    message = (
        f"InferencePool {name}: the serving pods' port {http_port(spec)}, endpoint picker {target}, "
        f"failureMode {failure_mode(spec).value}"
    )
    return PoolOutcome((pool,), cond.make(cond.INFERENCE_POOL_READY, cond.TRUE, APPLIED, message,
                                          generation=generation))
