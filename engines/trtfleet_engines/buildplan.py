"""A build plan as data: its steps and its JSON form (``plan.json``, what the build Job runs).

Made by :mod:`trtfleet_engines.plan` (re-exported there), run by :mod:`trtfleet_engines.runner`.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from trtfleet.api.basemodel import BaseModelSpec
from trtfleet_engines.errors import PlanFileError

PLAN_FORMAT_VERSION = 1
"""Bump when plans or engine layouts change in a way that must not reuse engines built before."""
SHORT_HASH_LENGTH = 16

StepKind = Literal["fetch", "command", "stage"]


@dataclass(frozen=True)
class FetchStep:
    """Make ``uri`` readable at ``local_dir``; ``download`` False means it is read in place."""

    name: str
    scheme: str
    uri: str
    revision: str | None
    local_dir: str
    download: bool
    kind: StepKind = "fetch"


@dataclass(frozen=True)
class CommandStep:
    """Run ``argv`` (``argv[0]`` is ``python3`` + a script path, ``trtllm-build`` or ``trtfleet``)."""

    name: str
    argv: tuple[str, ...]
    kind: StepKind = "command"


@dataclass(frozen=True)
class StageStep:
    """Copy the tokenizer (or the whole model) and render the Triton model repository (runner-internal)."""

    name: str
    model_dir: str
    engine_dir: str
    copy_whole_model: bool
    serve_engine_dir: str
    serve_tokenizer_dir: str
    kind: StepKind = "stage"


Step = FetchStep | CommandStep | StageStep


@dataclass(frozen=True)
class BuildPlan:
    """Everything the runner needs: the steps, the engine's identity and the spec to render from."""

    engine_hash: str
    image: str
    gpu_sm: str
    workdir: str
    steps: tuple[Step, ...]
    spec: Mapping[str, Any] = field(compare=False)
    merged_adapter: Mapping[str, Any] | None = None
    format_version: int = PLAN_FORMAT_VERSION

    @property
    def engine_hash_short(self) -> str:
        return self.engine_hash[:SHORT_HASH_LENGTH]

    @property
    def render_spec(self) -> BaseModelSpec:
        return BaseModelSpec.model_validate(self.spec)

    def to_json_dict(self) -> dict[str, Any]:
        return {
            "formatVersion": self.format_version,
            "engineHash": self.engine_hash,
            "engineHashShort": self.engine_hash_short,
            "image": self.image,
            "gpuSm": self.gpu_sm,
            "workdir": self.workdir,
            "mergedAdapter": dict(self.merged_adapter) if self.merged_adapter is not None else None,
            "steps": [_step_to_json(step) for step in self.steps],
            "spec": dict(self.spec),
        }

    def to_json(self) -> str:
        return json.dumps(self.to_json_dict(), indent=2, sort_keys=True) + "\n"

    @classmethod
    def from_json_dict(cls, data: Mapping[str, Any]) -> BuildPlan:
        if data.get("formatVersion") != PLAN_FORMAT_VERSION:
            raise PlanFileError(
                f"plan formatVersion {data.get('formatVersion')!r} is not {PLAN_FORMAT_VERSION}: "
                "re-run `trtfleet engines plan` with this version of trtfleet"
            )
        try:
            return cls(
                engine_hash=str(data["engineHash"]),
                image=str(data["image"]),
                gpu_sm=str(data["gpuSm"]),
                workdir=str(data["workdir"]),
                steps=tuple(_step_from_json(step) for step in data["steps"]),
                spec=dict(data["spec"]),
                merged_adapter=data.get("mergedAdapter"),
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise PlanFileError(f"not a trtfleet build plan: {exc!r}") from exc


def _step_to_json(step: Step) -> dict[str, Any]:
    if isinstance(step, FetchStep):
        return {"kind": step.kind, "name": step.name, "scheme": step.scheme, "uri": step.uri,
                "revision": step.revision, "localDir": step.local_dir, "download": step.download}
    if isinstance(step, CommandStep):
        return {"kind": step.kind, "name": step.name, "argv": list(step.argv)}
    return {"kind": step.kind, "name": step.name, "modelDir": step.model_dir, "engineDir": step.engine_dir,
            "copyWholeModel": step.copy_whole_model, "serveEngineDir": step.serve_engine_dir,
            "serveTokenizerDir": step.serve_tokenizer_dir}


def _step_from_json(data: Mapping[str, Any]) -> Step:
    kind = data["kind"]
    if kind == "fetch":
        return FetchStep(str(data["name"]), str(data["scheme"]), str(data["uri"]), data.get("revision"),
                         str(data["localDir"]), bool(data["download"]))
    if kind == "command":
        return CommandStep(str(data["name"]), tuple(str(a) for a in data["argv"]))
    if kind == "stage":
        return StageStep(str(data["name"]), str(data["modelDir"]), str(data["engineDir"]),
                         bool(data["copyWholeModel"]), str(data["serveEngineDir"]),
                         str(data["serveTokenizerDir"]))
    raise ValueError(f"unknown step kind {kind!r}")
