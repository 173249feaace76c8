"""Data the pure reconcilers take and give: snapshots of observed objects, and the actions to take.

The shell fetches raw objects; :func:`job_snapshot` and :func:`termination_message` read them here, so
the interpretation of Job and Pod status is pure and tested with tables.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from trtfleet_operator.names import ANNOTATION_ENGINE_HASH, LABEL_BUILD_ATTEMPT, LABEL_SOURCE_KEY

Obj = dict[str, Any]


@dataclass(frozen=True)
class ObjectRef:
    """Enough to delete or patch one object; ``uid`` makes a delete conditional on identity."""

    api_version: str
    kind: str
    namespace: str
    name: str
    uid: str | None = None

    @classmethod
    def of(cls, obj: Mapping[str, Any]) -> ObjectRef:
        meta = obj["metadata"]
        return cls(obj["apiVersion"], obj["kind"], meta.get("namespace", ""), meta["name"], meta.get("uid"))


@dataclass(frozen=True)
class SetOwners:
    """Replace ``ref``'s ownerReferences, if ``resource_version`` is still current (optimistic lock)."""

    ref: ObjectRef
    owners: tuple[Obj, ...]
    resource_version: str


@dataclass(frozen=True)
class Event:
    type: Literal["Normal", "Warning"]
    reason: str
    message: str


Counter = Literal["build_started", "build_succeeded", "build_failed"]


@dataclass(frozen=True)
class Reconciliation:
    """What one reconcile wants done. ``apply`` is server-side apply in order; ``status`` is the whole
    desired status (the shell patches only the fields that differ)."""

    status: Obj
    apply: tuple[Obj, ...] = ()
    set_owners: tuple[SetOwners, ...] = ()
    delete: tuple[ObjectRef, ...] = ()
    events: tuple[Event, ...] = ()
    requeue_after_s: float | None = None
    counters: tuple[Counter, ...] = ()
    needs_task_id: bool = False


@dataclass(frozen=True)
class JobSnapshot:
    """A Job as the reconcilers see it."""

    name: str
    namespace: str
    uid: str
    resource_version: str
    owners: tuple[Obj, ...]
    engine_hash: str | None
    source_key: str | None
    attempt: int
    active: int
    succeeded: int
    failed: int
    complete: bool
    failed_final: bool
    finished_at: str | None
    failure_reason: str
    failure_message: str
    deleting: bool
    raw: Obj = field(repr=False, compare=False, default_factory=dict)

    @property
    def finished(self) -> bool:
        return self.complete or self.failed_final

    @property
    def ref(self) -> ObjectRef:
        return ObjectRef("batch/v1", "Job", self.namespace, self.name, self.uid)

    def owned_by(self, uid: str) -> bool:
        return any(owner.get("uid") == uid for owner in self.owners)


def _true(conditions: Sequence[Mapping[str, Any]], type_: str) -> Mapping[str, Any] | None:
    for condition in conditions:
        if condition.get("type") == type_ and condition.get("status") == "True":
            return condition
    return None


def job_snapshot(obj: Mapping[str, Any]) -> JobSnapshot:
    meta = obj.get("metadata", {})
    status = obj.get("status") or {}
    conditions = status.get("conditions") or []
    complete = _true(conditions, "Complete")
    failed = _true(conditions, "Failed")
    labels = meta.get("labels") or {}
    try:
        attempt = int(labels.get(LABEL_BUILD_ATTEMPT, "1"))
    except ValueError:
        attempt = 1
    finished_at = None
    if complete is not None:
        finished_at = status.get("completionTime") or complete.get("lastTransitionTime")
    elif failed is not None:
        finished_at = failed.get("lastTransitionTime")
    return JobSnapshot(
        name=meta.get("name", ""),
        namespace=meta.get("namespace", ""),
        uid=meta.get("uid", ""),
        resource_version=meta.get("resourceVersion", ""),
        owners=tuple(meta.get("ownerReferences") or ()),
        engine_hash=(meta.get("annotations") or {}).get(ANNOTATION_ENGINE_HASH),
        source_key=labels.get(LABEL_SOURCE_KEY),
        attempt=attempt,
        active=int(status.get("active") or 0),
        succeeded=int(status.get("succeeded") or 0),
        failed=int(status.get("failed") or 0),
        complete=complete is not None,
        failed_final=failed is not None and complete is None,
        finished_at=finished_at,
        failure_reason=str(failed.get("reason", "")) if failed else "",
        failure_message=str(failed.get("message", "")) if failed else "",
        deleting=bool(meta.get("deletionTimestamp")),
        raw=dict(obj),
    )


@dataclass(frozen=True)
class Termination:
    """How one container of a Job's pod ended."""

    pod: str
    container: str
    exit_code: int
    reason: str
    message: str
    finished_at: str


def terminations(pods: Sequence[Mapping[str, Any]], container: str | None = None) -> list[Termination]:
    """Every terminated container of ``pods`` (optionally only ``container``), oldest first."""
    found = []
    for pod in pods:
        name = pod.get("metadata", {}).get("name", "")
        for status in (pod.get("status") or {}).get("containerStatuses") or []:
            if container is not None and status.get("name") != container:
                continue
            for state in (status.get("state") or {}, status.get("lastState") or {}):
                term = state.get("terminated")
                if term:
                    found.append(
                        Termination(
                            pod=name,
                            container=str(status.get("name", "")),
                            exit_code=int(term.get("exitCode", 0)),
                            reason=str(term.get("reason", "")),
                            message=str(term.get("message", "")).strip(),
                            finished_at=str(term.get("finishedAt") or ""),
                        )
                    )
    return sorted(found, key=lambda t: (t.finished_at, t.pod))


def failure_message(job: JobSnapshot, pods: Sequence[Mapping[str, Any]], container: str) -> str:
    """The newest failed container's termination message, else the Job's own Failed message."""
    failures = [t for t in terminations(pods, container) if t.exit_code != 0]
    if failures:
        last = failures[-1]
        text = last.message or f"exited with code {last.exit_code} ({last.reason or 'no reason given'})"
        return f"pod {last.pod}: {text}"
    detail = job.failure_message or "the Job failed"
    return f"{job.failure_reason}: {detail}" if job.failure_reason else detail


def success_message(pods: Sequence[Mapping[str, Any]], container: str) -> str | None:
    """The newest successful container's termination message (what the container wrote there)."""
    done = [t for t in terminations(pods, container) if t.exit_code == 0 and t.message]
    return done[-1].message if done else None


@dataclass(frozen=True)
class AdapterObserved:
    basemodel: Obj | None = None
    convert_jobs: tuple[Obj, ...] = ()
    convert_pods: tuple[Obj, ...] = ()
    """Pods of this Adapter's finished convert Jobs."""
    # mode: merged only
    basemodels: tuple[Obj, ...] = ()
    merged_adapters: tuple[Obj, ...] = ()
    build_jobs: tuple[Obj, ...] = ()
    plan_configmaps: tuple[Obj, ...] = ()
    engine_records: tuple[Obj, ...] = ()
    build_pods: tuple[Obj, ...] = ()
    deployment: Obj | None = None
    """The ``<adapter>-merged`` Deployment (mode dynamic: one left from a switch away from merged)."""
    # QLoRA adapters (training.baseQuantization) only; also basemodels and the build objects above
    qlora_adapters: tuple[Obj, ...] = ()
    """The namespace's Adapters with training.baseQuantization (who shares which base variant)."""
    variant_deployments: tuple[Obj, ...] = ()
    """The namespace's base-variant Deployments (label ``trtfleet.io/role=variant``)."""


def status_patch(old: Mapping[str, Any], new: Mapping[str, Any], keys: Sequence[str]) -> Obj:
    """The JSON merge patch turning ``old`` into ``new`` over ``keys`` (others left alone); {} if equal."""
    patch: Obj = {}
    for key in keys:
        if key in new and new[key] != old.get(key):
            patch[key] = new[key]
        elif key not in new and old.get(key) is not None:
            patch[key] = None
    return patch
