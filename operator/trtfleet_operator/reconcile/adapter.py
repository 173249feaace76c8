"""Adapter reconciler (pure): spec + its BaseModel + its convert Job -> Job, status, task-id request.

``mode: dynamic`` (the default):

1. **Validated**: the BaseModel must exist (else ``BaseModelNotFound``; nothing is created, the timer
   re-checks so the Adapter heals when the BaseModel appears) and have LoRA enabled (``LoraNotEnabled``).
2. **Converted**: one convert Job per (source, dtype); its termination message carries the manifest
   summary. The result lands in ``status.sourceKey`` + ``status.artifact`` and the Job is deleted. On a
   ``runtime: pytorch`` BaseModel the Job validates the same way and stages the PEFT directory itself;
   ``status.artifact.path`` is where every serving pod reads it (the router's ``lora_path``), and the
   task id becomes ``lora_int_id``.
3. Rank and modules from the artifact are checked against ``lora.maxRank`` / ``lora.targetModules``
   (``RankTooHigh``, ``ModulesNotTargeted``, ``DtypeMismatch``); an invalid adapter gets no task id and
   leaves no Job behind.
4. **Ready** once a task id is allocated. The reconciler does not allocate: it answers
   ``needs_task_id`` and the shell runs it again with the id it got from the BaseModel's counter, so the
   id, the source key and the artifact are written in one status patch. A new source (uri or revision)
   converts again and gets a new id; until then the status keeps describing the previous source.

``mode: merged`` is delegated to :mod:`trtfleet_operator.reconcile.merged`; ``mode: auto`` is served as
``status.merge.mode`` says (the merge timer's choice, :mod:`trtfleet_operator.reconcile.merging`), dynamic
until then. A QLoRA adapter (``training.baseQuantization``) is a dynamic one whose result also carries its
base variant's objects, the ``BaseVariantReady`` condition and ``status.baseVariant``
(:mod:`trtfleet_operator.reconcile.variant`).

The dynamic path is a driver over one function per step (``_basemodel_step``, ``_convert_step``,
``_ready_step``), as :mod:`.basemodel`'s is.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime

from pydantic import ValidationError

from trtfleet.api import API_VERSION, AdapterMode, AdapterPhase, AdapterSpec, BaseModelSpec, chosen_mode, effective_mode
from trtfleet_operator import conditions as cond
from trtfleet_operator.artifacts import ArtifactSummary, SummaryError, parse_summary
from trtfleet_operator.builders.convert import (
    CONVERT_CONTAINER,
    artifact_path,
    artifact_uri,
    build_convert_job,
    conversion_id,
    module_mapping,
    stages_peft,
)
from trtfleet_operator.config import OperatorConfig
from trtfleet_operator.names import convert_job_name, owner_reference
from trtfleet_operator.reconcile.common import finish
from trtfleet_operator.reconcile.merged import merged_leftovers, reconcile_merged
from trtfleet_operator.reconcile.types import (
    AdapterObserved,
    JobSnapshot,
    Obj,
    ObjectRef,
    Reconciliation,
    failure_message,
    job_snapshot,
    success_message,
)
from trtfleet_operator.reconcile.variant import reconcile_variant, with_variant
from trtfleet_operator.taskids import source_key

BASEMODEL_NOT_FOUND = "BaseModelNotFound"
BASEMODEL_INVALID = "BaseModelInvalid"
LORA_NOT_ENABLED = "LoraNotEnabled"
RANK_TOO_HIGH = "RankTooHigh"
MODULES_NOT_TARGETED = "ModulesNotTargeted"
DTYPE_MISMATCH = "DtypeMismatch"
CONVERTING = "Converting"
CONVERTED = "Converted"
CONVERSION_FAILED = "ConversionFailed"
ALLOCATING = "AllocatingTaskId"
VALID = "Valid"
BASEMODEL_FOUND = "BaseModelFound"
READY = "Ready"
INVALID_SPEC = "InvalidSpec"

CARRIED = ("taskId", "sourceKey", "artifact")
"""Status fields that survive a reconcile unless it replaces them."""


def check_artifact(summary: ArtifactSummary, base: BaseModelSpec, base_name: str) -> tuple[str, str] | None:
    """``(reason, message)`` if the converted adapter cannot run on ``base``'s engine, else None."""
    lora = base.lora
    if summary.rank > lora.max_rank:
        return RANK_TOO_HIGH, (
            f"the adapter's rank {summary.rank} exceeds BaseModel {base_name} lora.maxRank {lora.max_rank}: "
            f"retrain it with r <= {lora.max_rank}, or raise lora.maxRank (that rebuilds the engine)"
        )
    targets = {m.value for m in lora.target_modules}
    extra = sorted(set(summary.modules) - targets)
    if extra:
        return MODULES_NOT_TARGETED, (
            f"the adapter targets {', '.join(extra)}, which BaseModel {base_name}'s engine was not built to "
            f"adapt (lora.targetModules: {', '.join(sorted(targets))}): add them to lora.targetModules "
            "(a rebuild) or retrain the adapter without them"
        )
    return None


def _artifact(summary: ArtifactSummary, uri: str, pod_path: str | None) -> Obj:
    artifact: Obj = {
        "uri": uri,
        "sha256": summary.sha256,
        "bytes": summary.weights_bytes,
        "rank": summary.rank,
        "modules": list(summary.modules),
    }
    if pod_path is not None:
        artifact["path"] = pod_path
    return artifact


def _summary_of(artifact: Obj) -> ArtifactSummary | None:
    try:
        return ArtifactSummary(
            int(artifact["rank"]),
            tuple(artifact["modules"]),
            str(artifact.get("sha256", "")),
            int(artifact.get("bytes", 0)),
            str(artifact.get("dtype", "")),
        )
    except (KeyError, TypeError, ValueError):
        return None


def reconcile_adapter(
    obj: Obj, observed: AdapterObserved, config: OperatorConfig, now: datetime, *, task_id: int | None = None
) -> Reconciliation:
    result = _reconcile_adapter(obj, observed, config, now, task_id=task_id)
    try:
        spec = AdapterSpec.model_validate(obj["spec"])
        base_obj = observed.basemodel
        base = BaseModelSpec.model_validate(base_obj["spec"]) if base_obj is not None else None
    except ValidationError:
        return result  # said by the dynamic reconcile
    quantization = spec.base_quantization
    deleting = base_obj is None or bool(base_obj["metadata"].get("deletionTimestamp"))
    if quantization is None or base is None or deleting or not base.lora.enabled:
        return result
    return with_variant(obj, result, reconcile_variant(obj, spec, quantization, base, observed, config, now), now)


@dataclass(frozen=True)
class _Context:
    """What every step of one Adapter reconcile reads."""

    obj: Obj
    name: str
    namespace: str
    generation: int
    old: Obj
    """The status as read."""
    now: datetime

    def condition(self, type_: str, status_: str, reason: str, message: str) -> cond.Condition:
        return cond.make(type_, status_, reason, message, generation=self.generation)

    def failed(
        self, status: Obj, reason: str, message: str, *extra: cond.Condition, delete: Sequence[ObjectRef] = ()
    ) -> Reconciliation:
        """Phase Failed for ``reason``: Validated False (unless ``extra`` carries Validated), ``extra``, Ready
        False."""
        said = any(x["type"] == cond.VALIDATED for x in extra)
        validated = [] if said else [self.condition(cond.VALIDATED, cond.FALSE, reason, message)]
        conditions = [*validated, *extra, self.condition(cond.READY, cond.FALSE, reason, message)]
        return finish(
            self.obj, {**status, "phase": AdapterPhase.FAILED.value, "conditions": conditions}, self.now, delete=delete
        )


@dataclass(frozen=True)
class _Conversion:
    """One conversion of the source for the BaseModel: the key of its artifact and the name of its Job."""

    key: str
    dtype: str
    uri: str
    pod_path: str | None
    """Where serving pods read a staged PEFT directory (``runtime: pytorch``); None otherwise."""
    job_name: str

    @classmethod
    def of(cls, spec: AdapterSpec, base: BaseModelSpec, config: OperatorConfig, adapter: str) -> _Conversion:
        key = source_key(spec.source)
        dtype = base.dtype.value
        mapping = module_mapping(base)
        peft = stages_peft(base)
        return cls(
            key=key,
            dtype=dtype,
            uri=artifact_uri(config, key, dtype, mapping, peft=peft),
            pod_path=artifact_path(config, key, dtype, mapping) if peft else None,
            job_name=convert_job_name(adapter, conversion_id(key, dtype, mapping, peft=peft)),
        )


@dataclass(frozen=True)
class _Converted:
    summary: ArtifactSummary
    deletes: tuple[ObjectRef, ...]
    """Convert Jobs done with: other conversions' and this one's once finished."""
    new: bool
    """The summary comes from the Job's report (to be written to the status), not from the status."""


def _reconcile_adapter(
    obj: Obj, observed: AdapterObserved, config: OperatorConfig, now: datetime, *, task_id: int | None = None
) -> Reconciliation:
    """The steps of the module docstring, each gating the next: validated, converted, checked, ready."""
    meta = obj["metadata"]
    old = obj.get("status") or {}
    ctx = _Context(obj, meta["name"], meta["namespace"], int(meta.get("generation") or 0), old, now)
    status: Obj = {"observedGeneration": ctx.generation, **{k: old[k] for k in CARRIED if k in old}}
    try:
        spec = AdapterSpec.model_validate(obj["spec"])
    except ValidationError as exc:
        message = f"the spec is invalid for this operator version: {exc.errors()[0]['msg']}"
        return ctx.failed(status, INVALID_SPEC, message)
    status["servedName"] = spec.served_name or ctx.name
    base = _basemodel_step(ctx, status, spec, observed.basemodel)
    if isinstance(base, Reconciliation):
        return base
    if effective_mode(spec.mode, chosen_mode(old)) is AdapterMode.MERGED:
        return reconcile_merged(obj, spec, base, observed, config, now, status)
    if not base.lora.enabled:
        return ctx.failed(
            status,
            LORA_NOT_ENABLED,
            f"BaseModel {spec.base_model} has lora.enabled false, so its engine has "
            "no LoRA plugin: enable LoRA on the BaseModel (a rebuild) or use mode: merged",
        )
    conversion = _Conversion.of(spec, base, config, ctx.name)
    converted = _convert_step(ctx, status, spec, base, conversion, observed, config)
    if isinstance(converted, Reconciliation):
        return converted
    summary = converted.summary
    if converted.new:
        status["sourceKey"] = conversion.key
        status["artifact"] = _artifact(summary, conversion.uri, conversion.pod_path)
        if old.get("sourceKey") != conversion.key:
            status.pop("taskId", None)  # a new source gets a new id
    converted_condition = ctx.condition(
        cond.CONVERTED,
        cond.TRUE,
        CONVERTED,
        f"{conversion.uri}: rank {summary.rank}, modules {', '.join(summary.modules)}",
    )
    problem = check_artifact(summary, base, spec.base_model)
    if problem is not None:
        reason, message = problem
        validated = ctx.condition(cond.VALIDATED, cond.FALSE, reason, message)
        return ctx.failed(status, reason, message, validated, converted_condition, delete=converted.deletes)
    return _ready_step(ctx, status, spec, base, converted, converted_condition, observed, task_id)


def _basemodel_step(
    ctx: _Context, status: Obj, spec: AdapterSpec, base_obj: Obj | None
) -> BaseModelSpec | Reconciliation:
    """The BaseModel's spec, or Failed: the BaseModel is missing, being deleted or unreadable."""
    if base_obj is None or base_obj["metadata"].get("deletionTimestamp"):
        gone = "is being deleted" if base_obj is not None else "does not exist"
        return ctx.failed(
            status,
            BASEMODEL_NOT_FOUND,
            f"BaseModel {spec.base_model} {gone} in namespace {ctx.namespace}: create "
            "it (this Adapter is re-checked every resync), or recreate the Adapter with another "
            "spec.baseModel (it is immutable)",
        )
    try:
        return BaseModelSpec.model_validate(base_obj["spec"])
    except ValidationError:
        message = f"BaseModel {spec.base_model} has a spec this operator cannot read"
        return ctx.failed(status, BASEMODEL_INVALID, message)


def _convert_step(
    ctx: _Context,
    status: Obj,
    spec: AdapterSpec,
    base: BaseModelSpec,
    conversion: _Conversion,
    observed: AdapterObserved,
    config: OperatorConfig,
) -> _Converted | Reconciliation:
    """Converted: the artifact the status already describes for this conversion, or the convert Job's report
    once it succeeded; until then the Reconciliation that starts the Job, waits for it, or says it failed."""
    live = [j for j in (job_snapshot(j) for j in observed.convert_jobs) if not j.deleting]
    current: JobSnapshot | None = next((j for j in live if j.name == conversion.job_name), None)
    deletes = [j.ref for j in live if j.name != conversion.job_name]
    found = ctx.condition(
        cond.VALIDATED,
        cond.TRUE,
        BASEMODEL_FOUND,
        f"BaseModel {spec.base_model} exists with LoRA enabled; rank and modules are checked after conversion",
    )
    kept = _kept_summary(ctx.old, conversion)
    if kept is not None:
        done = (current.ref,) if current is not None and current.finished else ()
        return _Converted(kept, (*deletes, *done), new=False)
    job_name, source = conversion.job_name, spec.source.uri
    if current is None:
        owner = owner_reference("Adapter", API_VERSION, ctx.name, str(ctx.obj["metadata"]["uid"]), controller=True)
        job = build_convert_job(
            adapter=ctx.name,
            namespace=ctx.namespace,
            owner=owner,
            source=spec.source,
            source_key=conversion.key,
            basemodel=spec.base_model,
            base=base,
            config=config,
        )
        message = f"started Job {job_name}: converting {source} to {conversion.dtype}"
        return _converting(ctx, status, found, message, (job,), deletes)
    if not current.finished:
        message = (
            f"Job {job_name} is converting {source} to {conversion.dtype} ({current.active} active, "
            f"{current.failed} failed pod(s))"
        )
        return _converting(ctx, status, found, message, (), deletes)
    report = _report(ctx, spec, conversion, current, observed.convert_pods)
    if isinstance(report, ArtifactSummary):
        return _Converted(report, (*deletes, current.ref), new=True)
    reason, message = report
    failed = ctx.condition(cond.CONVERTED, cond.FALSE, reason, message)
    return ctx.failed(status, reason, message, found, failed, delete=deletes)


def _kept_summary(old: Obj, conversion: _Conversion) -> ArtifactSummary | None:
    """The summary of the artifact the status already describes, if it is this conversion's."""
    artifact = old.get("artifact") or {}
    if old.get("sourceKey") != conversion.key or artifact.get("uri") != conversion.uri:
        return None
    return _summary_of({**artifact, "dtype": conversion.dtype})


def _report(
    ctx: _Context, spec: AdapterSpec, conversion: _Conversion, job: JobSnapshot, pods: Sequence[Obj]
) -> ArtifactSummary | tuple[str, str]:
    """What a finished convert Job says: the artifact's summary, or ``(reason, message)`` of its failure."""
    name = job.name
    if job.failed_final:
        why = failure_message(job, pods, CONVERT_CONTAINER)
        return CONVERSION_FAILED, (
            f"Job {name} could not convert {spec.source.uri}: {why}. Fix the source (a new revision "
            f"converts again) or delete Job {name} to retry"
        )
    mine = [p for p in pods if p["metadata"].get("labels", {}).get("batch.kubernetes.io/job-name") == name]
    try:
        summary = parse_summary(success_message(mine, CONVERT_CONTAINER) or "")
    except SummaryError as exc:
        return CONVERSION_FAILED, (
            f"Job {name} succeeded without a readable summary in its termination message "
            f"({exc}); delete Job {name} to convert again"
        )
    if summary.dtype != conversion.dtype:
        return DTYPE_MISMATCH, (
            f"Job {name} converted to {summary.dtype}, but BaseModel {spec.base_model} is {conversion.dtype}: "
            f"the convert image ignores --dtype; delete Job {name} after fixing it"
        )
    return summary


def _converting(
    ctx: _Context,
    status: Obj,
    found: cond.Condition,
    message: str,
    apply: tuple[Obj, ...],
    deletes: Sequence[ObjectRef],
) -> Reconciliation:
    """Phase Converting while the convert Job runs: Converted and Ready False with ``message``."""
    converted = ctx.condition(cond.CONVERTED, cond.FALSE, CONVERTING, message)
    waiting = {**converted, "type": cond.READY}
    return finish(
        ctx.obj,
        {**status, "phase": AdapterPhase.CONVERTING.value, "conditions": [found, converted, waiting]},
        ctx.now,
        apply=apply,
        delete=deletes,
    )


def _ready_step(
    ctx: _Context,
    status: Obj,
    spec: AdapterSpec,
    base: BaseModelSpec,
    converted: _Converted,
    converted_condition: cond.Condition,
    observed: AdapterObserved,
    task_id: int | None,
) -> Reconciliation:
    """Ready once the adapter has a task id (kept, or ``task_id`` from the shell); else ask the shell for one."""
    summary = converted.summary
    valid = ctx.condition(
        cond.VALIDATED,
        cond.TRUE,
        VALID,
        f"rank {summary.rank} <= lora.maxRank {base.lora.max_rank}, "
        f"modules within lora.targetModules of BaseModel {spec.base_model}",
    )
    if "taskId" not in status and task_id is not None:
        status["taskId"] = task_id
    if "taskId" not in status:
        message = f"allocating a task id on BaseModel {spec.base_model}"
        waiting = ctx.condition(cond.READY, cond.FALSE, ALLOCATING, message)
        return finish(
            ctx.obj,
            {**status, "phase": AdapterPhase.CONVERTING.value, "conditions": [valid, converted_condition, waiting]},
            ctx.now,
            delete=converted.deletes,
            needs_task_id=True,
        )
    ready = ctx.condition(
        cond.READY,
        cond.TRUE,
        READY,
        f"served as {status['servedName']} with task id {status['taskId']} on BaseModel {spec.base_model}",
    )
    return finish(
        ctx.obj,
        {**status, "phase": AdapterPhase.READY.value, "conditions": [valid, converted_condition, ready]},
        ctx.now,
        delete=(*converted.deletes, *merged_leftovers(ctx.name, ctx.namespace, observed.deployment)),
    )
