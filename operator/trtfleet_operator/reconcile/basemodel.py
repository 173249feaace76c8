"""BaseModel reconciler (pure): spec + observed objects -> objects to apply, status, events.

Order of business, each step gating the next:

1. **CapacityPlanned**: the capacity planner must say the engine, KV cache and LoRA cache fit; if not,
   phase Failed (reason ``DoesNotFit``, the planner's words) and nothing is created. A spec the pinned
   TensorRT-LLM release refuses (``trtfleet_engines.constraints``) fails the same way, with ``EngineBuilt``
   False, reason ``UnsupportedByRelease`` and a message naming the rule and the fix.
2. **EngineBuilt**: ``runtime: reference`` has nothing to build. ``tensorrtllm`` runs the shared build
   state machine of :mod:`trtfleet_operator.reconcile.engine` for the spec's engine hash.
3. **Ready**: once the engine is built, the model-repository ConfigMap and the Deployment are applied and
   the rollout is judged by :mod:`trtfleet_operator.reconcile.serving`. While a *new* engine builds, the
   Deployment is left as it is, still serving the previous engine. The Service and PodDisruptionBudget
   exist from the start.

Phase: Failed (capacity or build) > Building > Ready / Degraded / Pending (rolling out).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime

from pydantic import ValidationError

from trtfleet.api import API_VERSION, BaseModelSpec, Phase, Runtime
from trtfleet_operator import conditions as cond
from trtfleet_operator.builders.serving import (
    build_deployment,
    build_model_repo_configmap,
    build_pdb,
    build_service,
    reference_model_dir,
)
from trtfleet_operator.config import OperatorConfig
from trtfleet_operator.errors import PlanningError
from trtfleet_operator.names import (
    ANNOTATION_ENGINE_HASH,
    LABEL_JOB_NAME,
    hash16,
    owner_reference,
    serving_name,
)
from trtfleet_operator.planning import CapacityVerdict, EnginePlan, plan_capacity, plan_engine
from trtfleet_operator.reconcile.engine import (
    EngineInputs,
    EngineOutcome,
    reconcile_engine,
    release_stale,
    rfc3339,
)
from trtfleet_operator.reconcile.events import status_events
from trtfleet_operator.reconcile.serving import WAITING_FOR_ENGINE, serving_state
from trtfleet_operator.reconcile.types import (
    Counter,
    JobSnapshot,
    Obj,
    ObjectRef,
    Reconciliation,
    SetOwners,
    job_snapshot,
)

NOT_PLANNED = "NotPlanned"
NOT_NEEDED = "NotNeeded"
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
)
"""Status fields this reconciler owns; ``nextTaskId`` belongs to the task-id allocator alone."""


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


def shared_owner(obj: Mapping[str, object]) -> Obj:
    meta = obj["metadata"]
    assert isinstance(meta, Mapping)
    return owner_reference(str(obj["kind"]), API_VERSION, str(meta["name"]), str(meta["uid"]), controller=False)


def planned_hash(obj: Mapping[str, object]) -> str | None:
    """The engine hash a BaseModel wants built, or None (reference runtime, unplannable, deleting)."""
    meta = obj.get("metadata")
    if not isinstance(meta, Mapping) or meta.get("deletionTimestamp"):
        return None
    try:
        spec = BaseModelSpec.model_validate(obj.get("spec"))
        if spec.runtime is Runtime.REFERENCE or not plan_capacity(spec).fits:
            return None
        return plan_engine(spec).engine_hash
    except (ValidationError, PlanningError):
        return None


def engine_users(objects: Sequence[Obj]) -> dict[str, tuple[Obj, ...]]:
    """Engine hash -> owner references of every object wanting it, sorted by name."""
    users: dict[str, list[Obj]] = {}
    for obj in sorted(objects, key=lambda o: str(o["metadata"]["name"])):
        wanted = planned_hash(obj)
        if wanted is not None:
            users.setdefault(wanted, []).append(shared_owner(obj))
    return {key: tuple(value) for key, value in users.items()}


def by_hash(objects: Sequence[Obj], engine_hash: str) -> list[Obj]:
    return [o for o in objects if (o["metadata"].get("annotations") or {}).get(ANNOTATION_ENGINE_HASH) == engine_hash]


def engine_inputs(
    namespace: str,
    plan: EnginePlan,
    spec: BaseModelSpec,
    owners: tuple[Obj, ...],
    jobs: Sequence[JobSnapshot],
    plan_configmaps: Sequence[Obj],
    records: Sequence[Obj],
    pods: Sequence[Obj],
    *,
    labels: Mapping[str, str] | None = None,
    merged_sources: tuple[str, ...] = (),
) -> EngineInputs:
    """The slice of the namespace's build objects that concerns ``plan``'s engine hash."""
    mine = tuple(j for j in jobs if j.engine_hash == plan.engine_hash)
    names = {j.name for j in mine}
    cms = by_hash(plan_configmaps, plan.engine_hash)
    recs = by_hash(records, plan.engine_hash)
    return EngineInputs(
        namespace=namespace,
        plan=plan,
        spec=spec,
        owners=owners,
        jobs=mine,
        plan_configmap=cms[0] if cms else None,
        record=recs[0] if recs else None,
        failure_pods=tuple(p for p in pods if (p["metadata"].get("labels") or {}).get(LABEL_JOB_NAME) in names),
        labels=dict(labels or {}),
        merged_sources=merged_sources,
    )


def finish(
    obj: Obj,
    new_status: Obj,
    now: datetime,
    *,
    apply: Sequence[Obj] = (),
    delete: Sequence[ObjectRef] = (),
    set_owners: Sequence[SetOwners] = (),
    requeue_after_s: float | None = None,
    counters: Sequence[Counter] = (),
    needs_task_id: bool = False,
) -> Reconciliation:
    """Stamp condition transition times, derive events and counters from the status change."""
    old = obj.get("status") or {}
    new_status["conditions"] = cond.merge(old.get("conditions"), new_status["conditions"], now=rfc3339(now))
    events, transition_counters = status_events(old, new_status)
    return Reconciliation(
        status=new_status,
        apply=tuple(apply),
        delete=tuple(delete),
        set_owners=tuple(set_owners),
        events=tuple(events),
        requeue_after_s=requeue_after_s,
        counters=(*counters, *transition_counters),
        needs_task_id=needs_task_id,
    )


def reconcile_basemodel(obj: Obj, observed: BaseModelObserved, config: OperatorConfig, now: datetime) -> Reconciliation:
    meta = obj["metadata"]
    name, namespace, uid = meta["name"], meta["namespace"], meta["uid"]
    generation = int(meta.get("generation") or 0)
    old = obj.get("status") or {}
    status: Obj = {"observedGeneration": generation, "service": serving_name(name)}

    def failed(
        conditions: list[cond.Condition],
        delete: Sequence[ObjectRef] = (),
        set_owners: Sequence[SetOwners] = (),
    ) -> Reconciliation:
        return finish(
            obj,
            {**status, "phase": Phase.FAILED.value, "conditions": conditions},
            now,
            delete=delete,
            set_owners=set_owners,
        )

    try:
        spec = BaseModelSpec.model_validate(obj["spec"])
    except ValidationError as exc:
        message = f"the spec is invalid for this operator version: {exc.errors()[0].get('msg', exc)}"
        return failed([cond.make(cond.CAPACITY_PLANNED, cond.FALSE, INVALID_SPEC, message, generation=generation)])
    status["replicas"] = spec.serving.replicas
    jobs = [job_snapshot(j) for j in observed.build_jobs]
    users = engine_users(list(observed.basemodels))
    capacity: CapacityVerdict = plan_capacity(spec)
    if capacity.status:
        status["capacity"] = capacity.status
    capacity_condition = cond.make(
        cond.CAPACITY_PLANNED,
        cond.TRUE if capacity.fits else cond.FALSE,
        capacity.reason,
        capacity.message,
        generation=generation,
    )
    plan: EnginePlan | None = None
    planning_error: PlanningError | None = None
    try:  # planned even when the capacity does not fit, so both conditions say what to fix
        planned = plan_engine(spec)
        plan = planned if capacity.fits else None
    except PlanningError as exc:
        planning_error = exc
    stale_deletes, handovers = release_stale(
        uid,
        plan.engine_hash if plan and spec.runtime is Runtime.TENSORRTLLM else None,
        jobs,
        observed.plan_configmaps,
        users,
    )
    if plan is None:
        not_planned = cond.make(
            cond.ENGINE_BUILT,
            cond.UNKNOWN,
            NOT_PLANNED,
            "nothing is built until the spec can be planned",
            generation=generation,
        )
        if planning_error is not None:
            not_planned = cond.make(
                cond.ENGINE_BUILT,
                cond.FALSE,
                planning_error.reason,
                str(planning_error),
                generation=generation,
            )
        ready = cond.make(
            cond.READY,
            cond.FALSE,
            NOT_PLANNED,
            "no pods are started for a spec that cannot be "
            "planned; fix the spec (see the CapacityPlanned and EngineBuilt conditions)",
            generation=generation,
        )
        return failed(
            [capacity_condition, not_planned, ready], delete=tuple(stale_deletes), set_owners=tuple(handovers)
        )

    owner = owner_reference("BaseModel", API_VERSION, name, uid, controller=True)
    if spec.runtime is Runtime.REFERENCE:
        engine = EngineOutcome(
            "built",
            cond.make(
                cond.ENGINE_BUILT,
                cond.TRUE,
                NOT_NEEDED,
                f"runtime reference serves {reference_model_dir(spec)} from {config.images.worker}; nothing to build",
            ),
            {"hash": plan.engine_hash, "image": config.images.worker, "uri": spec.source.uri},
        )
    else:
        me = shared_owner(obj)
        owners = tuple(
            sorted(
                {o["uid"]: o for o in (*users.get(plan.engine_hash, ()), me)}.values(),
                key=lambda o: str(o["name"]),
            )
        )
        engine = reconcile_engine(
            engine_inputs(
                namespace,
                plan,
                spec,
                owners,
                jobs,
                observed.plan_configmaps,
                observed.engine_records,
                observed.build_pods,
            ),
            config,
            now,
        )
    applies: list[Obj] = [
        build_service(name=serving_name(name), namespace=namespace, owner=owner, basemodel=name),
        build_pdb(name=serving_name(name), namespace=namespace, owner=owner, basemodel=name),
        *engine.apply,
    ]
    was_serving = old.get("phase") in (Phase.READY.value, Phase.DEGRADED.value)
    deployment = observed.deployment
    if engine.state == "built":
        model_repo = build_model_repo_configmap(
            plan.render_spec,
            name=serving_name(name),
            namespace=namespace,
            owner=owner,
            engine_hash=plan.engine_hash,
            config=config,
        )
        desired = build_deployment(
            plan.render_spec,
            name=serving_name(name),
            namespace=namespace,
            owner=owner,
            basemodel=name,
            engine_hash=plan.engine_hash,
            model_repo=model_repo,
            config=config,
        )
        applies += [model_repo, desired]
        serving = serving_state(desired, deployment, was_serving=was_serving)
        ready_condition = serving.condition
    elif deployment is not None:
        serving = serving_state(deployment, deployment, was_serving=was_serving)
        served = (deployment["metadata"].get("annotations") or {}).get(ANNOTATION_ENGINE_HASH, "")
        ready_condition = {
            **serving.condition,
            "message": f"still serving engine {hash16(served)} while engine "
            f"{hash16(plan.engine_hash)} is built: {serving.condition['message']}",
        }
    else:
        serving = None
        ready_condition = cond.make(
            cond.READY,
            cond.FALSE,
            WAITING_FOR_ENGINE,
            f"waiting for engine {hash16(plan.engine_hash)} to be built",
        )
    status["engine"] = engine.engine_status
    status["readyReplicas"] = int(((deployment or {}).get("status") or {}).get("readyReplicas") or 0)
    if engine.state == "failed":
        phase = Phase.FAILED
    elif engine.state == "building":
        phase = Phase.BUILDING
    elif serving is not None and serving.state == "ready":
        phase = Phase.READY
    elif serving is not None and serving.state == "degraded":
        phase = Phase.DEGRADED
    else:
        phase = Phase.PENDING
    status["phase"] = phase.value
    status["conditions"] = [
        capacity_condition,
        {**engine.condition, "observedGeneration": generation},
        {**ready_condition, "observedGeneration": generation},
    ]
    delete: tuple[ObjectRef, ...] = (*engine.delete, *stale_deletes)
    set_owners: tuple[SetOwners, ...] = (*engine.set_owners, *handovers)
    return finish(
        obj,
        status,
        now,
        apply=tuple(applies),
        delete=delete,
        set_owners=set_owners,
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
