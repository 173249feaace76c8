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
"""

from __future__ import annotations

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


def _reconcile_adapter(
    obj: Obj, observed: AdapterObserved, config: OperatorConfig, now: datetime, *, task_id: int | None = None
) -> Reconciliation:
    meta = obj["metadata"]
    name, namespace, uid = meta["name"], meta["namespace"], meta["uid"]
    generation = int(meta.get("generation") or 0)
    old = obj.get("status") or {}
    status: Obj = {"observedGeneration": generation, **{k: old[k] for k in CARRIED if k in old}}

    def c(type_: str, status_: str, reason: str, message: str) -> cond.Condition:
        return cond.make(type_, status_, reason, message, generation=generation)

    def failed(reason: str, message: str, *extra: cond.Condition, delete: tuple[ObjectRef, ...] = ()) -> Reconciliation:
        validated = (
            [] if any(x["type"] == cond.VALIDATED for x in extra) else [c(cond.VALIDATED, cond.FALSE, reason, message)]
        )
        return finish(
            obj,
            {
                **status,
                "phase": AdapterPhase.FAILED.value,
                "conditions": [*validated, *extra, c(cond.READY, cond.FALSE, reason, message)],
            },
            now,
            delete=delete,
        )

    try:
        spec = AdapterSpec.model_validate(obj["spec"])
    except ValidationError as exc:
        return failed(INVALID_SPEC, f"the spec is invalid for this operator version: {exc.errors()[0]['msg']}")
    status["servedName"] = spec.served_name or name
    base_obj = observed.basemodel
    if base_obj is None or base_obj["metadata"].get("deletionTimestamp"):
        gone = "is being deleted" if base_obj is not None else "does not exist"
        return failed(
            BASEMODEL_NOT_FOUND,
            f"BaseModel {spec.base_model} {gone} in namespace {namespace}: create "
            "it (this Adapter is re-checked every resync), or recreate the Adapter with another "
            "spec.baseModel (it is immutable)",
        )
    try:
        base = BaseModelSpec.model_validate(base_obj["spec"])
    except ValidationError:
        return failed(BASEMODEL_INVALID, f"BaseModel {spec.base_model} has a spec this operator cannot read")
    if effective_mode(spec.mode, chosen_mode(old)) is AdapterMode.MERGED:
        return reconcile_merged(obj, spec, base, observed, config, now, status)
    if not base.lora.enabled:
        return failed(
            LORA_NOT_ENABLED,
            f"BaseModel {spec.base_model} has lora.enabled false, so its engine has "
            "no LoRA plugin: enable LoRA on the BaseModel (a rebuild) or use mode: merged",
        )

    key = source_key(spec.source)
    dtype = base.dtype.value
    mapping = module_mapping(base)
    peft = stages_peft(base)
    uri = artifact_uri(config, key, dtype, mapping, peft=peft)
    pod_path = artifact_path(config, key, dtype, mapping) if peft else None
    job_name = convert_job_name(name, conversion_id(key, dtype, mapping, peft=peft))
    jobs = [job_snapshot(j) for j in observed.convert_jobs]
    live = [j for j in jobs if not j.deleting]
    current: JobSnapshot | None = next((j for j in live if j.name == job_name), None)
    deletes = [j.ref for j in live if j.name != job_name]
    applies: list[Obj] = []
    found = c(
        cond.VALIDATED,
        cond.TRUE,
        BASEMODEL_FOUND,
        f"BaseModel {spec.base_model} exists with LoRA enabled; rank and modules are checked after conversion",
    )
    def conversion_failed(reason: str, message: str) -> Reconciliation:
        """The convert step failed for ``reason``: Failed, with the Converted condition saying why."""
        return failed(reason, message, found, c(cond.CONVERTED, cond.FALSE, reason, message), delete=tuple(deletes))

    old_artifact = old.get("artifact") or {}
    summary: ArtifactSummary | None = None
    fresh = old.get("sourceKey") != key
    if not fresh and old_artifact.get("uri") == uri:
        summary = _summary_of({**old_artifact, "dtype": dtype})
    if summary is not None:
        if current is not None and current.finished:
            deletes.append(current.ref)
    elif current is None:
        owner = owner_reference("Adapter", API_VERSION, name, uid, controller=True)
        applies.append(
            build_convert_job(
                adapter=name,
                namespace=namespace,
                owner=owner,
                source=spec.source,
                source_key=key,
                basemodel=spec.base_model,
                base=base,
                config=config,
            )
        )
        message = f"started Job {job_name}: converting {spec.source.uri} to {dtype}"
        return _converting(
            obj, status, found, c(cond.CONVERTED, cond.FALSE, CONVERTING, message), now, applies, deletes
        )
    elif not current.finished:
        message = (
            f"Job {job_name} is converting {spec.source.uri} to {dtype} ({current.active} active, "
            f"{current.failed} failed pod(s))"
        )
        return _converting(
            obj, status, found, c(cond.CONVERTED, cond.FALSE, CONVERTING, message), now, applies, deletes
        )
    elif current.failed_final:
        why = failure_message(current, observed.convert_pods, CONVERT_CONTAINER)
        message = (
            f"Job {job_name} could not convert {spec.source.uri}: {why}. Fix the source (a new revision "
            f"converts again) or delete Job {job_name} to retry"
        )
        return conversion_failed(CONVERSION_FAILED, message)
    else:
        report = success_message(
            [
                p
                for p in observed.convert_pods
                if p["metadata"].get("labels", {}).get("batch.kubernetes.io/job-name") == job_name
            ],
            CONVERT_CONTAINER,
        )
        try:
            summary = parse_summary(report or "")
        except SummaryError as exc:
            message = (
                f"Job {job_name} succeeded without a readable summary in its termination message "
                f"({exc}); delete Job {job_name} to convert again"
            )
            return conversion_failed(CONVERSION_FAILED, message)
        if summary.dtype != dtype:
            message = (
                f"Job {job_name} converted to {summary.dtype}, but BaseModel {spec.base_model} is {dtype}: "
                f"the convert image ignores --dtype; delete Job {job_name} after fixing it"
            )
            return conversion_failed(DTYPE_MISMATCH, message)
        deletes.append(current.ref)
        status["sourceKey"] = key
        status["artifact"] = _artifact(summary, uri, pod_path)
        if fresh:
            status.pop("taskId", None)
    converted = c(
        cond.CONVERTED,
        cond.TRUE,
        CONVERTED,
        f"{uri}: rank {summary.rank}, modules {', '.join(summary.modules)}",
    )
    problem = check_artifact(summary, base, spec.base_model)
    if problem is not None:
        if fresh and "taskId" in status:
            status.pop("taskId")
        reason, message = problem
        return failed(reason, message, c(cond.VALIDATED, cond.FALSE, reason, message), converted, delete=tuple(deletes))
    valid = c(
        cond.VALIDATED,
        cond.TRUE,
        VALID,
        f"rank {summary.rank} <= lora.maxRank {base.lora.max_rank}, "
        f"modules within lora.targetModules of BaseModel {spec.base_model}",
    )
    if "taskId" not in status and task_id is not None:
        status["taskId"] = task_id
    if "taskId" not in status:
        waiting = c(cond.READY, cond.FALSE, ALLOCATING, f"allocating a task id on BaseModel {spec.base_model}")
        return finish(
            obj,
            {**status, "phase": AdapterPhase.CONVERTING.value, "conditions": [valid, converted, waiting]},
            now,
            apply=applies,
            delete=deletes,
            needs_task_id=True,
        )
    ready = c(
        cond.READY,
        cond.TRUE,
        READY,
        f"served as {status['servedName']} with task id {status['taskId']} on BaseModel {spec.base_model}",
    )
    return finish(
        obj,
        {**status, "phase": AdapterPhase.READY.value, "conditions": [valid, converted, ready]},
        now,
        apply=applies,
        delete=(*deletes, *merged_leftovers(name, namespace, observed.deployment)),
    )


def _converting(
    obj: Obj,
    status: Obj,
    found: cond.Condition,
    converted: cond.Condition,
    now: datetime,
    applies: list[Obj],
    deletes: list[ObjectRef],
) -> Reconciliation:
    waiting = {**converted, "type": cond.READY}
    return finish(
        obj,
        {**status, "phase": AdapterPhase.CONVERTING.value, "conditions": [found, converted, waiting]},
        now,
        apply=applies,
        delete=deletes,
    )
