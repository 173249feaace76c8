"""BaseModel reconciler (pure): spec + observed objects -> objects to apply, status, events.

Order of business, each step gating the next:

1. **CapacityPlanned**: the capacity planner must say the engine, KV cache and LoRA cache fit; if not,
   phase Failed (reason ``DoesNotFit``, the planner's words) and nothing is created. A spec the pinned
   TensorRT-LLM release refuses (``trtfleet_engines.constraints``) fails the same way, with ``EngineBuilt``
   False, reason ``UnsupportedByRelease`` and a message naming the rule and the fix.
2. **EngineBuilt**: ``runtime: reference`` has nothing to build. ``tensorrtllm`` runs the shared build
   state machine of :mod:`trtfleet_operator.reconcile.engine` for the spec's engine hash; ``pytorch`` runs
   the same machine with the prepare Job for the spec's ``prepare_hash`` (reasons ``Prepared``,
   ``Preparing``, ``PrepareFailed``, ``PrepareRetrying``).
3. **Ready**: once the engine is built (or the checkpoint prepared), the ConfigMap the pods read (Triton's
   model configs, or the LLM-API options) and the Deployment are applied and the rollout is judged by
   :mod:`trtfleet_operator.reconcile.serving`. While a *new* hash builds, the Deployment is left as it
   is, still serving the previous one. The Service and PodDisruptionBudget exist from the start.
4. **InferencePoolReady** (only with the operator's ``--inference-pool-picker``): the BaseModel's InferencePool,
   from the start too, when the cluster serves the CRD (:mod:`.inferencepool`).

:func:`reconcile_basemodel` is a driver over one function per step (``_planned_step``, ``_artifact_step``,
``_serving_step``, ``_pool_step``); helpers shared with the Adapter reconciler are in :mod:`.common`.

Phase: Failed (capacity or build) > Building > Ready / Degraded / Pending (rolling out).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime

from pydantic import ValidationError

from trtfleet.api import API_VERSION, BaseModelSpec, Phase, Runtime
from trtfleet_operator import conditions as cond
from trtfleet_operator.builders.pytorch import build_options_configmap, build_pytorch_deployment
from trtfleet_operator.builders.service import build_pdb, build_service
from trtfleet_operator.builders.serving import (
    build_deployment,
    build_model_repo_configmap,
    reference_model_dir,
    selector_labels,
)
from trtfleet_operator.config import OperatorConfig
from trtfleet_operator.errors import PlanningError
from trtfleet_operator.names import (
    ANNOTATION_ENGINE_HASH,
    hash16,
    owner_reference,
    serving_name,
)
from trtfleet_operator.planning import CapacityVerdict, EnginePlan, plan_capacity, plan_engine
from trtfleet_operator.reconcile.common import (
    NOT_NEEDED,
    engine_inputs,
    engine_users,
    finish,
    hash_owners,
    shared_owner,
)
from trtfleet_operator.reconcile.common import by_hash as by_hash
from trtfleet_operator.reconcile.common import planned_hash as planned_hash
from trtfleet_operator.reconcile.engine import (
    CHECKPOINT_PREPARE,
    EngineOutcome,
    reconcile_engine,
    release_stale,
)
from trtfleet_operator.reconcile.inferencepool import PoolObserved, PoolOutcome, inference_pool_step
from trtfleet_operator.reconcile.serving import WAITING_FOR_ENGINE, ServingState, serving_state
from trtfleet_operator.reconcile.types import (
    Obj,
    Reconciliation,
    job_snapshot,
)

NOT_PLANNED = "NotPlanned"
INVALID_SPEC = "InvalidSpec"

STATUS_KEYS = (
    "phase",
    "observedGeneration",
    "conditions",
    "engine",
    "capacity",
    "replicas",
    "readyReplicas",
    "service",
    "selector",
)
"""Status fields this reconciler owns; ``nextTaskId`` belongs to the task-id allocator alone, ``autoscaling``
(and the ``ScalingActive`` condition, which this reconciler keeps as it finds it) to the autoscaler."""


@dataclass(frozen=True)
class BaseModelObserved:
    """Everything in the BaseModel's namespace the reconcile looks at (raw objects)."""

    basemodels: tuple[Obj, ...] = ()
    build_jobs: tuple[Obj, ...] = ()
    plan_configmaps: tuple[Obj, ...] = ()
    engine_records: tuple[Obj, ...] = ()
    build_pods: tuple[Obj, ...] = field(default=())
    """Pods of failed build Jobs (for their termination messages)."""
    deployment: Obj | None = None
    inference_pool: PoolObserved | None = None
    """Observed only with the operator's ``--inference-pool-picker``."""


@dataclass(frozen=True)
class _Context:
    """What every step of one BaseModel reconcile reads."""

    obj: Obj
    spec: BaseModelSpec
    name: str
    namespace: str
    generation: int
    owner: Obj
    config: OperatorConfig
    now: datetime


@dataclass(frozen=True)
class _ServingOutcome:
    apply: tuple[Obj, ...]
    state: ServingState | None
    condition: cond.Condition


def _planned_step(ctx: _Context, capacity: CapacityVerdict) -> tuple[cond.Condition, EnginePlan | None, cond.Condition]:
    """CapacityPlanned, the plan (None unless it fits and plans), and the EngineBuilt condition when there is
    no plan. Planned even when the capacity does not fit, so both conditions say what to fix."""
    generation = ctx.generation
    capacity_condition = cond.make(
        cond.CAPACITY_PLANNED,
        cond.TRUE if capacity.fits else cond.FALSE,
        capacity.reason,
        capacity.message,
        generation=generation,
    )
    try:
        planned = plan_engine(ctx.spec)
    except PlanningError as exc:
        return capacity_condition, None, cond.make(
            cond.ENGINE_BUILT, cond.FALSE, exc.reason, str(exc), generation=generation
        )
    not_planned = cond.make(
        cond.ENGINE_BUILT, cond.UNKNOWN, NOT_PLANNED, "nothing is built until the spec can be planned",
        generation=generation,
    )
    return capacity_condition, planned if capacity.fits else None, not_planned


def _artifact_step(
    ctx: _Context, plan: EnginePlan, observed: BaseModelObserved, users: Mapping[str, tuple[Obj, ...]]
) -> EngineOutcome:
    """EngineBuilt: nothing to build (reference), the engine build (tensorrtllm) or the prepare Job (pytorch),
    the last two through the same hash-keyed Job machinery."""
    spec, config = ctx.spec, ctx.config
    if spec.runtime is Runtime.REFERENCE:
        message = f"runtime reference serves {reference_model_dir(spec)} from {config.images.worker}; nothing to build"
        return EngineOutcome(
            "built",
            cond.make(cond.ENGINE_BUILT, cond.TRUE, NOT_NEEDED, message),
            {"hash": plan.engine_hash, "image": config.images.worker, "uri": spec.source.uri},
        )
    inputs = engine_inputs(
        ctx.namespace,
        plan,
        spec,
        hash_owners(users, plan.engine_hash, shared_owner(ctx.obj)),
        [job_snapshot(j) for j in observed.build_jobs],
        observed.plan_configmaps,
        observed.engine_records,
        observed.build_pods,
        kind=CHECKPOINT_PREPARE if spec.runtime is Runtime.PYTORCH else None,
    )
    return reconcile_engine(inputs, config, ctx.now)


def serving_objects(ctx: _Context, plan: EnginePlan) -> tuple[Obj, Obj]:
    """(the ConfigMap the pods read, the Deployment) once the engine is built or the checkpoint prepared."""
    serving = serving_name(ctx.name)
    if ctx.spec.runtime is Runtime.PYTORCH:
        options = build_options_configmap(plan, name=serving, namespace=ctx.namespace, owner=ctx.owner)
        deployment = build_pytorch_deployment(
            plan.render_spec, plan, name=serving, namespace=ctx.namespace, owner=ctx.owner, basemodel=ctx.name,
            options=options, config=ctx.config,
        )
        return options, deployment
    model_repo = build_model_repo_configmap(
        plan.render_spec, name=serving, namespace=ctx.namespace, owner=ctx.owner, engine_hash=plan.engine_hash,
        config=ctx.config,
    )
    deployment = build_deployment(
        plan.render_spec, name=serving, namespace=ctx.namespace, owner=ctx.owner, basemodel=ctx.name,
        engine_hash=plan.engine_hash, model_repo=model_repo, config=ctx.config,
    )
    return model_repo, deployment


def _serving_step(
    ctx: _Context, plan: EnginePlan, engine: EngineOutcome, deployment: Obj | None, *, was_serving: bool
) -> _ServingOutcome:
    """Ready: roll out once built; while a new hash builds, keep serving the old Deployment as it is."""
    if engine.state == "built":
        config_map, desired = serving_objects(ctx, plan)
        state = serving_state(desired, deployment, was_serving=was_serving)
        return _ServingOutcome((config_map, desired), state, state.condition)
    noun, verb = ("checkpoint", "prepared") if ctx.spec.runtime is Runtime.PYTORCH else ("engine", "built")
    if deployment is not None:
        state = serving_state(deployment, deployment, was_serving=was_serving)
        served = (deployment["metadata"].get("annotations") or {}).get(ANNOTATION_ENGINE_HASH, "")
        message = (
            f"still serving {noun} {hash16(served)} while {noun} {hash16(plan.engine_hash)} is {verb}: "
            f"{state.condition['message']}"
        )
        return _ServingOutcome((), state, {**state.condition, "message": message})
    waiting = f"waiting for {noun} {hash16(plan.engine_hash)} to be {verb}"
    return _ServingOutcome((), None, cond.make(cond.READY, cond.FALSE, WAITING_FOR_ENGINE, waiting))


def _pool_step(ctx: _Context, observed: BaseModelObserved) -> PoolOutcome | None:
    """InferencePoolReady: the BaseModel's InferencePool, when the operator renders them (None: it does not)."""
    picker = ctx.config.inference_pool
    if picker is None or observed.inference_pool is None:
        return None
    return inference_pool_step(
        ctx.spec, name=serving_name(ctx.name), namespace=ctx.namespace, owner=ctx.owner, basemodel=ctx.name,
        picker=picker, observed=observed.inference_pool, generation=ctx.generation,
    )


def _phase(engine: EngineOutcome, serving: ServingState | None) -> Phase:
    if engine.state == "failed":
        return Phase.FAILED
    if engine.state == "building":
        return Phase.BUILDING
    if serving is not None and serving.state == "ready":
        return Phase.READY
    if serving is not None and serving.state == "degraded":
        return Phase.DEGRADED
    return Phase.PENDING


def reconcile_basemodel(obj: Obj, observed: BaseModelObserved, config: OperatorConfig, now: datetime) -> Reconciliation:
    meta = obj["metadata"]
    name, namespace, uid = meta["name"], meta["namespace"], meta["uid"]
    generation = int(meta.get("generation") or 0)
    status: Obj = {
        "observedGeneration": generation,
        "service": serving_name(name),
        "selector": ",".join(f"{key}={value}" for key, value in sorted(selector_labels(name).items())),
    }
    try:
        spec = BaseModelSpec.model_validate(obj["spec"])
    except ValidationError as exc:
        message = f"the spec is invalid for this operator version: {exc.errors()[0].get('msg', exc)}"
        invalid = cond.make(cond.CAPACITY_PLANNED, cond.FALSE, INVALID_SPEC, message, generation=generation)
        return finish(obj, {**status, "phase": Phase.FAILED.value, "conditions": [invalid]}, now)
    owner = owner_reference("BaseModel", API_VERSION, name, uid, controller=True)
    ctx = _Context(obj, spec, name, namespace, generation, owner, config, now)
    status["replicas"] = spec.serving.replicas
    users = engine_users(list(observed.basemodels))
    capacity = plan_capacity(spec)
    if capacity.status:
        status["capacity"] = capacity.status
    capacity_condition, plan, not_planned = _planned_step(ctx, capacity)
    stale_deletes, handovers = release_stale(
        uid,
        plan.engine_hash if plan and spec.runtime is not Runtime.REFERENCE else None,
        [job_snapshot(j) for j in observed.build_jobs],
        observed.plan_configmaps,
        users,
    )
    if plan is None:
        ready = cond.make(
            cond.READY, cond.FALSE, NOT_PLANNED, "no pods are started for a spec that cannot be planned; fix the "
            "spec (see the CapacityPlanned and EngineBuilt conditions)", generation=generation,
        )
        failed = {**status, "phase": Phase.FAILED.value, "conditions": [capacity_condition, not_planned, ready]}
        return finish(obj, failed, now, delete=stale_deletes, set_owners=handovers)
    engine = _artifact_step(ctx, plan, observed, users)
    was_serving = (obj.get("status") or {}).get("phase") in (Phase.READY.value, Phase.DEGRADED.value)
    serving = _serving_step(ctx, plan, engine, observed.deployment, was_serving=was_serving)
    pool = _pool_step(ctx, observed)
    status["engine"] = engine.engine_status
    status["readyReplicas"] = int(((observed.deployment or {}).get("status") or {}).get("readyReplicas") or 0)
    status["phase"] = _phase(engine, serving.state).value
    scaling = cond.find((obj.get("status") or {}).get("conditions"), cond.SCALING_ACTIVE)
    status["conditions"] = [
        capacity_condition,
        {**engine.condition, "observedGeneration": generation},
        {**serving.condition, "observedGeneration": generation},
        *([pool.condition] if pool is not None else []),
        *([scaling] if scaling is not None and spec.autoscaling is not None else []),
    ]
    return finish(
        obj,
        status,
        now,
        apply=(
            build_service(
                name=serving_name(name), namespace=namespace, owner=owner, basemodel=name, runtime=spec.runtime,
                server=spec.serving.server,
            ),
            build_pdb(name=serving_name(name), namespace=namespace, owner=owner, basemodel=name),
            *(pool.apply if pool is not None else ()),
            *engine.apply,
            *serving.apply,
        ),
        delete=(*engine.delete, *stale_deletes),
        set_owners=(*engine.set_owners, *handovers),
        requeue_after_s=engine.requeue_after_s,
        counters=engine.counters,
    )


def deletion_blocked(obj: Obj, adapters: Sequence[str], now: datetime) -> Reconciliation:
    """Status of a BaseModel whose deletion waits for the Adapters still pointing at it."""
    old = obj.get("status") or {}
    names = sorted(adapters)
    shown = ", ".join(names[:10]) + (f" and {len(names) - 10} more" if len(names) > 10 else "")
    namespace = obj["metadata"]["namespace"]
    message = (
        f"{len(names)} Adapter(s) still use this BaseModel ({shown}); delete them first, e.g. "
        f"`kubectl delete adapters -n {namespace} {' '.join(names[:10])}`"
    )
    kept = [c for c in old.get("conditions") or [] if c.get("type") != cond.DELETION_BLOCKED]
    blocked = cond.make(cond.DELETION_BLOCKED, cond.TRUE, "AdaptersRemaining", message)
    return finish(obj, {**{k: v for k, v in old.items() if k in STATUS_KEYS}, "conditions": [*kept, blocked]}, now)
