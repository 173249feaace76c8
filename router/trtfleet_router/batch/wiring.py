"""The batch parts of a router (built when ``--batch-store`` is set): the service over the store, the
runner (a background loop) and the HTTP front end."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import Any

from trtfleet.batch.book import BatchBook
from trtfleet.batch.errors import BatchLayerError
from trtfleet.batch.runner import BatchRunner, RunnerSettings
from trtfleet.batch.service import BatchService
from trtfleet.batch.store import open_store
from trtfleet_router.batch.capacity import POD_SLOTS_DEFAULT, FleetCapacity
from trtfleet_router.batch.executor import DispatchExecutor
from trtfleet_router.batch.leader import LeaderElection
from trtfleet_router.batch.resources import BatchResources
from trtfleet_router.discovery.kubernetes import KubernetesDiscovery
from trtfleet_router.errors import RouterError
from trtfleet_router.routing.reserve import RESERVE_AUTO
from trtfleet_router.server.batch_http import MAX_FILE_BYTES_DEFAULT, BatchFrontend
from trtfleet_router.server.common import Services
from trtfleet_router.server.openai_http import OpenAIFrontend


@dataclass(frozen=True)
class BatchSettings:
    store: str | None = None
    """A directory, ``file://`` path or ``s3://bucket/prefix``; batches are off when None."""
    runner: RunnerSettings = field(default_factory=RunnerSettings)
    pod_slots: int = POD_SLOTS_DEFAULT
    """Batch lines start on a pod only while its load is below this (interactive requests go first)."""
    ttft_target_ms: float | None = None
    """An interactive first answer slower than this halves the runner's window (None: not compared)."""
    max_file_bytes: int = MAX_FILE_BYTES_DEFAULT
    reserve_pods: int = 0
    """Pods kept free of batch lines while interactive requests come, or ``RESERVE_AUTO`` (``routing/reserve.py``)."""

    def __post_init__(self) -> None:
        if self.reserve_pods < 0 and self.reserve_pods != RESERVE_AUTO:
            raise ValueError(f"--batch-reserve-pods must be 0 or more, or auto; got {self.reserve_pods}")


@dataclass(frozen=True)
class BatchParts:
    service: BatchService
    runner: BatchRunner
    frontend: BatchFrontend
    resources: BatchResources | None = None
    """Batch resources to follow (with Kubernetes discovery only)."""
    election: LeaderElection | None = None
    """With Kubernetes discovery: only the Lease holder among the replicas runs batches."""

    async def work(self) -> None:
        loops = [self.runner.run()]
        if self.resources is not None:
            loops.append(self.resources.run())
        await asyncio.gather(*loops)

    async def run(self) -> None:
        if self.election is not None:
            await self.election.run(self.work)
        else:
            await self.work()


def build_batch_parts(settings: BatchSettings, services: Services, discovery: Any = None) -> BatchParts:
    """Raises ValueError for a store that cannot be opened (a start-up error)."""
    assert settings.store is not None
    try:
        store = open_store(settings.store)
    except BatchLayerError as exc:
        raise ValueError(exc.message) from exc
    service = BatchService(BatchBook(store))
    registry_of = services.fleets

    def serves(model: str) -> bool:
        try:
            registry_of.registry.resolve(model)
        except RouterError:
            return False
        return True

    admission = services.dispatcher.admission
    admission.batch_pod_slots = settings.pod_slots
    admission.batch_reserve_pods = settings.reserve_pods
    if settings.ttft_target_ms is not None:
        admission.interactive.ttft_target_s = settings.ttft_target_ms / 1000
    gate = FleetCapacity(
        services.fleets, settings.pod_slots, admission.capacity, admission.interactive, settings.reserve_pods
    )
    if settings.reserve_pods:
        reserve, fleet_set = settings.reserve_pods, services.fleets
        services.metrics.batch_reserved_pods = lambda: [
            (base, len(fleet.reserved_now(reserve))) for base, fleet in list(fleet_set.fleets.items())
        ]
    runner = BatchRunner(
        service,
        DispatchExecutor(OpenAIFrontend(services)),
        gate,
        serves,
        settings.runner,
    )
    resources = election = None
    if isinstance(discovery, KubernetesDiscovery):
        resources = BatchResources(discovery.client, discovery.namespace, service)
        election = LeaderElection(discovery.client, discovery.namespace)
    return BatchParts(service, runner, BatchFrontend(services, service, settings.max_file_bytes), resources, election)
