"""BaseModel autoscaling (pure): the object + demand signals + now -> replicas to write, status, events.

Level-based and restart-safe: everything the decision needs besides the signals is read from the object
(``spec.serving.replicas`` is the current size, ``status.autoscaling.recommendations`` the history of
the stabilisation windows, ``status.capacity.loraDevicePages`` the LoRA pages per pod), so a restarted
operator decides exactly as the old one would have. The operator writes the decision to
``spec.serving.replicas``, the field the ``scale`` subresource exposes (so ``kubectl get`` / ``describe``
and the Deployment all follow one number), and ``status.autoscaling`` with the ``ScalingActive``
condition; every change of replicas is an Event (``ScaledUp``, ``ScaledDown``, ``ScaledToZero``,
``ScaledFromZero``).

**Cold start** (:func:`cold_start`): a scale-up stamps ``status.autoscaling.scaleUpTime``; the first
tick that sees a pod whose Ready condition turned true at or after that time writes
``lastColdStartSeconds`` (decision to first new ready pod, at the Ready condition's 1 s resolution, not
the tick's) and a ``ColdStart`` Event, and clears the stamp.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from pydantic import ValidationError

from trtfleet.api import BaseModelSpec
from trtfleet.autoscaling import DemandSignals, Recommended, ScaleReason, decide
from trtfleet_operator import conditions as cond
from trtfleet_operator.reconcile.engine import rfc3339
from trtfleet_operator.reconcile.types import Event, Obj


@dataclass(frozen=True)
class Autoscaling:
    replicas: int | None
    """``spec.serving.replicas`` to write; None: leave it."""
    status: Obj
    """The status fields to write: ``autoscaling`` and ``conditions``."""
    events: tuple[Event, ...]


def _epoch_s(text: str) -> float:
    return datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()


def _history(status: Mapping[str, Any]) -> list[Recommended]:
    entries = ((status.get("autoscaling") or {}).get("recommendations")) or []
    history = []
    for entry in entries:
        try:
            history.append(Recommended(_epoch_s(str(entry["time"])), int(entry["replicas"])))
        except (KeyError, TypeError, ValueError):
            continue  # a hand-edited entry: the windows treat the time it covered as unknown
    return sorted(history, key=lambda h: h.time_s)


def _demand(signals: DemandSignals, sources: int) -> Obj:
    demand: Obj = {"requests": signals.requests, "heldRequests": signals.held_requests, "sources": sources}
    if signals.kv_cache_fraction is not None:
        demand["kvCacheFraction"] = round(signals.kv_cache_fraction, 4)
    if signals.active_adapter_pages is not None:
        demand["activeAdapterPages"] = signals.active_adapter_pages
    return demand


@dataclass(frozen=True)
class ColdStart:
    pending: str | None
    """``scaleUpTime`` to keep (None: no scale-up waits for a pod)."""
    measured_s: float | None
    """A cold start completed at this tick."""


def cold_start(
    pending: str | None, *, scaling_up: bool, desired: int, ready_since_s: Sequence[float], stamp: str
) -> ColdStart:
    """The scale-up wait after this tick: ``pending`` (the stamp read from status) measured against the
    Ready transition times of the ready pods (``ready_since_s``, epoch s); a new wait starts on a
    scale-up beyond the ready pods; a size the ready pods already meet ends a wait unmeasured."""
    measured: float | None = None
    if pending is not None:
        try:
            since_s = _epoch_s(pending)
        except ValueError:
            since_s, pending = 0.0, None  # a hand-edited stamp: dropped
        after = [t for t in ready_since_s if t >= since_s]
        if pending is not None and after:
            measured, pending = min(after) - since_s, None
    if pending is None and scaling_up and desired > len(ready_since_s):
        pending = stamp
    elif pending is not None and not scaling_up and desired <= len(ready_since_s):
        pending = None
    return ColdStart(pending, measured)


def autoscale_basemodel(
    obj: Obj,
    signals: DemandSignals | None,
    now: datetime,
    *,
    sources: int = 0,
    ready_since_s: Sequence[float] = (),
) -> Autoscaling | None:
    """The decision for one BaseModel; None when it has no (valid) ``spec.autoscaling``. ``ready_since_s``:
    when each ready serving pod turned ready (epoch s), for the cold start."""
    try:
        spec = BaseModelSpec.model_validate(obj["spec"])
    except ValidationError:
        return None  # the BaseModel reconcile reports the invalid spec
    if spec.autoscaling is None:
        return None
    status = obj.get("status") or {}
    current = spec.serving.replicas
    capacity = status.get("capacity") or {}
    pages = capacity.get("loraDevicePages")
    decision = decide(
        spec.autoscaling,
        signals,
        _history(status),
        current,
        now.timestamp(),
        lora_pages_per_pod=int(pages) if isinstance(pages, int) and pages > 0 else None,
    )
    old = status.get("autoscaling") or {}
    stamp = rfc3339(now)
    autoscaling: Obj = {
        "desiredReplicas": decision.replicas,
        "currentReplicas": int(status.get("readyReplicas") or 0),
        "recommendations": [
            {"time": rfc3339(datetime.fromtimestamp(h.time_s, UTC)), "replicas": h.replicas} for h in decision.history
        ],
    }
    last_scale = stamp if decision.replicas != current else old.get("lastScaleTime")
    if last_scale:
        autoscaling["lastScaleTime"] = last_scale
    wait = cold_start(
        old.get("scaleUpTime"), scaling_up=decision.replicas > current, desired=decision.replicas,
        ready_since_s=ready_since_s, stamp=stamp,
    )
    if wait.pending is not None:
        autoscaling["scaleUpTime"] = wait.pending
    elif old.get("scaleUpTime"):
        autoscaling["scaleUpTime"] = None  # a merge patch deletes it
    measured = round(wait.measured_s, 1) if wait.measured_s is not None else old.get("lastColdStartSeconds")
    if measured is not None:
        autoscaling["lastColdStartSeconds"] = measured
    if signals is not None:
        autoscaling["lastDemand"] = _demand(signals, sources)
    elif old.get("lastDemand"):
        autoscaling["lastDemand"] = old["lastDemand"]
    active = cond.FALSE if decision.reason is ScaleReason.NO_SIGNALS else cond.TRUE
    generation = obj["metadata"].get("generation")
    condition = cond.make(cond.SCALING_ACTIVE, active, decision.reason.value, decision.message, generation=generation)
    others = [c for c in status.get("conditions") or [] if c.get("type") != cond.SCALING_ACTIVE]
    conditions = cond.merge(status.get("conditions"), [*others, condition], now=stamp)
    events: list[Event] = []
    if decision.replicas != current:
        events.append(Event("Normal", decision.reason.value, decision.message))
    if wait.measured_s is not None:
        events.append(Event("Normal", "ColdStart", f"first new pod ready {wait.measured_s:.0f} s after the scale-up"))
    prior = cond.find(status.get("conditions"), cond.SCALING_ACTIVE)
    if decision.reason is ScaleReason.NO_SIGNALS and (prior or {}).get("reason") != decision.reason.value:
        events.append(Event("Warning", decision.reason.value, decision.message))
    return Autoscaling(
        decision.replicas if decision.replicas != current else None,
        {"autoscaling": autoscaling, "conditions": conditions},
        tuple(events),
    )
