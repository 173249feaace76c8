"""The engine-build state machine shared by BaseModels and merged Adapters (pure), and by ``runtime:
pytorch`` BaseModels for their prepare Job (:data:`CHECKPOINT_PREPARE`: same lifecycle, another Job and
other words; the hash is the ``prepare_hash`` and the "engine" the staged checkpoint).

Observed: the build Jobs of one engine hash (all attempts), its plan ConfigMap, its engine record, the
pods of the newest failed Job. Decided:

* record present -> built (nothing to run);
* a Job Complete -> built; write the record (its ``builtAt`` is the Job's completion time);
* no Job -> create the plan ConfigMap and Job attempt 1;
* the newest Job running -> building;
* the newest Job failed -> failed with the pod's termination message; once ``retry_delay_s(attempt)``
  has passed since it failed, attempt + 1 replaces it (a new Job ``...-<attempt>``; the failed one is
  deleted). After ``max_attempts`` it stays failed until the spec changes or someone deletes the Job.

Every user of the hash owns the Job and ConfigMap (non-controller owner references, kept in sync with
a resourceVersion-guarded patch). A user whose hash changed stops owning its old build; an old build
nobody wants any more is deleted, which is how a spec change supersedes a running build. The objects
themselves are built by :mod:`trtfleet_operator.builders.enginebuild` (and :mod:`.builders.pytorch`).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Literal

from trtfleet.api.basemodel import BaseModelSpec, QuantizationMode
from trtfleet_operator import conditions as cond
from trtfleet_operator.builders.enginebuild import (
    BUILD_CONTAINER,
    build_engine_job,
    build_engine_record,
    build_plan_configmap,
)
from trtfleet_operator.builders.pytorch import PREPARE_CONTAINER, build_prepare_job
from trtfleet_operator.config import OperatorConfig
from trtfleet_operator.names import ANNOTATION_ENGINE_HASH, build_job_name, hash16, prepare_job_name
from trtfleet_operator.planning import MODEL_CACHE_MOUNT, EnginePlan
from trtfleet_operator.reconcile.types import (
    Counter,
    JobSnapshot,
    Obj,
    ObjectRef,
    SetOwners,
    failure_message,
)

BUILT = "Built"
BUILDING = "Building"
BUILD_FAILED = "BuildFailed"
BUILD_RETRYING = "BuildRetrying"
PREPARED = "Prepared"
PREPARING = "Preparing"
PREPARE_FAILED = "PrepareFailed"
PREPARE_RETRYING = "PrepareRetrying"
MODELOPT_IMAGE_MISSING = "ModelOptImageMissing"


@dataclass(frozen=True)
class BuildKind:
    """One kind of hash-keyed Job: its builder, its container, where its output lives, and its words."""

    job_noun: str
    artifact_noun: str
    container: str
    built: str
    building: str
    failed: str
    retrying: str
    job_name: Callable[[str, int], str]
    job: Callable[[EngineInputs, OperatorConfig, int], Obj]
    uri: Callable[[EngineInputs, OperatorConfig], str]
    refusal: Callable[[EngineInputs, OperatorConfig], tuple[str, str] | None] = lambda _inputs, _config: None
    """(reason, message) when no Job of this kind can run with this configuration; None: it can."""


@dataclass(frozen=True)
class EngineInputs:
    namespace: str
    plan: EnginePlan
    spec: BaseModelSpec
    owners: tuple[Obj, ...]
    jobs: tuple[JobSnapshot, ...] = ()
    plan_configmap: Obj | None = None
    record: Obj | None = None
    failure_pods: tuple[Obj, ...] = ()
    labels: Mapping[str, str] = field(default_factory=dict)
    merged_sources: tuple[str, ...] = ()
    kind: BuildKind | None = None
    """None: the engine build (:data:`ENGINE_BUILD`)."""


@dataclass(frozen=True)
class EngineOutcome:
    state: Literal["built", "building", "failed"]
    condition: cond.Condition
    engine_status: Obj
    apply: tuple[Obj, ...] = ()
    set_owners: tuple[SetOwners, ...] = ()
    delete: tuple[ObjectRef, ...] = ()
    counters: tuple[Counter, ...] = ()
    requeue_after_s: float | None = None


def _owner_uids(owners: Sequence[Mapping[str, Any]]) -> set[str]:
    return {str(owner.get("uid")) for owner in owners}


def sync_owners(obj_ref: ObjectRef, current: Sequence[Obj], wanted: Sequence[Obj], rv: str) -> list[SetOwners]:
    return [] if _owner_uids(current) == _owner_uids(wanted) else [SetOwners(obj_ref, tuple(wanted), rv)]


def _parse(stamp: str | None) -> datetime | None:
    if not stamp:
        return None
    try:
        return datetime.fromisoformat(stamp.replace("Z", "+00:00"))
    except ValueError:
        return None


def rfc3339(moment: datetime) -> str:
    return moment.strftime("%Y-%m-%dT%H:%M:%SZ")


@dataclass(frozen=True)
class _Context:
    """What every step of :func:`reconcile_engine` reads: the inputs, the kind's words, the owners to sync."""

    inputs: EngineInputs
    kind: BuildKind
    config: OperatorConfig
    now: datetime
    engine_status: Obj
    """``hash``, ``image`` and ``uri``; each outcome adds ``builtAt`` or ``buildJob``."""
    set_owners: tuple[SetOwners, ...]

    @property
    def artifact(self) -> str:
        """The artifact with its short hash, as messages name it (``engine 0123abcd...``)."""
        return f"{self.kind.artifact_noun} {hash16(self.inputs.plan.engine_hash)}"

    def outcome(
        self,
        state: Literal["built", "building", "failed"],
        reason: str,
        message: str,
        *,
        status: Obj | None = None,
        apply: tuple[Obj, ...] = (),
        delete: tuple[ObjectRef, ...] = (),
        counters: tuple[Counter, ...] = (),
        requeue_after_s: float | None = None,
    ) -> EngineOutcome:
        """``state`` with EngineBuilt True (built) or False, saying ``reason`` and ``message``."""
        return EngineOutcome(
            state,
            cond.make(cond.ENGINE_BUILT, cond.TRUE if state == "built" else cond.FALSE, reason, message),
            {**self.engine_status, **(status or {})},
            apply=apply,
            set_owners=self.set_owners,
            delete=delete,
            counters=counters,
            requeue_after_s=requeue_after_s,
        )


def reconcile_engine(inputs: EngineInputs, config: OperatorConfig, now: datetime) -> EngineOutcome:
    """The decision of the module docstring, one step per state of the hash's newest Job."""
    kind = inputs.kind or ENGINE_BUILD
    jobs = sorted((j for j in inputs.jobs if not j.deleting), key=lambda j: (j.attempt, j.name))
    engine_hash = inputs.plan.engine_hash
    engine_status: Obj = {"hash": engine_hash, "image": inputs.spec.engine.image, "uri": kind.uri(inputs, config)}
    ctx = _Context(inputs, kind, config, now, engine_status, _owner_updates(inputs, jobs))
    if inputs.record is not None:
        data = inputs.record.get("data") or {}
        message = f"{ctx.artifact} is in the {kind.artifact_noun} store (published {data.get('builtAt', 'earlier')})"
        return ctx.outcome("built", kind.built, message, status={"builtAt": data.get("builtAt", "")})
    complete = [j for j in jobs if j.complete]
    if complete:
        return _recorded(ctx, complete[-1])
    latest = jobs[-1] if jobs else None
    older = tuple(j.ref for j in jobs[:-1] if j.finished)
    refusal = kind.refusal(inputs, config)
    if refusal is not None and (latest is None or latest.finished):
        return ctx.outcome("failed", *refusal, delete=older)
    if latest is None:
        first = kind.job_name(engine_hash, 1)
        return _start(ctx, 1, older, f"started {kind.job_noun} Job {first} for {ctx.artifact}")
    if not latest.finished:
        return _running(ctx, latest, older)
    return _failed(ctx, latest, older)


def _owner_updates(inputs: EngineInputs, jobs: Sequence[JobSnapshot]) -> tuple[SetOwners, ...]:
    """Owner hand-overs that make every user of the hash own its Jobs and plan ConfigMap."""
    updates: list[SetOwners] = []
    for job in jobs:
        updates += sync_owners(job.ref, job.owners, inputs.owners, job.resource_version)
    plan_cm = inputs.plan_configmap
    if plan_cm is not None and not plan_cm["metadata"].get("deletionTimestamp"):
        meta = plan_cm["metadata"]
        ref = ObjectRef("v1", "ConfigMap", inputs.namespace, meta["name"], meta.get("uid"))
        updates += sync_owners(ref, meta.get("ownerReferences") or [], inputs.owners, meta.get("resourceVersion", ""))
    return tuple(updates)


def _recorded(ctx: _Context, job: JobSnapshot) -> EngineOutcome:
    """A Job completed: built, and the record that says so written (``builtAt``: the Job's completion)."""
    inputs = ctx.inputs
    built_at = job.finished_at or rfc3339(ctx.now)
    record = build_engine_record(
        inputs.plan.engine_hash,
        namespace=inputs.namespace,
        uri=ctx.engine_status["uri"],
        image=inputs.spec.engine.image,
        built_at=built_at,
        build_job=job.name,
    )
    message = f"{ctx.kind.job_noun} Job {job.name} published {ctx.artifact}"
    return ctx.outcome(
        "built", ctx.kind.built, message, status={"builtAt": built_at}, apply=(record,), counters=("build_succeeded",)
    )


def _running(ctx: _Context, job: JobSnapshot, older: tuple[ObjectRef, ...]) -> EngineOutcome:
    """The newest Job runs: building (its plan ConfigMap applied again if it went missing)."""
    applies: tuple[Obj, ...] = () if ctx.inputs.plan_configmap is not None else (_plan_cm(ctx.inputs),)
    message = (
        f"{ctx.kind.job_noun} Job {job.name} is running (attempt {job.attempt} of {ctx.config.build.max_attempts}): "
        f"{job.active} active pod(s), {job.failed} failed pod(s)"
    )
    return ctx.outcome(
        "building", ctx.kind.building, message, status={"buildJob": job.name}, apply=applies, delete=older
    )


def _failed(ctx: _Context, job: JobSnapshot, older: tuple[ObjectRef, ...]) -> EngineOutcome:
    """The newest Job failed: no retries left, the next attempt now, or a requeue when its delay has passed."""
    kind, policy = ctx.kind, ctx.config.build
    why = failure_message(job, ctx.inputs.failure_pods, kind.container)
    attempts = f"attempt {job.attempt} of {policy.max_attempts}"
    if job.attempt >= policy.max_attempts:
        message = (
            f"{kind.job_noun} Job {job.name} failed ({attempts}, no retries left): {why}. Fix the cause (see "
            f"`kubectl logs job/{job.name}`), then delete Job {job.name} to {kind.job_noun} again"
        )
        return ctx.outcome("failed", kind.failed, message, status={"buildJob": job.name}, delete=older)
    failed_at = _parse(job.finished_at)
    delay = policy.retry_delay_s(job.attempt)
    wait_s = 0.0 if failed_at is None else (failed_at - ctx.now).total_seconds() + delay
    if wait_s <= 0:
        message = (
            f"retrying the {kind.job_noun} of {ctx.artifact} (attempt {job.attempt + 1} of "
            f"{policy.max_attempts}) after Job {job.name} failed: {why}"
        )
        return _start(ctx, job.attempt + 1, (*older, job.ref), message)
    message = (
        f"{kind.job_noun} Job {job.name} failed ({attempts}): {why}. "
        f"Retrying in {int(wait_s + 0.999)}s; delete Job {job.name} to retry now"
    )
    return ctx.outcome(
        "failed", kind.retrying, message, status={"buildJob": job.name}, delete=older, requeue_after_s=wait_s
    )


def _plan_cm(inputs: EngineInputs) -> Obj:
    return build_plan_configmap(
        inputs.plan.engine_hash,
        inputs.plan.plan_json,
        namespace=inputs.namespace,
        owners=inputs.owners,
        labels=inputs.labels,
    )


def _start(ctx: _Context, attempt: int, delete: tuple[ObjectRef, ...], message: str) -> EngineOutcome:
    """Building: Job ``attempt`` created (with the plan ConfigMap, unless it exists)."""
    inputs = ctx.inputs
    job = ctx.kind.job(inputs, ctx.config, attempt)
    applies = (job,) if inputs.plan_configmap is not None else (_plan_cm(inputs), job)
    return ctx.outcome(
        "building",
        ctx.kind.building,
        message,
        status={"buildJob": job["metadata"]["name"]},
        apply=applies,
        delete=delete,
        counters=("build_started",),
    )


def _engine_job(inputs: EngineInputs, config: OperatorConfig, attempt: int) -> Obj:
    return build_engine_job(
        inputs.spec,
        engine_hash=inputs.plan.engine_hash,
        namespace=inputs.namespace,
        owners=inputs.owners,
        attempt=attempt,
        config=config,
        labels=inputs.labels,
        merged_sources=inputs.merged_sources,
    )


def _prepare_job(inputs: EngineInputs, config: OperatorConfig, attempt: int) -> Obj:
    return build_prepare_job(
        inputs.spec, inputs.plan, namespace=inputs.namespace, owners=inputs.owners, attempt=attempt, config=config,
        labels=inputs.labels, merged_sources=inputs.merged_sources,
    )


def _modelopt_refusal(inputs: EngineInputs, config: OperatorConfig) -> tuple[str, str] | None:
    """A quantizing prepare needs ModelOpt's ``examples/llm_ptq``, which no stock TensorRT-LLM image carries."""
    spec = inputs.spec
    if spec.quantization.mode is QuantizationMode.NONE or config.images.modelopt is not None:
        return None
    return MODELOPT_IMAGE_MISSING, (
        f"quantization.mode {spec.quantization.mode.value} on runtime pytorch runs NVIDIA ModelOpt's "
        "examples/llm_ptq/hf_ptq.py, which no stock TensorRT-LLM image carries and the operator has no image "
        f"for: build images/modelopt.Dockerfile with --build-arg TRTLLM_IMAGE={spec.engine.image}, push it and "
        "set the chart's operator.images.modelopt (TRTFLEET_MODELOPT_IMAGE) to it, or serve this BaseModel "
        "with quantization.mode none"
    )


def _checkpoint_uri(inputs: EngineInputs, config: OperatorConfig) -> str:
    """``pvc://<engine PVC>/checkpoints/<hash>/<original|merged|quantized>``: what trtllm-serve loads."""
    prepare = inputs.plan.prepare
    if prepare is None:
        return config.storage.engine_uri(inputs.plan.engine_hash)
    relative = prepare.serve_checkpoint_dir.removeprefix(MODEL_CACHE_MOUNT).lstrip("/")
    return f"pvc://{config.storage.engine_pvc}/{relative}"


ENGINE_BUILD = BuildKind(
    job_noun="build",
    artifact_noun="engine",
    container=BUILD_CONTAINER,
    built=BUILT,
    building=BUILDING,
    failed=BUILD_FAILED,
    retrying=BUILD_RETRYING,
    job_name=build_job_name,
    job=_engine_job,
    uri=lambda inputs, config: config.storage.engine_uri(inputs.plan.engine_hash),
)
CHECKPOINT_PREPARE = BuildKind(
    job_noun="prepare",
    artifact_noun="checkpoint",
    container=PREPARE_CONTAINER,
    built=PREPARED,
    building=PREPARING,
    failed=PREPARE_FAILED,
    retrying=PREPARE_RETRYING,
    job_name=prepare_job_name,
    job=_prepare_job,
    uri=_checkpoint_uri,
    refusal=_modelopt_refusal,
)


def release_stale(
    owner_uid: str,
    desired_hash: str | None,
    jobs: Sequence[JobSnapshot],
    plan_configmaps: Sequence[Obj],
    users_by_hash: Mapping[str, Sequence[Obj]],
) -> tuple[list[ObjectRef], list[SetOwners]]:
    """Builds ``owner_uid`` owns for another hash than ``desired_hash``: delete those nobody else wants,
    hand the others over to their remaining users."""
    deletes: list[ObjectRef] = []
    handovers: list[SetOwners] = []

    def visit(ref: ObjectRef, engine_hash: str | None, owners: Sequence[Obj], rv: str) -> None:
        if engine_hash is None or engine_hash == desired_hash or owner_uid not in _owner_uids(owners):
            return
        remaining = [u for u in users_by_hash.get(engine_hash, ()) if u.get("uid") != owner_uid]
        if remaining:
            handovers.extend(sync_owners(ref, owners, remaining, rv))
        else:
            deletes.append(ref)

    for job in jobs:
        if not job.deleting:
            visit(job.ref, job.engine_hash, job.owners, job.resource_version)
    for cm in plan_configmaps:
        meta = cm["metadata"]
        if meta.get("deletionTimestamp"):
            continue
        ref = ObjectRef("v1", "ConfigMap", meta.get("namespace", ""), meta["name"], meta.get("uid"))
        visit(
            ref,
            (meta.get("annotations") or {}).get(ANNOTATION_ENGINE_HASH),
            meta.get("ownerReferences") or [],
            meta.get("resourceVersion", ""),
        )
    return deletes, handovers
