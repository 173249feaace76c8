"""The I/O shell around the pure reconcilers: observe, reconcile, act.

Each reconcile reads the object fresh from the API server (never kopf's possibly stale body), gathers
the objects the pure reconciler needs, and carries out its :class:`Reconciliation` in a fixed order:
server-side applies, owner hand-overs (resourceVersion-guarded), the status patch (only the fields that
changed; for a newly allocated task id, guarded by the Adapter's resourceVersion), events, deletions.
Reconciles of one object never overlap in this process (one lock per object); child events (Jobs,
Deployments) and requeues go through :meth:`OperatorRuntime.trigger`, which coalesces them.

The runtime reaches the API server through :class:`KubeVerbs` (implemented by
:class:`trtfleet_operator.kube.KubeClient`) and the task-id counter through
:class:`trtfleet_operator.taskids.TaskIdStore`; the composition root (:mod:`.main`) wires both.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from datetime import UTC, datetime
from typing import Any, Protocol

from trtfleet.api import API_VERSION, AdapterMode, chosen_mode, effective_mode
from trtfleet_operator import metrics
from trtfleet_operator.builders.inferencepool import INFERENCE_POOL_API_VERSION, INFERENCE_POOL_PLURAL
from trtfleet_operator.config import OperatorConfig
from trtfleet_operator.errors import ConflictError, KubeError
from trtfleet_operator.kube import collection_path, object_path
from trtfleet_operator.names import (
    ANNOTATION_UNUSED_SINCE,
    COMPONENT_ADAPTER_CONVERT,
    COMPONENT_BUILD_PLAN,
    COMPONENT_ENGINE_BUILD,
    COMPONENT_ENGINE_RECORD,
    LABEL_ADAPTER,
    LABEL_COMPONENT,
    LABEL_JOB_NAME,
    LABEL_MANAGED_BY,
    LABEL_ROLE,
    MANAGED_BY,
    ROLE_VARIANT,
    collect_job_name,
    label_value,
    merged_serving_name,
    serving_name,
)
from trtfleet_operator.reconcile.adapter import reconcile_adapter
from trtfleet_operator.reconcile.basemodel import (
    STATUS_KEYS as BASEMODEL_STATUS_KEYS,
)
from trtfleet_operator.reconcile.basemodel import (
    BaseModelObserved,
    deletion_blocked,
    reconcile_basemodel,
)
from trtfleet_operator.reconcile.collect import (
    ArtifactCollection,
    RecordCollection,
    collect_adapter_artifact,
    collect_engine,
    used_hashes,
)
from trtfleet_operator.reconcile.engine import rfc3339
from trtfleet_operator.reconcile.inferencepool import PoolObserved
from trtfleet_operator.reconcile.types import (
    AdapterObserved,
    Obj,
    Reconciliation,
    job_snapshot,
    status_patch,
)
from trtfleet_operator.taskids import TaskIdAllocator, TaskIdStore

logger = logging.getLogger(__name__)

ADAPTER_STATUS_KEYS = (
    "phase",
    "observedGeneration",
    "conditions",
    "taskId",
    "sourceKey",
    "servedName",
    "artifact",
    "baseVariant",
)
Key = tuple[str, str, str]
"""(kind, namespace, name)"""


def _served_mode(adapter: Obj) -> AdapterMode:
    """``spec.mode``, or for ``auto`` the merge advice's choice (an unknown mode: dynamic, which the
    reconciler then reports as an invalid spec)."""
    try:
        mode = AdapterMode((adapter.get("spec") or {}).get("mode") or AdapterMode.DYNAMIC.value)
    except ValueError:
        return AdapterMode.DYNAMIC
    return effective_mode(mode, chosen_mode(adapter.get("status")))


def _selector(**labels: str) -> str:
    return ",".join(f"{k}={v}" for k, v in labels.items())


def _utcnow() -> datetime:
    return datetime.now(UTC)


class KubeVerbs(Protocol):
    """The API verbs the runtime uses, on paths from :func:`.kube.object_path` / :func:`.kube.collection_path`;
    failures are :class:`trtfleet_operator.errors.KubeError`."""

    async def get(self, path: str) -> Obj | None:
        """The object, or None when it does not exist."""
        ...

    async def serves(self, api_version: str, plural: str) -> bool:
        """Whether the API server's discovery lists ``plural`` under ``api_version`` (a CRD may be missing)."""
        ...

    async def apply(self, obj: Mapping[str, Any]) -> Obj:
        """Server-side apply under the operator's field manager, taking over conflicting fields."""
        ...

    async def patch_merge(self, path: str, patch: Mapping[str, Any], *, status: bool = False) -> Obj:
        """JSON merge patch of the object (``status``: of its status subresource); a patch carrying
        ``metadata.resourceVersion`` raises ConflictError when the object changed since."""
        ...

    async def delete(self, path: str, *, uid: str | None = None, propagation: str = "Background") -> bool:
        """Delete (only the object with ``uid``, when given); False when it was already gone."""
        ...

    async def event(self, involved: Mapping[str, Any], *, type_: str, reason: str, message: str, now: str) -> None:
        """Record a core/v1 Event about ``involved``."""
        ...

    async def list(self, path: str, *, label_selector: str | None = None) -> list[Obj]:
        """The items of a collection, each with ``apiVersion`` and ``kind``."""
        ...


class OperatorRuntime:
    """Observe, reconcile (pure), act, for BaseModels and Adapters; one lock per object."""

    def __init__(
        self,
        config: OperatorConfig,
        client: KubeVerbs,
        task_ids: TaskIdStore,
        *,
        clock: Callable[[], datetime] = _utcnow,
    ) -> None:
        self.config = config
        self.client = client
        self.clock = clock
        self.allocator = TaskIdAllocator(
            task_ids,
            on_allocated=metrics.TASKIDS_ALLOCATED.inc,
            on_conflict=metrics.TASKID_CONFLICTS.inc,
        )
        self._locks: dict[Key, asyncio.Lock] = {}
        self._pending: set[Key] = set()
        self._tasks: set[asyncio.Task[None]] = set()
        self._max_task_id: dict[tuple[str, str], int] = {}
        self._reserved: dict[tuple[str, str], int] = {}
        """Ids taken for (Adapter uid, source key) whose status write has not succeeded yet: a retry
        reuses the id instead of burning another (a crash still burns it; ids are never reused)."""

    # ------------------------------------------------------------------ scheduling
    def lock(self, key: Key) -> asyncio.Lock:
        return self._locks.setdefault(key, asyncio.Lock())

    def trigger(self, kind: str, namespace: str, name: str, delay_s: float = 0.0) -> None:
        """Reconcile ``kind/namespace/name`` soon; triggers arriving before it starts are merged."""
        key = (kind, namespace, name)
        if delay_s > 0:
            asyncio.get_running_loop().call_later(delay_s, self.trigger, kind, namespace, name)
            return
        if key in self._pending:
            return
        self._pending.add(key)
        task = asyncio.create_task(self._run_triggered(key))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _run_triggered(self, key: Key) -> None:
        kind, namespace, name = key
        run: Callable[[str, str], Awaitable[object]] = (
            self.reconcile_basemodel if kind == "BaseModel" else self.reconcile_adapter
        )
        async with self.lock(key):
            self._pending.discard(key)
            try:
                await run(namespace, name)
            except KubeError as exc:  # the next trigger or the resync timer retries
                logger.warning("triggered reconcile failed", extra={"object": "/".join(key), "error": str(exc)})

    async def close(self) -> None:
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)

    # ------------------------------------------------------------------ reconciles
    async def reconcile_basemodel(self, namespace: str, name: str) -> Reconciliation | None:
        started = time.monotonic()
        try:
            obj = await self.client.get(object_path(API_VERSION, "BaseModel", namespace, name))
            if obj is None or obj["metadata"].get("deletionTimestamp"):
                return None
            observed = await self._observe_basemodel(namespace, name)
            result = reconcile_basemodel(obj, observed, self.config, self.clock())
            await self.act(obj, result, BASEMODEL_STATUS_KEYS)
            return result
        finally:
            metrics.RECONCILE_DURATION.labels("BaseModel").observe(time.monotonic() - started)

    async def _observe_basemodel(self, namespace: str, name: str) -> BaseModelObserved:
        builds, deployment, pool = await asyncio.gather(
            self._observe_builds(namespace),
            self.client.get(object_path("apps/v1", "Deployment", namespace, serving_name(name))),
            self._observe_pool(namespace),
        )
        return BaseModelObserved(
            basemodels=builds.basemodels,
            build_jobs=builds.build_jobs,
            plan_configmaps=builds.plan_configmaps,
            engine_records=builds.engine_records,
            build_pods=builds.build_pods,
            deployment=deployment,
            inference_pool=pool,
        )

    async def _observe_pool(self, namespace: str) -> PoolObserved | None:
        """With InferencePools on: whether the cluster serves them (asked each time: a CRD installed later is
        picked up by the next reconcile) and the picker Service of ``namespace``."""
        picker = self.config.inference_pool
        if picker is None:
            return None
        served, service = await asyncio.gather(
            self.client.serves(INFERENCE_POOL_API_VERSION, INFERENCE_POOL_PLURAL),
            self.client.get(object_path("v1", "Service", namespace, picker.picker_service)),
        )
        return PoolObserved(crd_served=served, picker_service=service)

    async def _observe_builds(self, namespace: str) -> BaseModelObserved:
        """The namespace's BaseModels and engine-build objects (no Deployment)."""
        client = self.client
        basemodels, jobs, configmaps = await asyncio.gather(
            client.list(collection_path(API_VERSION, "BaseModel", namespace)),
            client.list(
                collection_path("batch/v1", "Job", namespace),
                label_selector=_selector(**{LABEL_COMPONENT: COMPONENT_ENGINE_BUILD}),
            ),
            client.list(
                collection_path("v1", "ConfigMap", namespace),
                label_selector=f"{LABEL_COMPONENT} in ({COMPONENT_BUILD_PLAN},{COMPONENT_ENGINE_RECORD}),"
                f"{LABEL_MANAGED_BY}={MANAGED_BY}",
            ),
        )
        pods = await self._pods_of(namespace, [j for j in jobs if job_snapshot(j).failed_final])
        return BaseModelObserved(
            basemodels=tuple(basemodels),
            build_jobs=tuple(jobs),
            plan_configmaps=tuple(c for c in configmaps if _component(c) == COMPONENT_BUILD_PLAN),
            engine_records=tuple(c for c in configmaps if _component(c) == COMPONENT_ENGINE_RECORD),
            build_pods=tuple(pods),
        )

    async def _pods_of(self, namespace: str, jobs: Sequence[Obj]) -> list[Obj]:
        names = sorted({j["metadata"]["name"] for j in jobs})
        if not names:
            return []
        selector = f"{LABEL_JOB_NAME} in ({','.join(names)})"
        return await self.client.list(collection_path("v1", "Pod", namespace), label_selector=selector)

    async def reconcile_adapter(self, namespace: str, name: str) -> Reconciliation | None:
        started = time.monotonic()
        try:
            obj = await self.client.get(object_path(API_VERSION, "Adapter", namespace, name))
            if obj is None or obj["metadata"].get("deletionTimestamp"):
                return None
            observed = await self._observe_adapter(obj)
            result = reconcile_adapter(obj, observed, self.config, self.clock())
            base = str(obj["spec"]["baseModel"])
            self._note_task_id(namespace, base, obj)
            if result.needs_task_id:
                uid = str(obj["metadata"]["uid"])
                reservation = (uid, str(result.status.get("sourceKey")))
                task_id = self._reserved.get(reservation)
                if task_id is None:
                    floor = self._max_task_id.get((namespace, base), 0)
                    task_id = await self.allocator.allocate(namespace, base, floor=floor)
                    self._max_task_id[(namespace, base)] = max(floor, task_id)
                    self._reserved[reservation] = task_id
                result = reconcile_adapter(obj, observed, self.config, self.clock(), task_id=task_id)
                await self.act(obj, result, ADAPTER_STATUS_KEYS, guard_status=True)
                self._reserved.pop(reservation, None)
                logger.info(
                    "task id assigned", extra={"adapter": f"{namespace}/{name}", "uid": uid, "task_id": task_id}
                )
            else:
                await self.act(obj, result, ADAPTER_STATUS_KEYS)
            return result
        finally:
            metrics.RECONCILE_DURATION.labels("Adapter").observe(time.monotonic() - started)

    def _note_task_id(self, namespace: str, base: str, obj: Obj) -> None:
        task_id = (obj.get("status") or {}).get("taskId")
        if isinstance(task_id, int):
            key = (namespace, base)
            self._max_task_id[key] = max(self._max_task_id.get(key, 0), task_id)

    async def _observe_adapter(self, obj: Obj) -> AdapterObserved:
        client = self.client
        meta, spec = obj["metadata"], obj["spec"]
        namespace, name = meta["namespace"], meta["name"]
        base, jobs = await asyncio.gather(
            client.get(object_path(API_VERSION, "BaseModel", namespace, str(spec["baseModel"]))),
            client.list(
                collection_path("batch/v1", "Job", namespace),
                label_selector=_selector(
                    **{LABEL_COMPONENT: COMPONENT_ADAPTER_CONVERT, LABEL_ADAPTER: label_value(name)}
                ),
            ),
        )
        pods = await self._pods_of(namespace, [j for j in jobs if job_snapshot(j).finished])
        if (spec.get("training") or {}).get("baseQuantization"):
            return await self._observe_qlora(base, tuple(jobs), tuple(pods), namespace, name)
        if _served_mode(obj) is not AdapterMode.MERGED:
            # a Deployment of the Adapter's merged days, removed once it is served hot-swapped again
            leftover = await client.get(object_path("apps/v1", "Deployment", namespace, merged_serving_name(name)))
            return AdapterObserved(
                basemodel=base, convert_jobs=tuple(jobs), convert_pods=tuple(pods), deployment=leftover
            )
        merged, adapters, deployment = await asyncio.gather(
            self._observe_builds(namespace),
            client.list(collection_path(API_VERSION, "Adapter", namespace)),
            client.get(object_path("apps/v1", "Deployment", namespace, merged_serving_name(name))),
        )
        return AdapterObserved(
            basemodel=base,
            convert_jobs=tuple(jobs),
            convert_pods=tuple(pods),
            basemodels=merged.basemodels,
            merged_adapters=tuple(a for a in adapters if _served_mode(a) is AdapterMode.MERGED),
            build_jobs=merged.build_jobs,
            plan_configmaps=merged.plan_configmaps,
            engine_records=merged.engine_records,
            build_pods=merged.build_pods,
            deployment=deployment,
        )

    async def _observe_qlora(
        self, base: Obj | None, jobs: tuple[Obj, ...], pods: tuple[Obj, ...], namespace: str, name: str
    ) -> AdapterObserved:
        """A QLoRA Adapter: its dynamic objects plus who shares which base variant and the variants' builds
        and Deployments."""
        client = self.client
        builds, adapters, variants, leftover = await asyncio.gather(
            self._observe_builds(namespace),
            client.list(collection_path(API_VERSION, "Adapter", namespace)),
            client.list(collection_path("apps/v1", "Deployment", namespace),
                        label_selector=_selector(**{LABEL_ROLE: ROLE_VARIANT})),
            client.get(object_path("apps/v1", "Deployment", namespace, merged_serving_name(name))),
        )
        return AdapterObserved(
            basemodel=base,
            convert_jobs=jobs,
            convert_pods=pods,
            basemodels=builds.basemodels,
            build_jobs=builds.build_jobs,
            plan_configmaps=builds.plan_configmaps,
            engine_records=builds.engine_records,
            build_pods=builds.build_pods,
            deployment=leftover,
            qlora_adapters=tuple(a for a in adapters if ((a.get("spec") or {}).get("training") or {}).get(
                "baseQuantization")),
            variant_deployments=tuple(variants),
        )

    async def adapters_of(self, namespace: str, basemodel: str) -> list[Obj]:
        adapters = await self.client.list(collection_path(API_VERSION, "Adapter", namespace))
        return [a for a in adapters if (a.get("spec") or {}).get("baseModel") == basemodel]

    async def blocked_deletion(self, namespace: str, name: str) -> list[str]:
        """Names of the Adapters that still block deleting BaseModel ``name`` (status says so)."""
        remaining = sorted(a["metadata"]["name"] for a in await self.adapters_of(namespace, name))
        if remaining:
            obj = await self.client.get(object_path(API_VERSION, "BaseModel", namespace, name))
            if obj is not None:
                await self.act(obj, deletion_blocked(obj, remaining, self.clock()), BASEMODEL_STATUS_KEYS)
        return remaining

    # ------------------------------------------------------------------ collection
    async def collect_adapter(self, namespace: str, name: str) -> ArtifactCollection | None:
        """One step of removing a deleted Adapter's artifact (:mod:`.reconcile.collect`); None: it is gone."""
        client = self.client
        obj = await client.get(object_path(API_VERSION, "Adapter", namespace, name))
        if obj is None:
            return None
        uri = str(((obj.get("status") or {}).get("artifact") or {}).get("uri") or "")
        others, job = await asyncio.gather(
            client.list(collection_path(API_VERSION, "Adapter", namespace)),
            client.get(object_path("batch/v1", "Job", namespace, collect_job_name(uri))) if uri else _none(),
        )
        step = collect_adapter_artifact(obj, others, job, now=self.clock(), config=self.config)
        if step.create is not None:
            await client.apply(step.create)
            metrics.APPLIES.labels("Job").inc()
        if step.done:
            metrics.COLLECTIONS.labels("adapter", "left" if step.warning else "done").inc()
            try:
                await client.event(obj, type_="Warning" if step.warning else "Normal", reason="ArtifactCollected"
                                   if not step.warning else "ArtifactLeft", message=step.message,
                                   now=rfc3339(self.clock()))
            except KubeError as exc:
                logger.info("event not recorded", extra={"reason": "ArtifactCollected", "error": str(exc)})
        return step

    async def collect_engine_record(self, namespace: str, name: str) -> RecordCollection | None:
        """One look at an engine record: mark, unmark, or delete it and collect its directory."""
        client = self.client
        record = await client.get(object_path("v1", "ConfigMap", namespace, name))
        if record is None or record["metadata"].get("deletionTimestamp"):
            return None
        managed = _selector(**{LABEL_MANAGED_BY: MANAGED_BY})
        basemodels, deployments, jobs = await asyncio.gather(
            client.list(collection_path(API_VERSION, "BaseModel", namespace)),
            client.list(collection_path("apps/v1", "Deployment", namespace), label_selector=managed),
            client.list(collection_path("batch/v1", "Job", namespace),
                        label_selector=_selector(**{LABEL_COMPONENT: COMPONENT_ENGINE_BUILD})),
        )
        step = collect_engine(record, used_hashes(basemodels, deployments, jobs), now=self.clock(),
                              config=self.config)
        path = object_path("v1", "ConfigMap", namespace, name)
        if step.mark is not None or step.clear:
            await client.patch_merge(path, {"metadata": {"annotations": {ANNOTATION_UNUSED_SINCE: step.mark}}})
        if step.delete:
            await client.delete(path, uid=record["metadata"].get("uid"))
            if step.create is not None:
                await client.apply(step.create)
            metrics.COLLECTIONS.labels("engine", "done").inc()
            logger.info("engine collected", extra={"record": f"{namespace}/{name}"})
        return step

    async def sweep_engines(self, namespaces: Sequence[str]) -> None:
        """Every ``collect_interval_s``: each engine record of ``namespaces`` (empty: every namespace) looked at
        once (:meth:`collect_engine_record`); a failure is logged and the next round tries again."""
        selector = _selector(**{LABEL_COMPONENT: COMPONENT_ENGINE_RECORD, LABEL_MANAGED_BY: MANAGED_BY})
        while True:
            await asyncio.sleep(self.config.collect_interval_s)
            try:
                targets = list(namespaces) or [
                    n["metadata"]["name"] for n in await self.client.list("/api/v1/namespaces")
                ]
                for namespace in targets:
                    records = await self.client.list(collection_path("v1", "ConfigMap", namespace),
                                                     label_selector=selector)
                    for record in records:
                        await self.collect_engine_record(namespace, record["metadata"]["name"])
            except KubeError as exc:
                logger.warning("engine retention sweep failed", extra={"error": str(exc)})

    # ------------------------------------------------------------------ acting
    async def act(self, obj: Obj, result: Reconciliation, keys: Sequence[str], *, guard_status: bool = False) -> None:
        """Carry out ``result`` for ``obj`` in this order: applies, owner hand-overs, the status patch (the
        ``keys`` that changed; ``guard_status``: only if ``obj``'s resourceVersion is still current), events,
        deletions, counters, the requeue.

        A failed apply, hand-over or deletion does not stop the others: the first one is raised at the end. A
        hand-over that lost to a concurrent write triggers another reconcile instead, one whose object is gone
        is let go, and so is an event that could not be recorded. A failed status patch is raised at once: no
        events or deletions follow a status that was not written."""
        client = self.client
        meta = obj["metadata"]
        errors: list[KubeError] = []
        for desired in result.apply:
            try:
                await client.apply(desired)
                metrics.APPLIES.labels(desired["kind"]).inc()
            except KubeError as exc:
                logger.warning(
                    "apply failed",
                    extra={"object": f"{desired['kind']}/{desired['metadata']['name']}", "error": str(exc)},
                )
                errors.append(exc)
        for handover in result.set_owners:
            ref = handover.ref
            patch = {
                "metadata": {
                    "ownerReferences": list(handover.owners),
                    "resourceVersion": handover.resource_version,
                }
            }
            try:
                await client.patch_merge(object_path(ref.api_version, ref.kind, ref.namespace, ref.name), patch)
            except ConflictError:
                self.trigger(obj["kind"], meta["namespace"], meta["name"])
            except KubeError as exc:
                if exc.status != 404:
                    errors.append(exc)
        patch = status_patch(obj.get("status") or {}, result.status, keys)
        if patch:
            body: dict[str, Any] = {"status": patch}
            if guard_status:
                body["metadata"] = {"resourceVersion": meta["resourceVersion"]}
            await client.patch_merge(
                object_path(obj["apiVersion"], obj["kind"], meta["namespace"], meta["name"]),
                body,
                status=True,
            )
        now = rfc3339(self.clock())
        for event in result.events:
            try:
                await client.event(obj, type_=event.type, reason=event.reason, message=event.message, now=now)
            except KubeError as exc:
                logger.info("event not recorded", extra={"reason": event.reason, "error": str(exc)})
        for ref in result.delete:
            try:
                await client.delete(object_path(ref.api_version, ref.kind, ref.namespace, ref.name), uid=ref.uid)
            except KubeError as exc:
                errors.append(exc)
        for counter in result.counters:
            metrics.BUILDS.labels(metrics.BUILD_COUNTER_RESULTS[counter]).inc()
        if result.requeue_after_s is not None:
            self.trigger(obj["kind"], meta["namespace"], meta["name"], delay_s=result.requeue_after_s)
        if errors:
            raise errors[0]


async def _none() -> None:
    return None


def _component(obj: Obj) -> str:
    return str((obj["metadata"].get("labels") or {}).get(LABEL_COMPONENT, ""))
