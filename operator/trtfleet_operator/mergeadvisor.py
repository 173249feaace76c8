"""The I/O shell of merge advice: read the routers' demand views, advise (:mod:`.reconcile.merging`), write.

:class:`RouterDemand` is the real :class:`DemandSource`: ``GET /fleet/v1/demand`` on every ready router
pod's peer port (the pods matching ``--router-selector``, or the fixed ``--router-demand-url`` list), all
at once with the autoscaler's scrape timeout and the routers' bearer token (``--router-token-file``); a
router that does not answer, or answers something else, is left out of this round. No view at all: every
Adapter's ``MergeRecommended`` turns Unknown (``NoDemandSignal``), what the readings so far left is kept.

:meth:`MergeAdvisor.tick` runs on a kopf timer per BaseModel (``--merge-interval``): one read of the
views, one status patch per Adapter whose advice changed enough to be worth one (guarded by the
resourceVersion it read, so a concurrent reconcile wins and the next tick advises again), its events, and a
reconcile of every ``mode: auto`` Adapter it switched. It keeps each Adapter's smoothed rate between ticks
(the status is only its checkpoint), so skipping a write loses nothing.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Callable
from datetime import datetime
from typing import Any, Protocol

import aiohttp

from trtfleet.api import API_VERSION
from trtfleet.internalauth import TokenFile, authorized_get
from trtfleet.mergedecision import Memory
from trtfleet_operator import metrics
from trtfleet_operator.config import AutoscaleConfig, MergeAdviceConfig
from trtfleet_operator.errors import ConflictError
from trtfleet_operator.kube import KubeClient, collection_path, object_path
from trtfleet_operator.reconcile.engine import rfc3339
from trtfleet_operator.reconcile.merging import advise_basemodel, status_patch
from trtfleet_operator.reconcile.types import Obj

logger = logging.getLogger(__name__)

DEMAND_PATH = "/fleet/v1/demand"


class DemandSource(Protocol):
    async def read(self, namespace: str) -> list[dict[str, Any]]: ...


def _ready(pod: Obj) -> bool:
    conditions = (pod.get("status") or {}).get("conditions") or []
    return any(c.get("type") == "Ready" and c.get("status") == "True" for c in conditions)


async def router_peer_urls(
    client: KubeClient, routers: AutoscaleConfig, peers: MergeAdviceConfig, namespace: str
) -> list[str]:
    """Every ready router replica's peer port, ``http://host:port`` (the ``--router-demand-url`` list less
    its path, when given)."""
    if peers.router_demand_urls:
        return [url.removesuffix(DEMAND_PATH).rstrip("/") for url in peers.router_demand_urls]
    pods = await client.list(
        collection_path("v1", "Pod", routers.router_namespace or namespace), label_selector=routers.router_selector
    )
    ready = [p["status"]["podIP"] for p in pods if _ready(p) and p["status"].get("podIP")]
    return [f"http://{ip}:{peers.router_peer_port}" for ip in ready]


class RouterDemand:
    def __init__(
        self,
        client: KubeClient,
        routers: AutoscaleConfig,
        config: MergeAdviceConfig,
        *,
        tokens: TokenFile | None = None,
    ) -> None:
        self.client = client
        self.routers = routers
        self.config = config
        self.tokens = tokens

    async def _urls(self, namespace: str) -> list[str]:
        if self.config.router_demand_urls:
            return list(self.config.router_demand_urls)
        bases = await router_peer_urls(self.client, self.routers, self.config, namespace)
        return [base + DEMAND_PATH for base in bases]

    async def read(self, namespace: str) -> list[dict[str, Any]]:
        urls = await self._urls(namespace)
        timeout = aiohttp.ClientTimeout(total=self.routers.scrape_timeout_s)
        async with aiohttp.ClientSession(timeout=timeout) as session:
            bodies = await asyncio.gather(*(self._get(session, url) for url in urls))
        return [body for body in bodies if body is not None]

    async def _get(self, session: aiohttp.ClientSession, url: str) -> dict[str, Any] | None:
        try:
            async with authorized_get(session, url, self.tokens) as response:
                response.raise_for_status()
                body = json.loads(await response.text())
        except (aiohttp.ClientError, TimeoutError, ValueError) as exc:
            logger.debug("demand view not read", extra={"url": url, "error": str(exc)})
            return None
        if not isinstance(body, dict) or not isinstance(body.get("base_models"), dict):
            logger.info("not a demand view", extra={"url": url})
            return None
        return body


class MergeAdvisor:
    def __init__(
        self,
        client: KubeClient,
        source: DemandSource,
        clock: Callable[[], datetime],
        reconcile: Callable[[str, str, str], None],
    ) -> None:
        self.client = client
        self.source = source
        self.clock = clock
        self.reconcile = reconcile
        """``reconcile(kind, namespace, name)``: the runtime's trigger, for Adapters switched."""
        self.memories: dict[tuple[str, str], dict[str, Memory]] = {}
        """Per BaseModel (namespace, name): each Adapter's memory by uid, as the last tick left it."""

    async def tick(self, namespace: str, name: str) -> int:
        """Advice for BaseModel ``namespace/name``'s Adapters; how many Adapters' status it wrote."""
        basemodel = await self.client.get(object_path(API_VERSION, "BaseModel", namespace, name))
        if basemodel is None or basemodel["metadata"].get("deletionTimestamp"):
            self.memories.pop((namespace, name), None)
            return 0
        adapters = [
            a for a in await self.client.list(collection_path(API_VERSION, "Adapter", namespace))
            if (a.get("spec") or {}).get("baseModel") == name
        ]
        if not adapters:
            return 0
        views = await self.source.read(namespace)
        now = self.clock()
        by_name = {a["metadata"]["name"]: a for a in adapters}
        advices = advise_basemodel(basemodel, adapters, views, now, self.memories.get((namespace, name)))
        self.memories[(namespace, name)] = {
            str(by_name[a.name]["metadata"].get("uid")): a.memory for a in advices
        }
        written = 0
        for advice in advices:
            adapter = by_name[advice.name]
            old = adapter.get("status") or {}
            changed = status_patch(old, advice.status)
            if not changed:
                continue
            key = f"{namespace}/{advice.name}"
            path = object_path(API_VERSION, "Adapter", namespace, advice.name)
            body = {"metadata": {"resourceVersion": adapter["metadata"]["resourceVersion"]}, "status": changed}
            try:
                await self.client.patch_merge(path, body, status=True)
            except ConflictError:
                logger.info("merge advice skipped: the Adapter changed", extra={"adapter": key})
                continue
            written += 1
            metrics.MERGE_ADVICE_WRITES.inc()
            stamp = rfc3339(now)
            for event in advice.events:
                await self.client.event(
                    adapter, type_=event.type, reason=event.reason, message=event.message, now=stamp
                )
            if advice.switched:
                metrics.MERGE_SWITCHES.labels(str(advice.status["merge"].get("mode"))).inc()
                logger.info("mode auto switched", extra={"adapter": key, "mode": advice.status["merge"].get("mode")})
                self.reconcile("Adapter", namespace, advice.name)
        return written
