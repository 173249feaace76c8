"""Active health checks: every pod's readiness probed on a timer, feeding outlier detection.

Every ``probeIntervalS`` all pods are probed at once (``ModelReady`` of the upstream model over gRPC; trtllm-serve's
``/health``), each within ``probeTimeoutS``. A failed or timed-out probe of a routed pod is a pod failure (so a
frozen pod is ejected even when no request reaches it); a successful probe of an ejected pod whose ejection time
passed readmits it (``routing/outlier.py``).
"""

from __future__ import annotations

import asyncio

import grpc
from tritonclient.grpc import service_pb2

from trtfleet_router.liveview import FleetSet, PodEndpoint
from trtfleet_router.metrics import RouterMetrics
from trtfleet_router.upstream.dispatch import Dispatcher
from trtfleet_router.upstream.pool import ChannelPool


class PodHealth:
    def __init__(self, fleets: FleetSet, pool: ChannelPool, dispatcher: Dispatcher, metrics: RouterMetrics) -> None:
        self.fleets = fleets
        self.pool = pool
        self.dispatcher = dispatcher
        self.metrics = metrics

    async def run(self) -> None:
        config = self.fleets.routing_config.outlier_detection
        while True:
            await asyncio.sleep(config.probe_interval_s)
            await self.probe_all(config.probe_timeout_s)

    async def probe_all(self, timeout_s: float) -> None:
        fleets = self.fleets
        due = {(base, endpoint.pod_id) for base, endpoint in fleets.due_for_probe()}
        probes = [
            (base, endpoint)
            for base, endpoint in fleets.all_endpoints()
            if endpoint.ready and (endpoint.pod_id not in fleets.ejected(base) or (base, endpoint.pod_id) in due)
        ]
        results = await asyncio.gather(*(self.probe(base, endpoint, timeout_s) for base, endpoint in probes))
        for (base, endpoint), ready in zip(probes, results, strict=True):
            if (base, endpoint.pod_id) in due:
                if ready:
                    fleets.readmit(base, endpoint.pod_id)
            elif not ready:
                self.dispatcher.blame(base, endpoint.pod_id, "probe")
        for base in fleets.fleets:
            self.metrics.pods_ejected.labels(base).set(len(fleets.ejected(base)))

    async def probe(self, base_name: str, endpoint: PodEndpoint, timeout_s: float) -> bool:
        base = self.fleets.registry.bases.get(base_name)
        if base is None:
            return True
        if base.serves_openai:
            return await self.dispatcher.attempts.openai.healthy(endpoint.http_address or endpoint.address)
        request = service_pb2.ModelReadyRequest(name=base.upstream_model)
        try:
            answer = await self.pool.stub(endpoint.address).ModelReady(request, timeout=timeout_s)
        except grpc.aio.AioRpcError:
            return False
        return bool(answer.ready)
