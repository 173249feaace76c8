"""The engine tooling's error tree: every error ``trtfleet_engines`` raises on purpose.

::

    EnginesError                  anything the engine tooling refuses or fails to do
    ├── SpecError                 the BaseModel spec cannot be planned as written (fix the spec)
    │   ├── UnknownGpuError       engine.gpu.product is not in the GPU table
    │   ├── UnsupportedError      a combination TRT-LLM cannot build (fp8 on Ampere, PP with gemma, ...)
    │   │   └── ReleaseConstraintError  a rule of trtfleet_engines.constraints (the pinned release refuses it)
    │   └── DimensionsUnknownError  no config.json, no spec.dimensions and no built-in entry
    ├── PlanFileError             a plan.json that is not a plan this version can run
    ├── RenderError               a Triton model repository that cannot be rendered
    ├── BuildError                the build runner could not produce an engine
    │   └── StepFailedError       one step exited non-zero (step, exit code, stderr tail)
    └── StorageError              the destination cannot be read or written
        └── MissingDependencyError  an optional dependency (boto3 for s3://) is not installed

Capacity problems are not exceptions: :func:`trtfleet_engines.capacity.plan_capacity` returns them in
``CapacityPlan.problems`` with ``verdict == "error"``, because the operator reports them as a status
condition rather than failing. The CLI maps ``SpecError`` and pydantic validation errors to exit code 2,
everything else in this tree to exit code 1, in :mod:`trtfleet_engines.cli` only.
"""

from __future__ import annotations

from collections.abc import Sequence


class EnginesError(Exception):
    """Base of every error the engine tooling raises on purpose."""


class SpecError(EnginesError):
    """The BaseModel spec cannot be planned as written; the message says which field to change."""


class UnknownGpuError(SpecError):
    """``engine.gpu.product`` names a GPU trtfleet has no table entry for."""

    def __init__(self, product: str, known: Sequence[str]) -> None:
        self.product = product
        self.known = tuple(known)
        super().__init__(
            f"engine.gpu.product {product!r} is not a GPU trtfleet knows; use one of: {', '.join(self.known)}"
        )


class UnsupportedError(SpecError):
    """A combination of settings TRT-LLM cannot build."""


class ReleaseConstraintError(UnsupportedError):
    """The pinned TensorRT-LLM release refuses this spec; ``rule_id`` names the rule in
    :mod:`trtfleet_engines.constraints` (the message lists every broken rule and its fix)."""

    def __init__(self, rule_id: str, message: str) -> None:
        self.rule_id = rule_id
        super().__init__(message)


class DimensionsUnknownError(SpecError):
    """The model's dimensions are not known; capacity cannot be planned."""


class PlanFileError(EnginesError):
    """A plan file that is not valid JSON or not a plan this version of trtfleet can run."""


class RenderError(EnginesError):
    """A Triton model repository that cannot be rendered."""


class BuildError(EnginesError):
    """The build runner could not produce an engine."""


class StepFailedError(BuildError):
    """One build step exited non-zero."""

    def __init__(self, step_index: int, step_name: str, exit_code: int, stderr_tail: str) -> None:
        self.step_index = step_index
        self.step_name = step_name
        self.exit_code = exit_code
        self.stderr_tail = stderr_tail
        super().__init__(f"step {step_index} ({step_name}) exited with code {exit_code}")


class StorageError(EnginesError):
    """The destination of a build cannot be read or written."""


class MissingDependencyError(StorageError):
    """An optional dependency is needed for this destination and is not installed."""
