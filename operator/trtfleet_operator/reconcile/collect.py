"""What may be removed from the engine and adapter volumes, and when (pure).

* **A deleted Adapter's artifact** (behind kopf's finalizer on Adapters): the routers stop serving an Adapter as
  soon as its deletion starts (they skip objects with a ``deletionTimestamp``); requests already at a pod get
  ``artifact_drain_s`` to finish; then, unless another Adapter of the namespace uses the same artifact (same
  ``status.artifact.uri``, or the same source still converting), a collect Job removes its directory. The
  Adapter goes when that Job has ended (a failed Job leaves the directory and says so in an Event).
* **An engine or staged checkpoint** (its record ConfigMap, on a timer): a hash no BaseModel status, serving
  Deployment or build/prepare Job of the namespace names is marked ``trtfleet.io/unused-since``; used again, the
  mark goes; unused for ``engine_retention_s`` the record is deleted first (so a new user builds again rather
  than trusting a directory being removed) and a collect Job removes the directory.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from urllib.parse import urlparse

from trtfleet.api import API_VERSION
from trtfleet_operator.builders.collect import build_collect_job
from trtfleet_operator.config import OperatorConfig
from trtfleet_operator.names import (
    ANNOTATION_ENGINE_HASH,
    ANNOTATION_UNUSED_SINCE,
    collect_job_name,
    owner_reference,
)
from trtfleet_operator.reconcile.types import Obj, job_snapshot

COLLECT_POLL_S = 5.0
"""How often a deletion waiting on its collect Job looks again."""


@dataclass(frozen=True)
class ArtifactCollection:
    """Where deleting one Adapter stands: ``done`` lets it go; else create ``create`` and look again later."""

    done: bool
    message: str
    create: Obj | None = None
    retry_after_s: float = COLLECT_POLL_S
    warning: bool = False


def volume_path(uri: str) -> tuple[str, str] | None:
    """``pvc://claim/a/b`` -> ``("claim", "a/b")``; None for any other URI (not on a volume of the operator's)."""
    parsed = urlparse(uri)
    path = parsed.path.strip("/")
    return (parsed.netloc, path) if parsed.scheme == "pvc" and parsed.netloc and path else None


def _parse(stamp: str | None) -> datetime | None:
    try:
        return datetime.fromisoformat(str(stamp).replace("Z", "+00:00")) if stamp else None
    except ValueError:
        return None


def collect_adapter_artifact(
    adapter: Obj, others: Sequence[Obj], job: Obj | None, *, now: datetime, config: OperatorConfig
) -> ArtifactCollection:
    """The next step of deleting ``adapter`` (``others``: the namespace's Adapters; ``job``: its collect Job)."""
    meta, status = adapter["metadata"], adapter.get("status") or {}
    uri = str((status.get("artifact") or {}).get("uri") or "")
    location = volume_path(uri)
    if location is None:
        return ArtifactCollection(True, "no artifact on the adapter volume to remove")
    source_key = status.get("sourceKey")
    users = sorted(
        o["metadata"]["name"] for o in others
        if o["metadata"].get("uid") != meta.get("uid") and not o["metadata"].get("deletionTimestamp")
        and (((o.get("status") or {}).get("artifact") or {}).get("uri") == uri
             or (source_key and (o.get("status") or {}).get("sourceKey") == source_key))
    )
    if users:
        return ArtifactCollection(True, f"artifact {uri} kept: Adapter(s) {', '.join(users[:5])} use it")
    deleted_at = _parse(meta.get("deletionTimestamp")) or now
    drain_left = (deleted_at + timedelta(seconds=config.artifact_drain_s) - now).total_seconds()
    if drain_left > 0:
        return ArtifactCollection(False, f"draining: requests already at pods get {drain_left:.0f}s more before "
                                  f"{uri} is removed", retry_after_s=drain_left)
    if job is None:
        claim, path = location
        create = build_collect_job(
            name=collect_job_name(uri), namespace=meta["namespace"], claim=claim, paths=[path], config=config,
            owners=[owner_reference("Adapter", API_VERSION, meta["name"], meta["uid"], controller=False)],
        )
        return ArtifactCollection(False, f"removing {uri} (Job {create['metadata']['name']})", create=create)
    snapshot = job_snapshot(job)
    if snapshot.complete:
        return ArtifactCollection(True, f"removed {uri}")
    if snapshot.failed_final:
        return ArtifactCollection(True, f"collect Job {snapshot.name} failed: {uri} is left on the volume",
                                  warning=True)
    return ArtifactCollection(False, f"collect Job {snapshot.name} removing {uri}")


def used_hashes(basemodels: Iterable[Obj], deployments: Iterable[Obj], jobs: Iterable[Obj]) -> set[str]:
    """Engine and checkpoint hashes some BaseModel's status, serving Deployment or build/prepare Job names."""
    used = {str(((b.get("status") or {}).get("engine") or {}).get("hash")) for b in basemodels}
    for obj in (*deployments, *jobs):
        value = (obj["metadata"].get("annotations") or {}).get(ANNOTATION_ENGINE_HASH)
        if value:
            used.add(str(value))
    used.discard("None")
    return used


@dataclass(frozen=True)
class RecordCollection:
    """What to do with one engine record: mark it unused, clear the mark, or delete it and collect its files."""

    mark: str | None = None
    clear: bool = False
    delete: bool = False
    create: Obj | None = None


def _directory(path: str) -> str:
    """The directory of an engine (``<hash>``) or a staged checkpoint (``checkpoints/<hash>``) in the volume."""
    parts = path.split("/")
    return "/".join(parts[:2]) if parts[0] == "checkpoints" and len(parts) > 1 else parts[0]


def collect_engine(record: Obj, used: set[str], *, now: datetime, config: OperatorConfig) -> RecordCollection:
    """The next step for one engine record (see the module docstring); nothing when retention is off."""
    meta, data = record["metadata"], record.get("data") or {}
    marked = (meta.get("annotations") or {}).get(ANNOTATION_UNUSED_SINCE)
    if config.engine_retention_s <= 0:
        return RecordCollection()
    if str(data.get("hash")) in used:
        return RecordCollection(clear=marked is not None)
    since = _parse(marked)
    if since is None:
        return RecordCollection(mark=now.strftime("%Y-%m-%dT%H:%M:%SZ"))
    if (now - since).total_seconds() < config.engine_retention_s:
        return RecordCollection()
    location = volume_path(str(data.get("uri") or ""))
    if location is None:
        return RecordCollection(delete=True)
    claim, path = location
    create = build_collect_job(name=collect_job_name(f"{claim}/{_directory(path)}"), namespace=meta["namespace"],
                               claim=claim, paths=[_directory(path)], config=config, as_root=True)
    return RecordCollection(delete=True, create=create)
