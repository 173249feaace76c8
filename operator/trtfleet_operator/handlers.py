"""kopf registration: thin handlers that call the runtime, and the one place errors become kopf's.

Per kind, one reconcile registered for create, update, resume and a resync timer; BaseModels with
``spec.autoscaling`` also get the autoscaler's timer (``--autoscale-interval``), under the same lock, and a
daemon that long-polls the routers for requests held at zero pods and decides at once on one
(:mod:`.holdwatch`), and every BaseModel the merge advice timer over its Adapters (``--merge-interval``).
Child events (the operator's Jobs and Deployments) trigger their owners' reconciles; a BaseModel's create
or update triggers its Adapters (so ``BaseModelNotFound`` or ``RankTooHigh`` heal at once). Deleting a BaseModel
runs :func:`delete_basemodel` behind kopf's finalizer, named ``trtfleet.io/adapters``: it holds the
deletion while Adapters point at the BaseModel. On Adapters the same finalizer holds a deletion until the
Adapter's artifact is collected (:mod:`.reconcile.collect`: drained, then removed by a collect Job unless
another Adapter uses it). Engines unused for ``--engine-retention`` are collected by
:meth:`OperatorRuntime.sweep_engines`, a loop of its own (a kopf timer on the records would put a finalizer on
ConfigMaps, which would then outlive an uninstalled operator).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any

import kopf

from trtfleet.api import GROUP, VERSION
from trtfleet.api.autoscaling import TARGET_REQUESTS_PER_POD_DEFAULT
from trtfleet_operator import metrics
from trtfleet_operator.autoscaler import Autoscaler
from trtfleet_operator.config import OperatorConfig
from trtfleet_operator.errors import (
    ConflictError,
    KubeError,
    KubeUnavailableError,
    OperatorError,
    TaskIdConflictError,
)
from trtfleet_operator.holdwatch import HoldWatch
from trtfleet_operator.mergeadvisor import MergeAdvisor
from trtfleet_operator.names import LABEL_MANAGED_BY, MANAGED_BY
from trtfleet_operator.runtime import OperatorRuntime

logger = logging.getLogger(__name__)

FINALIZER = "trtfleet.io/adapters"
DELETION_RECHECK_S = 5.0
CONFLICT_RETRY_S = 1.0
UNAVAILABLE_RETRY_S = 10.0
OWNER_KINDS = ("BaseModel", "Adapter")


def kopf_error(exc: OperatorError) -> kopf.TemporaryError | kopf.PermanentError:
    """How an operator error is retried by kopf (the only place this is decided)."""
    if isinstance(exc, ConflictError | TaskIdConflictError):
        return kopf.TemporaryError(str(exc), delay=CONFLICT_RETRY_S)
    if isinstance(exc, KubeUnavailableError) or (
        isinstance(exc, KubeError) and (exc.status >= 500 or exc.status == 429)
    ):
        return kopf.TemporaryError(str(exc), delay=UNAVAILABLE_RETRY_S)
    return kopf.PermanentError(str(exc))


async def _run(kind: str, reconcile: Callable[[str, str], Awaitable[object]], namespace: str, name: str) -> None:
    started = time.monotonic()
    result = "ok"
    try:
        await reconcile(namespace, name)
    except OperatorError as exc:
        error = kopf_error(exc)
        result = "temporary_error" if isinstance(error, kopf.TemporaryError) else "permanent_error"
        raise error from exc
    except Exception:
        result = "error"
        raise
    finally:
        metrics.RECONCILES.labels(kind, result).inc()
        logger.debug(
            "reconciled",
            extra={
                "kind": kind,
                "object": f"{namespace}/{name}",
                "seconds": round(time.monotonic() - started, 4),
            },
        )


def register(
    registry: kopf.OperatorRegistry,
    runtime: OperatorRuntime,
    config: OperatorConfig,
    autoscaler: Autoscaler,
    advisor: MergeAdvisor,
    watch: HoldWatch | None = None,
) -> None:
    basemodels = (GROUP, VERSION, "basemodels")
    adapters = (GROUP, VERSION, "adapters")
    managed = {LABEL_MANAGED_BY: MANAGED_BY}

    async def reconcile_basemodel(**kwargs: Any) -> None:
        namespace, name = kwargs["namespace"], kwargs["name"]
        async with runtime.lock(("BaseModel", namespace, name)):
            await _run("BaseModel", runtime.reconcile_basemodel, namespace, name)

    async def basemodel_changed(**kwargs: Any) -> None:
        await reconcile_basemodel(**kwargs)
        for adapter in await runtime.adapters_of(kwargs["namespace"], kwargs["name"]):
            runtime.trigger("Adapter", kwargs["namespace"], adapter["metadata"]["name"])

    async def reconcile_adapter(**kwargs: Any) -> None:
        namespace, name = kwargs["namespace"], kwargs["name"]
        async with runtime.lock(("Adapter", namespace, name)):
            await _run("Adapter", runtime.reconcile_adapter, namespace, name)

    async def delete_basemodel(**kwargs: Any) -> None:
        namespace, name = kwargs["namespace"], kwargs["name"]
        remaining = await runtime.blocked_deletion(namespace, name)
        if remaining:
            raise kopf.TemporaryError(
                f"{len(remaining)} Adapter(s) still use BaseModel {name}: {', '.join(remaining[:10])}",
                delay=DELETION_RECHECK_S,
            )

    async def child_event(**kwargs: Any) -> None:
        body: kopf.Body = kwargs["body"]
        for owner in body.metadata.get("ownerReferences") or []:
            if owner.get("kind") in OWNER_KINDS and str(owner.get("apiVersion", "")).startswith(f"{GROUP}/"):
                runtime.trigger(owner["kind"], kwargs["namespace"], owner["name"])

    kopf.on.create(*basemodels, registry=registry, id="reconcile")(basemodel_changed)
    kopf.on.update(*basemodels, registry=registry, id="reconcile")(basemodel_changed)
    kopf.on.resume(*basemodels, registry=registry, id="reconcile")(reconcile_basemodel)
    kopf.timer(
        *basemodels,
        registry=registry,
        id="resync",
        interval=config.resync_interval_s,
        initial_delay=config.resync_interval_s,
    )(reconcile_basemodel)
    kopf.on.delete(*basemodels, registry=registry, id="adapters")(delete_basemodel)

    async def autoscale(**kwargs: Any) -> None:
        namespace, name = kwargs["namespace"], kwargs["name"]
        async with runtime.lock(("BaseModel", namespace, name)):
            await _run("Autoscale", autoscaler.tick, namespace, name)

    kopf.timer(
        *basemodels,
        registry=registry,
        id="autoscale",
        interval=config.autoscale.interval_s,
        when=lambda spec, **_: bool(spec.get("autoscaling")),
    )(autoscale)

    async def watch_held(**kwargs: Any) -> None:
        namespace, name = kwargs["namespace"], kwargs["name"]
        assert watch is not None

        async def decide() -> None:
            try:
                await autoscale(namespace=namespace, name=name)
            except (kopf.TemporaryError, kopf.PermanentError) as exc:  # the timer decides again
                logger.info("held-request decision failed", extra={"object": f"{namespace}/{name}", "error": str(exc)})

        body = kwargs["body"]  # kopf keeps a daemon's body current

        def per_pod() -> float | None:
            scaling = (body.get("spec") or {}).get("autoscaling") or {}
            return float(scaling.get("targetRequestsPerPod", TARGET_REQUESTS_PER_POD_DEFAULT))

        await watch.run(namespace, name, decide, per_pod)

    if watch is not None:
        kopf.daemon(
            *basemodels,
            registry=registry,
            id="held-watch",
            cancellation_timeout=5.0,
            when=lambda spec, **_: bool(spec.get("autoscaling")),
        )(watch_held)

    async def advise(**kwargs: Any) -> None:
        await _run("MergeAdvice", advisor.tick, kwargs["namespace"], kwargs["name"])

    kopf.timer(
        *basemodels,
        registry=registry,
        id="merge-advice",
        interval=config.merge_advice.interval_s,
        initial_delay=config.merge_advice.interval_s,
    )(advise)

    kopf.on.create(*adapters, registry=registry, id="reconcile")(reconcile_adapter)
    kopf.on.update(*adapters, registry=registry, id="reconcile")(reconcile_adapter)
    kopf.on.resume(*adapters, registry=registry, id="reconcile")(reconcile_adapter)
    kopf.timer(
        *adapters,
        registry=registry,
        id="resync",
        interval=config.resync_interval_s,
        initial_delay=config.resync_interval_s,
    )(reconcile_adapter)

    async def delete_adapter(**kwargs: Any) -> None:
        namespace, name = kwargs["namespace"], kwargs["name"]
        step = await runtime.collect_adapter(namespace, name)
        if step is not None and not step.done:
            raise kopf.TemporaryError(step.message, delay=step.retry_after_s)

    if config.collect_artifacts:
        kopf.on.delete(*adapters, registry=registry, id="artifacts")(delete_adapter)

    kopf.on.event("batch", "v1", "jobs", labels=managed, registry=registry, id="owners")(child_event)
    kopf.on.event("apps", "v1", "deployments", labels=managed, registry=registry, id="owners")(child_event)
