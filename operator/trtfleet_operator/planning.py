"""The engine tooling's planners as the operator sees them: pure calls, errors turned into reasons.

``trtfleet_engines`` raises ``SpecError`` subclasses for specs it cannot plan; here they become a
:class:`~trtfleet_operator.errors.PlanningError` (for builds) or a failed :class:`CapacityVerdict`
(for capacity), with a CamelCase reason for the status condition.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from trtfleet_engines import plan as engine_plan
from trtfleet_engines.capacity import plan_capacity as engines_plan_capacity
from trtfleet_engines.errors import (
    DimensionsUnknownError,
    ReleaseConstraintError,
    SpecError,
    UnknownGpuError,
    UnsupportedError,
)

from trtfleet.api.basemodel import BaseModelSpec
from trtfleet_operator.errors import PlanningError

UNSUPPORTED_BY_RELEASE = "UnsupportedByRelease"
"""Reason of a spec the pinned TensorRT-LLM release refuses (a rule of ``trtfleet_engines.constraints``);
the message names the rule, the upstream source and the fix."""
FITS = "Fits"
FITS_WITH_WARNINGS = "FitsWithWarnings"
DOES_NOT_FIT = "DoesNotFit"


@dataclass(frozen=True)
class EnginePlan:
    """What the operator needs of a build plan: the hash, the plan file, the spec serving renders from."""

    engine_hash: str
    plan_json: str
    render_spec: BaseModelSpec


@dataclass(frozen=True)
class CapacityVerdict:
    fits: bool
    reason: str
    message: str
    status: dict[str, Any] | None


def _reason(exc: SpecError) -> str:
    if isinstance(exc, UnknownGpuError):
        return "UnknownGpu"
    if isinstance(exc, DimensionsUnknownError):
        return "DimensionsUnknown"
    if isinstance(exc, ReleaseConstraintError):
        return UNSUPPORTED_BY_RELEASE
    if isinstance(exc, UnsupportedError):
        return "Unsupported"
    return "InvalidSpec"


def plan_engine(spec: BaseModelSpec) -> EnginePlan:
    try:
        plan = engine_plan.plan_engine_build(spec)
    except SpecError as exc:
        raise PlanningError(_reason(exc), str(exc)) from exc
    return EnginePlan(plan.engine_hash, plan.to_json(), plan.render_spec)


def plan_merged(spec: BaseModelSpec, adapter_uri: str, adapter_revision: str | None) -> EnginePlan:
    try:
        plan = engine_plan.plan_merged_engine_build(spec, adapter_uri, adapter_revision)
    except SpecError as exc:
        raise PlanningError(_reason(exc), str(exc)) from exc
    return EnginePlan(plan.engine_hash, plan.to_json(), plan.render_spec)


def plan_capacity(spec: BaseModelSpec) -> CapacityVerdict:
    """Whether ``spec`` fits its GPUs, in the words of the capacity planner."""
    try:
        plan = engines_plan_capacity(spec)
    except SpecError as exc:
        return CapacityVerdict(False, _reason(exc), str(exc), None)
    problems = [str(p) for p in plan.problems]
    status = plan.to_status()
    if plan.verdict == "error":
        return CapacityVerdict(False, DOES_NOT_FIT, "; ".join(problems) or "the spec does not fit", status)
    if problems:
        return CapacityVerdict(True, FITS_WITH_WARNINGS, "; ".join(problems), status)
    return CapacityVerdict(True, FITS, "the engine, KV cache and LoRA cache fit the GPU memory", status)
