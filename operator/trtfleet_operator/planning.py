"""The engine tooling's planners as the operator sees them: pure calls, errors turned into reasons.

``trtfleet_engines`` raises ``SpecError`` subclasses for specs it cannot plan; here they become a
:class:`~trtfleet_operator.errors.PlanningError` (for builds) or a failed :class:`CapacityVerdict`
(for capacity), with a CamelCase reason for the status condition.

``runtime: pytorch`` plans with :mod:`trtfleet_engines.pytorch` instead: the "engine" of its
:class:`EnginePlan` is the staged checkpoint (hash = ``prepare_hash``, plan file = the prepare plan),
and the plan carries the rendered LLM-API options; its capacity verdict is the PyTorch backend's memory
plan, whose ``max_loras`` / ``max_cpu_loras`` go to ``status.capacity``.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from trtfleet_engines import plan as engine_plan
from trtfleet_engines.capacity import plan_capacity as engines_plan_capacity
from trtfleet_engines.capacity import speculation_status
from trtfleet_engines.constraints import check_speculative
from trtfleet_engines.errors import (
    DimensionsUnknownError,
    ReleaseConstraintError,
    SpecError,
    UnknownGpuError,
    UnsupportedError,
)
from trtfleet_engines.gpus import lookup_gpu
from trtfleet_engines.pytorch.capacity import PytorchCapacityPlan, plan_pytorch_capacity
from trtfleet_engines.pytorch.llmapi import MODEL_YAML_NAME, render_llmapi_model_yaml
from trtfleet_engines.pytorch.options import OPTIONS_FILE_NAME, render_llm_api_options
from trtfleet_engines.pytorch.serving import MergedAdapterSource, PreparePlan, plan_prepare
from trtfleet_engines.speculation import vocabularies

from trtfleet.api.adapter import BaseQuantizationSpec
from trtfleet.api.basemodel import BaseModelSpec, Runtime, ServingServer
from trtfleet_operator.errors import PlanningError

UNSUPPORTED_BY_RELEASE = "UnsupportedByRelease"
"""Reason of a spec the pinned TensorRT-LLM release refuses (a rule of ``trtfleet_engines.constraints``);
the message names the rule, the upstream source and the fix."""
FITS = "Fits"
FITS_WITH_WARNINGS = "FitsWithWarnings"
DOES_NOT_FIT = "DoesNotFit"
MODEL_CACHE_MOUNT = "/model-cache"
"""Where the model cache (the engine PVC) is mounted in prepare Jobs and ``trtllm-serve`` pods alike, so the
staged checkpoint has one path everywhere."""


@dataclass(frozen=True)
class EnginePlan:
    """What the operator needs of a build plan: the hash, the plan file, the spec serving renders from."""

    engine_hash: str
    plan_json: str
    render_spec: BaseModelSpec
    prepare: PreparePlan | None = None
    """runtime pytorch: what the prepare Job stages (``engine_hash`` is its ``prepare_hash``)."""
    options_yaml: str | None = None
    """runtime pytorch: the LLM-API options file ``trtllm-serve --config`` reads, or with
    ``serving.server: triton`` the llmapi model's ``model.yaml`` (the same options plus model and
    ``triton_config``)."""
    options_file: str = OPTIONS_FILE_NAME
    """The name of that file in the options ConfigMap."""


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
    if spec.runtime is Runtime.PYTORCH:
        return plan_pytorch(spec)
    try:
        plan = engine_plan.plan_engine_build(spec)
    except SpecError as exc:
        raise PlanningError(_reason(exc), str(exc)) from exc
    return EnginePlan(plan.engine_hash, plan.to_json(), plan.render_spec)


def plan_merged(spec: BaseModelSpec, adapter_uri: str, adapter_revision: str | None) -> EnginePlan:
    """A merged Adapter's engine (tensorrtllm, reference) or prepared checkpoint (pytorch): the adapter folded
    into the base weights, served with LoRA off (``render_spec``)."""
    if spec.runtime is Runtime.PYTORCH:
        return plan_pytorch(spec, MergedAdapterSource(adapter_uri, adapter_revision))
    try:
        plan = engine_plan.plan_merged_engine_build(spec, adapter_uri, adapter_revision)
    except SpecError as exc:
        raise PlanningError(_reason(exc), str(exc)) from exc
    return EnginePlan(plan.engine_hash, plan.to_json(), plan.render_spec)


def plan_variant(spec: BaseModelSpec, base_quantization: BaseQuantizationSpec) -> EnginePlan:
    """A QLoRA base variant's engine (tensorrtllm, reference) or prepared checkpoint (pytorch): the base's linear
    weights quantized and dequantized as bitsandbytes does, served with LoRA like the base."""
    if spec.runtime is Runtime.PYTORCH:
        return plan_pytorch(spec, base_quantization=base_quantization.variant_text())
    try:
        plan = engine_plan.plan_variant_engine_build(spec, base_quantization)
    except SpecError as exc:
        raise PlanningError(_reason(exc), str(exc)) from exc
    return EnginePlan(plan.engine_hash, plan.to_json(), plan.render_spec)


def plan_pytorch(
    spec: BaseModelSpec, merged: MergedAdapterSource | None = None, *, base_quantization: str | None = None
) -> EnginePlan:
    """The prepare plan (under :data:`MODEL_CACHE_MOUNT`) and the options file of a ``pytorch`` spec
    (``model.yaml`` on the staged checkpoint when ``serving.server`` is triton); with ``merged`` the checkpoint
    has that adapter folded in and the options have no LoRA; with ``base_quantization`` it is QLoRA's base variant."""
    triton = spec.serving.server_or_default is ServingServer.TRITON
    serve_spec = spec if merged is None else engine_plan.merged_spec(spec)
    try:
        base_vocab, draft_vocab = vocabularies(serve_spec)
        check_speculative(serve_spec, base_vocab=base_vocab, draft_vocab=draft_vocab)
        prepare = plan_prepare(spec, cache_root=MODEL_CACHE_MOUNT, merged=merged, base_quantization=base_quantization)
        draft_dir = prepare.draft.destination_dir if prepare.draft is not None else None
        if triton:
            options = render_llmapi_model_yaml(serve_spec, checkpoint_dir=prepare.serve_checkpoint_dir,
                                               draft_dir=draft_dir)
        else:
            options = render_llm_api_options(serve_spec, draft_dir=draft_dir)
    except SpecError as exc:
        raise PlanningError(_reason(exc), str(exc)) from exc
    plan_json = json.dumps(prepare.to_dict(), sort_keys=True, indent=2) + "\n"
    return EnginePlan(
        prepare.content_hash, plan_json, serve_spec, prepare=prepare, options_yaml=options,
        options_file=MODEL_YAML_NAME if triton else OPTIONS_FILE_NAME,
    )


def pytorch_capacity_status(plan: PytorchCapacityPlan) -> dict[str, int | float | None]:
    """``status.capacity`` of a ``pytorch`` BaseModel: the engine flow's keys plus maxLoras / maxCpuLoras."""
    lora = plan.lora
    return speculation_status(plan.speculation) | {
        "weightsBytes": plan.weights_bytes,
        "kvBytesPerToken": plan.kv_bytes_per_token,
        "memoryBandwidthBytesPerSecond": lookup_gpu(plan.gpu).memory_bandwidth_bytes_per_s,
        "kvCacheTokens": plan.kv_cache_tokens,
        "loraHostAdapters": lora.host.max_rank_adapters_fit if lora else None,
        "loraDeviceAdapters": lora.device.max_rank_adapters_fit if lora else None,
        "loraPageWidth": lora.page_width if lora else None,
        "loraSlotsPerPage": lora.slots_per_page if lora else None,
        "loraHostPages": lora.host.pages if lora else None,
        "loraDevicePages": lora.device.pages if lora else None,
        "maxLoras": lora.max_loras if lora else None,
        "maxCpuLoras": lora.max_cpu_loras if lora else None,
    }


def plan_capacity(spec: BaseModelSpec) -> CapacityVerdict:
    """Whether ``spec`` fits its GPUs, in the words of the capacity planner."""
    status: dict[str, Any]
    try:
        if spec.runtime is Runtime.PYTORCH:
            torch_plan = plan_pytorch_capacity(spec)
            problems, verdict = list(torch_plan.problems), torch_plan.verdict
            warnings = list(torch_plan.warnings)
            status = pytorch_capacity_status(torch_plan)
        else:
            plan = engines_plan_capacity(spec)
            problems, verdict = [str(p) for p in plan.problems], plan.verdict
            warnings = list(plan.warnings)
            status = plan.to_status()
    except SpecError as exc:
        return CapacityVerdict(False, _reason(exc), str(exc), None)
    if verdict == "error":
        return CapacityVerdict(False, DOES_NOT_FIT, "; ".join(problems) or "the spec does not fit", status)
    if problems or warnings:
        return CapacityVerdict(True, FITS_WITH_WARNINGS, "; ".join(problems + warnings), status)
    return CapacityVerdict(True, FITS, "the engine, KV cache and LoRA cache fit the GPU memory", status)
