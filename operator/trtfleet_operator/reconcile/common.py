"""Helpers the BaseModel and Adapter reconcilers share (pure): who wants which hash, the slice of the
namespace's build objects one hash owns, and :func:`finish`, which stamps conditions and derives events.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import datetime

from pydantic import ValidationError

from trtfleet.api import API_VERSION, BaseModelSpec, Runtime
from trtfleet_operator import conditions as cond
from trtfleet_operator.errors import PlanningError
from trtfleet_operator.names import ANNOTATION_ENGINE_HASH, LABEL_JOB_NAME, owner_reference
from trtfleet_operator.planning import EnginePlan, plan_capacity, plan_engine
from trtfleet_operator.reconcile.engine import BuildKind, EngineInputs, rfc3339
from trtfleet_operator.reconcile.events import status_events
from trtfleet_operator.reconcile.types import Counter, JobSnapshot, Obj, ObjectRef, Reconciliation, SetOwners

NOT_NEEDED = "NotNeeded"
"""EngineBuilt reason of ``runtime: reference``: the worker serves the model (merged at start) as it is."""


def shared_owner(obj: Mapping[str, object]) -> Obj:
    meta = obj["metadata"]
    assert isinstance(meta, Mapping)
    return owner_reference(str(obj["kind"]), API_VERSION, str(meta["name"]), str(meta["uid"]), controller=False)


def hash_owners(users: Mapping[str, Sequence[Obj]], engine_hash: str, owner: Obj) -> tuple[Obj, ...]:
    """Who owns ``engine_hash``'s build objects: its users and ``owner``, once each, sorted by name."""
    everyone = {o["uid"]: o for o in (*users.get(engine_hash, ()), owner)}
    return tuple(sorted(everyone.values(), key=lambda o: str(o["name"])))


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
    kind: BuildKind | None = None,
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
        kind=kind,
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
    """Stamp condition transition times (keeping the merge timer's condition), derive events and counters
    from the status change."""
    old = obj.get("status") or {}
    new_status["conditions"] = cond.keep(
        cond.merge(old.get("conditions"), new_status["conditions"], now=rfc3339(now)),
        old.get("conditions"),
        (cond.MERGE_RECOMMENDED,),  # the merge timer's
    )
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
