"""``mode: merged`` Adapters (pure): an engine of their own with the adapter merged into the base weights.

The plan comes from :func:`trtfleet_engines.plan.plan_merged_engine_build` (its hash covers the base
engine identity plus the adapter's uri and revision); the build runs through the same state machine as
BaseModels (one Job per hash, shared by every merged Adapter with that hash), and the result is served by
a Deployment, headless Service and PDB of the Adapter's own, named ``<adapter>-merged`` and labelled
``trtfleet.io/basemodel=<base>, trtfleet.io/adapter=<adapter>, trtfleet.io/role=merged``: the router sends
this adapter's served name there instead of to the base fleet. No task id (TRT-LLM sees a plain model).

``runtime: reference`` has nothing to build (as for its BaseModels): the worker merges the adapter into
the float32 base when it starts (``trtfleet worker --merged-adapter``, the same ``--dtype base`` merge the
plan records) and serves it under the Adapter's served name, with LoRA off.

Phases: Converting while the engine builds, Failed when it cannot be planned, does not fit or the build
failed, Pending while the pods roll out, Ready when the rollout is complete.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime

from pydantic import ValidationError

from trtfleet.api import (
    API_VERSION,
    AdapterMode,
    AdapterPhase,
    AdapterSpec,
    BaseModelSpec,
    Runtime,
    chosen_mode,
    effective_mode,
)
from trtfleet_operator import conditions as cond
from trtfleet_operator.builders.pytorch import build_options_configmap, build_pytorch_deployment
from trtfleet_operator.builders.service import build_pdb, build_service
from trtfleet_operator.builders.serving import (
    build_deployment,
    build_model_repo_configmap,
    file_path,
    reference_merged_args,
    reference_model_dir,
)
from trtfleet_operator.config import OperatorConfig
from trtfleet_operator.errors import PlanningError
from trtfleet_operator.names import (
    LABEL_ADAPTER,
    LABEL_BASEMODEL,
    label_value,
    merged_serving_name,
    model_repo_configmap_name,
    options_configmap_name,
    owner_reference,
)
from trtfleet_operator.planning import CapacityVerdict, EnginePlan, plan_capacity, plan_merged
from trtfleet_operator.reconcile.common import NOT_NEEDED, engine_inputs, finish, hash_owners, shared_owner
from trtfleet_operator.reconcile.engine import CHECKPOINT_PREPARE, EngineOutcome, reconcile_engine, release_stale
from trtfleet_operator.reconcile.serving import serving_state
from trtfleet_operator.reconcile.types import (
    AdapterObserved,
    JobSnapshot,
    Obj,
    ObjectRef,
    Reconciliation,
    job_snapshot,
)


def merged_hash(adapter: Obj, basemodels: Sequence[Obj]) -> str | None:
    """The engine hash a merged Adapter wants, or None."""
    meta = adapter.get("metadata") or {}
    if meta.get("deletionTimestamp"):
        return None
    try:
        spec = AdapterSpec.model_validate(adapter.get("spec"))
        if effective_mode(spec.mode, chosen_mode(adapter.get("status"))) is not AdapterMode.MERGED:
            return None
        base_obj = next((b for b in basemodels if b["metadata"]["name"] == spec.base_model), None)
        if base_obj is None:
            return None
        base = BaseModelSpec.model_validate(base_obj.get("spec"))
        if base.runtime is Runtime.REFERENCE:
            return None  # nothing to build: no Job for this adapter to own
        return plan_merged(base, spec.source.uri, spec.source.revision).engine_hash
    except (ValidationError, PlanningError):
        return None


def merged_users(adapters: Sequence[Obj], basemodels: Sequence[Obj]) -> dict[str, tuple[Obj, ...]]:
    users: dict[str, list[Obj]] = {}
    for adapter in sorted(adapters, key=lambda a: str(a["metadata"]["name"])):
        wanted = merged_hash(adapter, basemodels)
        if wanted is not None:
            users.setdefault(wanted, []).append(shared_owner(adapter))
    return {key: tuple(value) for key, value in users.items()}


def merged_leftovers(name: str, namespace: str, deployment: Obj | None) -> tuple[ObjectRef, ...]:
    """What a switch from merged back to dynamic leaves: the merged pods' Deployment, Service, PDB and
    configuration (deleted once the adapter is served hot-swapped again); nothing without a Deployment."""
    if deployment is None:
        return ()
    serving = merged_serving_name(name)
    return (
        ObjectRef.of(deployment),
        ObjectRef("v1", "Service", namespace, serving),
        ObjectRef("policy/v1", "PodDisruptionBudget", namespace, serving),
        ObjectRef("v1", "ConfigMap", namespace, model_repo_configmap_name(serving)),
        ObjectRef("v1", "ConfigMap", namespace, options_configmap_name(serving)),
    )


def _reference_engine(base: BaseModelSpec, spec: AdapterSpec, config: OperatorConfig) -> EngineOutcome:
    message = (f"runtime reference merges {file_path(spec.source.uri)} into {reference_model_dir(base)} when the "
               f"worker starts ({config.images.worker}); nothing to build")
    return EngineOutcome("built", cond.make(cond.ENGINE_BUILT, cond.TRUE, NOT_NEEDED, message), {})


def _serving(
    plan: EnginePlan,
    base: BaseModelSpec,
    spec: AdapterSpec,
    *,
    name: str,
    namespace: str,
    owner: Obj,
    labels: dict[str, str],
    config: OperatorConfig,
) -> tuple[Obj, Obj]:
    """The merged pods' configuration (Triton model configs, the worker's spec or the LLM-API options) and
    Deployment, served under the Adapter's served name."""
    serving = merged_serving_name(name)
    served_name = spec.served_name or name
    if base.runtime is Runtime.PYTORCH:
        options = build_options_configmap(plan, name=serving, namespace=namespace, owner=owner)
        return options, build_pytorch_deployment(
            plan.render_spec, plan, name=serving, namespace=namespace, owner=owner, basemodel=spec.base_model,
            options=options, config=config, adapter=name, served_name=served_name,
        )
    reference = base.runtime is Runtime.REFERENCE
    model_repo = build_model_repo_configmap(
        plan.render_spec, name=serving, namespace=namespace, owner=owner, engine_hash=plan.engine_hash,
        config=config, labels=labels,
    )
    return model_repo, build_deployment(
        plan.render_spec, name=serving, namespace=namespace, owner=owner, basemodel=spec.base_model,
        engine_hash=plan.engine_hash, model_repo=model_repo, config=config, adapter=name,
        worker_args=tuple(reference_merged_args(spec.source.uri, served_name)) if reference else (),
    )


@dataclass(frozen=True)
class _Context:
    """What every step of one merged Adapter reconcile reads."""

    obj: Obj
    spec: AdapterSpec
    base: BaseModelSpec
    name: str
    namespace: str
    generation: int
    owner: Obj
    """The Adapter as controller of its merged pods' objects."""
    labels: dict[str, str]
    """The Adapter's and its BaseModel's labels on the build objects and the model configuration."""
    config: OperatorConfig
    now: datetime


def reconcile_merged(
    obj: Obj,
    spec: AdapterSpec,
    base: BaseModelSpec,
    observed: AdapterObserved,
    config: OperatorConfig,
    now: datetime,
    status: Obj,
) -> Reconciliation:
    """Planned, the engine built (nothing to build for ``runtime: reference``), the merged pods rolled out."""
    meta = obj["metadata"]
    name, namespace, uid = meta["name"], meta["namespace"], meta["uid"]
    generation = int(meta.get("generation") or 0)
    jobs = [job_snapshot(j) for j in observed.build_jobs]
    users = merged_users(observed.merged_adapters, observed.basemodels)
    try:
        plan, capacity = _planned(base, spec)
    except PlanningError as exc:
        deletes, handovers = release_stale(uid, None, jobs, observed.plan_configmaps, users)
        message = f"the merged engine cannot be planned: {exc}"
        failure = cond.make(cond.VALIDATED, cond.FALSE, exc.reason, message, generation=generation)
        conditions = [failure, {**failure, "type": cond.READY}]
        failed = {**status, "phase": AdapterPhase.FAILED.value, "conditions": conditions}
        return finish(obj, failed, now, delete=deletes, set_owners=handovers)
    deletes, handovers = release_stale(
        uid, None if base.runtime is Runtime.REFERENCE else plan.engine_hash, jobs, observed.plan_configmaps, users
    )
    ctx = _Context(
        obj,
        spec,
        base,
        name,
        namespace,
        generation,
        owner_reference("Adapter", API_VERSION, name, uid, controller=True),
        {LABEL_ADAPTER: label_value(name), LABEL_BASEMODEL: label_value(spec.base_model)},
        config,
        now,
    )
    engine = _engine_step(ctx, plan, jobs, observed, users)
    serving = _serving_step(ctx, plan, engine, observed.deployment)
    validated = cond.make(
        cond.VALIDATED,
        cond.TRUE,
        "MergedPlanned",
        f"merged engine of BaseModel {spec.base_model} with {spec.source.uri} planned ({capacity.message})",
        generation=generation,
    )
    engine_built = {**engine.condition, "observedGeneration": generation}
    return finish(
        obj,
        {**status, "phase": serving.phase.value, "conditions": [validated, engine_built, serving.ready]},
        now,
        apply=(*_fixed_objects(ctx), *engine.apply, *serving.apply),
        delete=(*engine.delete, *deletes),
        set_owners=(*engine.set_owners, *handovers),
        requeue_after_s=engine.requeue_after_s,
        counters=engine.counters,
    )


def _planned(base: BaseModelSpec, spec: AdapterSpec) -> tuple[EnginePlan, CapacityVerdict]:
    """The merged engine's plan and its capacity verdict; PlanningError when it cannot be planned or does not
    fit."""
    plan = plan_merged(base, spec.source.uri, spec.source.revision)
    capacity = plan_capacity(plan.render_spec)
    if not capacity.fits:
        raise PlanningError(capacity.reason, capacity.message)
    return plan, capacity


def _engine_step(
    ctx: _Context,
    plan: EnginePlan,
    jobs: Sequence[JobSnapshot],
    observed: AdapterObserved,
    users: Mapping[str, tuple[Obj, ...]],
) -> EngineOutcome:
    """EngineBuilt: nothing to build (reference), else the shared build of the merged hash (the prepare Job on
    ``runtime: pytorch``), owned by every merged Adapter that wants it."""
    base = ctx.base
    if base.runtime is Runtime.REFERENCE:
        return _reference_engine(base, ctx.spec, ctx.config)
    inputs = engine_inputs(
        ctx.namespace,
        plan,
        base,
        hash_owners(users, plan.engine_hash, shared_owner(ctx.obj)),
        jobs,
        observed.plan_configmaps,
        observed.engine_records,
        observed.build_pods,
        labels=ctx.labels,
        merged_sources=(ctx.spec.source.uri,),
        kind=CHECKPOINT_PREPARE if base.runtime is Runtime.PYTORCH else None,
    )
    return reconcile_engine(inputs, ctx.config, ctx.now)


@dataclass(frozen=True)
class _ServingOutcome:
    apply: tuple[Obj, ...]
    ready: cond.Condition
    phase: AdapterPhase


def _serving_step(ctx: _Context, plan: EnginePlan, engine: EngineOutcome, deployment: Obj | None) -> _ServingOutcome:
    """Ready: the merged pods rolled out once the engine is built; until then Ready says what the build says."""
    if engine.state != "built":
        reason, message = engine.condition["reason"], engine.condition["message"]
        ready = cond.make(cond.READY, cond.FALSE, reason, message, generation=ctx.generation)
        return _ServingOutcome((), ready, AdapterPhase.FAILED if engine.state == "failed" else AdapterPhase.CONVERTING)
    config_map, desired = _serving(
        plan,
        ctx.base,
        ctx.spec,
        name=ctx.name,
        namespace=ctx.namespace,
        owner=ctx.owner,
        labels=ctx.labels,
        config=ctx.config,
    )
    was_serving = (ctx.obj.get("status") or {}).get("phase") == AdapterPhase.READY.value
    state = serving_state(desired, deployment, was_serving=was_serving)
    phase = AdapterPhase.READY if state.state == "ready" else AdapterPhase.PENDING
    return _ServingOutcome((config_map, desired), {**state.condition, "observedGeneration": ctx.generation}, phase)


def _fixed_objects(ctx: _Context) -> tuple[Obj, Obj]:
    """The merged pods' Service and PodDisruptionBudget, there from the start."""
    serving, adapter, basemodel = merged_serving_name(ctx.name), ctx.name, ctx.spec.base_model
    return (
        build_service(
            name=serving, namespace=ctx.namespace, owner=ctx.owner, basemodel=basemodel, adapter=adapter,
            runtime=ctx.base.runtime, server=ctx.base.serving.server,
        ),
        build_pdb(name=serving, namespace=ctx.namespace, owner=ctx.owner, basemodel=basemodel, adapter=adapter),
    )
