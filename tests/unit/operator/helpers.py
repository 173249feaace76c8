"""Objects as the API server returns them, for the operator's table tests (no mocks: plain data)."""

from __future__ import annotations

import copy
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import yaml

from trtfleet.api import API_VERSION

ROOT = Path(__file__).resolve().parents[3]
NOW = datetime(2026, 11, 21, 12, 0, 0, tzinfo=UTC)
NAMESPACE = "models"

Obj = dict[str, Any]


def example(name: str) -> Obj:
    return dict(yaml.safe_load((ROOT / "examples" / name).read_text()))


def deep_merge(base: Obj, override: Obj) -> Obj:
    out = copy.deepcopy(base)
    for key, value in override.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = deep_merge(out[key], value)
        else:
            out[key] = copy.deepcopy(value)
    return out


def stored(
    doc: Obj,
    *,
    name: str | None = None,
    uid: str | None = None,
    generation: int = 1,
    status: Obj | None = None,
    spec: Obj | None = None,
    deleting: bool = False,
) -> Obj:
    """``doc`` with the metadata the API server adds."""
    obj = copy.deepcopy(doc)
    meta = obj.setdefault("metadata", {})
    if name is not None:
        meta["name"] = name
    meta.update(
        {
            "namespace": NAMESPACE,
            "uid": uid or f"uid-{meta['name']}",
            "generation": generation,
            "resourceVersion": "100",
        }
    )
    if deleting:
        meta["deletionTimestamp"] = "2026-11-21T11:00:00Z"
    if spec:
        obj["spec"] = deep_merge(obj["spec"], spec)
    if status is not None:
        obj["status"] = status
    return obj


def llama(**kwargs: Any) -> Obj:
    return stored(example("basemodel-llama3-8b-tensorrtllm.yaml"), **kwargs)


def tiny(**kwargs: Any) -> Obj:
    return stored(example("basemodel-reference-tiny.yaml"), **kwargs)


def adapter(
    base: str = "llama3-8b", *, name: str = "sql", source: Obj | None = None, mode: str | None = None, **kwargs: Any
) -> Obj:
    spec: Obj = {"baseModel": base, "source": source or {"uri": "s3://adapters/sql", "revision": "3"}}
    if mode:
        spec["mode"] = mode
    return stored({"apiVersion": API_VERSION, "kind": "Adapter", "metadata": {"name": name}, "spec": spec}, **kwargs)


def as_created(obj: Obj, *, uid: str | None = None, rv: str = "1") -> Obj:
    """An applied object as the API server would store it (uid, resourceVersion, generation)."""
    out = copy.deepcopy(obj)
    meta = out["metadata"]
    meta.update({"uid": uid or f"uid-{meta['name']}", "resourceVersion": rv, "generation": 1})
    return out


def job_status(
    obj: Obj, state: str, *, at: str = "2026-11-21T11:00:00Z", message: str = "", reason: str = "BackoffLimitExceeded"
) -> Obj:
    """A Job with the status the Job controller writes: running, complete or failed."""
    out = as_created(obj)
    if state == "running":
        out["status"] = {"active": 1, "startTime": at}
    elif state == "complete":
        out["status"] = {
            "succeeded": 1,
            "startTime": at,
            "completionTime": at,
            "conditions": [
                {"type": "SuccessCriteriaMet", "status": "True", "lastTransitionTime": at},
                {"type": "Complete", "status": "True", "lastTransitionTime": at},
            ],
        }
    elif state == "failed":
        out["status"] = {
            "failed": 1,
            "startTime": at,
            "conditions": [
                {"type": "FailureTarget", "status": "True", "lastTransitionTime": at, "reason": reason},
                {
                    "type": "Failed",
                    "status": "True",
                    "lastTransitionTime": at,
                    "reason": reason,
                    "message": message or "Job has reached the specified backoff limit",
                },
            ],
        }
    else:
        raise ValueError(state)
    return out


def job_pod(
    job: Obj, container: str, *, exit_code: int, message: str = "", finished_at: str = "2026-11-21T11:00:00Z"
) -> Obj:
    """A finished pod of ``job`` whose ``container`` ended with ``exit_code`` and ``message``."""
    name = job["metadata"]["name"]
    terminated = {
        "exitCode": exit_code,
        "reason": "Completed" if exit_code == 0 else "Error",
        "finishedAt": finished_at,
        "startedAt": finished_at,
    }
    if message:
        terminated["message"] = message
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": f"{name}-abcde", "namespace": NAMESPACE, "labels": {"batch.kubernetes.io/job-name": name}},
        "status": {
            "phase": "Succeeded" if exit_code == 0 else "Failed",
            "containerStatuses": [{"name": container, "state": {"terminated": terminated}}],
        },
    }


def deployment_status(
    obj: Obj,
    *,
    ready: int,
    updated: int | None = None,
    total: int | None = None,
    generation: int = 1,
    progressing: str = "NewReplicaSetAvailable",
) -> Obj:
    out = as_created(obj)
    replicas = out["spec"]["replicas"]
    out["metadata"]["generation"] = generation
    out["status"] = {
        "observedGeneration": generation,
        "replicas": replicas if total is None else total,
        "updatedReplicas": replicas if updated is None else updated,
        "readyReplicas": ready,
        "conditions": [{"type": "Progressing", "status": "True", "reason": progressing}],
    }
    return out


def by_kind(objects: Any, kind: str) -> list[Obj]:
    return [o for o in objects if o["kind"] == kind]


def condition(status: Obj, type_: str) -> Obj:
    return next(c for c in status["conditions"] if c["type"] == type_)
