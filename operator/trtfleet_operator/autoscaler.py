"""The I/O shell of autoscaling: scrape the signals, decide (:mod:`.reconcile.autoscale`), write the result.

:class:`ScrapeSignals` is the real :class:`SignalSource`: it reads every router replica's ``/metrics``
(the pods matching ``--router-selector``, or the fixed ``--router-metrics-url`` list), all at once with one
timeout, and counts the base model's ready serving pods from the API server. The serving pods' own load
comes through the routers, which scrape them anyway (:mod:`.signals` says why the operator does not). A
router that does not answer is left out of this round; with none answering there are no signals and the
decision keeps the size.

:meth:`Autoscaler.tick` runs on a kopf timer under the BaseModel's reconcile lock: it reads the object
fresh, decides, writes ``spec.serving.replicas`` (a merge patch guarded by the resourceVersion it read, so
a concurrent edit wins and the next tick decides again), then the status, then the events.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Protocol

import aiohttp

from trtfleet.api import API_VERSION
from trtfleet.autoscaling import DemandSignals
from trtfleet_operator import metrics
from trtfleet_operator.builders.serving import selector_labels
from trtfleet_operator.config import AutoscaleConfig
from trtfleet_operator.errors import ConflictError, KubeError
from trtfleet_operator.kube import KubeClient, collection_path, object_path
from trtfleet_operator.reconcile.autoscale import autoscale_basemodel
from trtfleet_operator.reconcile.deletioncost import DELETION_COST, deletion_cost_patches
from trtfleet_operator.reconcile.engine import rfc3339
from trtfleet_operator.reconcile.types import Obj
from trtfleet_operator.signals import MetricsParseError, RouterReading, combine, parse_router_metrics

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class Reading:
    signals: DemandSignals | None
    sources: int
    ready_since_s: tuple[float, ...] = ()
    """When each ready serving pod turned ready (epoch s): the cold start in status."""
    pods: tuple[Obj, ...] = ()
    """The serving pods (for their deletion cost on a scale-down)."""
    pod_warm_demand: Mapping[str, float] = field(default_factory=dict)
    """Per pod name, the demand its warm adapters carry, summed over router replicas."""


class SignalSource(Protocol):
    async def read(self, basemodel: Obj) -> Reading: ...


def _ready(pod: Obj) -> bool:
    conditions = (pod.get("status") or {}).get("conditions") or []
    return any(c.get("type") == "Ready" and c.get("status") == "True" for c in conditions)


def _ready_since_s(pod: Obj) -> float | None:
    """When a ready pod's Ready condition turned true (epoch s); None when it does not say."""
    for c in (pod.get("status") or {}).get("conditions") or []:
        if c.get("type") == "Ready" and c.get("status") == "True" and c.get("lastTransitionTime"):
            try:
                return datetime.fromisoformat(str(c["lastTransitionTime"]).replace("Z", "+00:00")).timestamp()
            except ValueError:
                return None
    return None


class ScrapeSignals:
    def __init__(self, client: KubeClient, config: AutoscaleConfig) -> None:
        self.client = client
        self.config = config

    async def _router_urls(self, namespace: str) -> list[str]:
        if self.config.router_metrics_urls:
            return list(self.config.router_metrics_urls)
        pods = await self.client.list(
            collection_path("v1", "Pod", self.config.router_namespace or namespace),
            label_selector=self.config.router_selector,
        )
        port = self.config.router_metrics_port
        return [f"http://{p['status']['podIP']}:{port}/metrics" for p in pods if _ready(p) and p["status"].get("podIP")]

    async def read(self, basemodel: Obj) -> Reading:
        meta = basemodel["metadata"]
        namespace, name = meta["namespace"], meta["name"]
        selector = ",".join(f"{k}={v}" for k, v in sorted(selector_labels(name).items()))
        router_urls, pods = await asyncio.gather(
            self._router_urls(namespace),
            self.client.list(collection_path("v1", "Pod", namespace), label_selector=selector),
        )
        ready = [p for p in pods if _ready(p)]
        timeout = aiohttp.ClientTimeout(total=self.config.scrape_timeout_s)
        async with aiohttp.ClientSession(timeout=timeout) as session:
            bodies = await asyncio.gather(*(self._get(session, url) for url in router_urls))
        routers: list[RouterReading] = []
        for body in bodies:
            if body is None:
                continue
            try:
                routers.append(parse_router_metrics(body, name))
            except MetricsParseError as exc:
                logger.info("unreadable metrics", extra={"basemodel": f"{namespace}/{name}", "error": str(exc)})
        since = tuple(t for t in (_ready_since_s(p) for p in ready) if t is not None)
        warm: dict[str, float] = {}
        for router in routers:
            for pod, demand in router.pod_warm_demand.items():
                warm[pod] = warm.get(pod, 0.0) + demand
        if not routers:
            return Reading(None, 0, since, tuple(pods), warm)
        return Reading(combine(routers, len(ready)), len(routers), since, tuple(pods), warm)

    @staticmethod
    async def _get(session: aiohttp.ClientSession, url: str) -> str | None:
        try:
            async with session.get(url) as response:
                response.raise_for_status()
                return await response.text()
        except (aiohttp.ClientError, TimeoutError) as exc:
            logger.debug("scrape failed", extra={"url": url, "error": str(exc)})
            return None


class Autoscaler:
    def __init__(self, client: KubeClient, source: SignalSource, clock: Callable[[], datetime]) -> None:
        self.client = client
        self.source = source
        self.clock = clock

    async def tick(self, namespace: str, name: str) -> int | None:
        """One decision for BaseModel ``namespace/name``; the replicas written (None: none)."""
        path = object_path(API_VERSION, "BaseModel", namespace, name)
        obj = await self.client.get(path)
        if obj is None or obj["metadata"].get("deletionTimestamp") or not (obj.get("spec") or {}).get("autoscaling"):
            return None
        reading = await self.source.read(obj)
        result = autoscale_basemodel(
            obj, reading.signals, self.clock(), sources=reading.sources, ready_since_s=reading.ready_since_s
        )
        if result is None:
            return None
        if result.replicas is not None and result.replicas < int(obj["spec"]["serving"].get("replicas") or 0):
            await self._set_deletion_costs(namespace, reading)
        if result.replicas is not None:
            patch = {
                "metadata": {"resourceVersion": obj["metadata"]["resourceVersion"]},
                "spec": {"serving": {"replicas": result.replicas}},
            }
            try:
                obj = await self.client.patch_merge(path, patch)
            except ConflictError:
                logger.info("scale skipped: the BaseModel changed", extra={"basemodel": f"{namespace}/{name}"})
                return None
            for event in result.events:
                metrics.SCALINGS.labels(event.reason).inc()
            logger.info(
                "scaled",
                extra={
                    "basemodel": f"{namespace}/{name}",
                    "replicas": result.replicas,
                    "why": [event.message for event in result.events],
                },
            )
        old = obj.get("status") or {}
        changed = {k: v for k, v in result.status.items() if old.get(k) != v}
        if changed:
            await self.client.patch_merge(path, {"status": changed}, status=True)
        now = rfc3339(self.clock())
        for event in result.events:
            await self.client.event(obj, type_=event.type, reason=event.reason, message=event.message, now=now)
        return result.replicas

    async def _set_deletion_costs(self, namespace: str, reading: Reading) -> None:
        """Least-valuable scale-down: the pod-deletion-cost of each serving pod (see ``deletioncost``)."""
        for pod, cost in deletion_cost_patches(reading.pods, reading.pod_warm_demand):
            try:
                await self.client.patch_merge(
                    object_path("v1", "Pod", namespace, pod), {"metadata": {"annotations": {DELETION_COST: cost}}}
                )
            except KubeError as exc:  # gone meanwhile, or refused: the Deployment picks by its other rules
                logger.info("deletion cost not set", extra={"pod": f"{namespace}/{pod}", "error": str(exc)})

