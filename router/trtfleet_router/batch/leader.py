"""One batch runner per namespace among router replicas: a ``coordination.k8s.io/v1`` Lease.

Every router with ``--kubernetes`` and ``--batch-store`` serves the Files and Batches API; only the
holder of the Lease ``trtfleet-batch-runner`` runs batches and follows Batch resources. The holder
renews every ``renew_interval_s``; a Lease not renewed for ``lease_duration_s`` is taken over (a holder
killed with SIGKILL is replaced after that long). A holder that cannot renew stops its runner before
its Lease could expire, and writes are compare-and-swap on the Lease's resourceVersion, so two
replicas never both believe they lead; should a runner still overlap (a paused process), the store
keeps each line once in the result files (see :mod:`trtfleet.batch.book`).
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket
from collections.abc import Callable, Coroutine, Mapping
from datetime import UTC, datetime, timedelta
from enum import StrEnum
from typing import Any, Final

from trtfleet.kube import KubeApiError
from trtfleet_router.discovery.kubeclient import KubeClient

log = logging.getLogger(__name__)

LEASE_NAME: Final = "trtfleet-batch-runner"
LEASE_DURATION_S_DEFAULT: Final = 15.0
RENEW_INTERVAL_S_DEFAULT: Final = 5.0
CONFLICT: Final = 409
NOT_FOUND: Final = 404
MICRO_TIME: Final = "%Y-%m-%dT%H:%M:%S.%fZ"


class LeaseAction(StrEnum):
    CREATE = "create"
    RENEW = "renew"
    TAKE = "take"
    FOLLOW = "follow"


def _parse(value: Any) -> datetime | None:
    if not isinstance(value, str):
        return None
    for fmt in (MICRO_TIME, "%Y-%m-%dT%H:%M:%SZ"):
        try:
            return datetime.strptime(value, fmt).replace(tzinfo=UTC)
        except ValueError:
            continue
    return None


def plan_lease(lease: Mapping[str, Any] | None, identity: str, now: datetime) -> LeaseAction:
    """What to do with the Lease as read (pure)."""
    if lease is None:
        return LeaseAction.CREATE
    spec = lease.get("spec") or {}
    if spec.get("holderIdentity") == identity:
        return LeaseAction.RENEW
    renewed = _parse(spec.get("renewTime"))
    duration_s = spec.get("leaseDurationSeconds") or 0
    if not spec.get("holderIdentity") or renewed is None or renewed + timedelta(seconds=duration_s) < now:
        return LeaseAction.TAKE
    return LeaseAction.FOLLOW


def lease_body(
    lease: Mapping[str, Any] | None, identity: str, now: datetime, duration_s: float, name: str
) -> dict[str, Any]:
    """The Lease to write for ``identity`` (keeps the resourceVersion: the write is a compare-and-swap)."""
    spec = dict((lease or {}).get("spec") or {})
    taking = spec.get("holderIdentity") != identity
    stamp = now.strftime(MICRO_TIME)
    metadata = {"name": name}
    if lease is not None:
        metadata["resourceVersion"] = lease["metadata"]["resourceVersion"]
    spec.update(holderIdentity=identity, leaseDurationSeconds=int(duration_s), renewTime=stamp)
    if taking:
        spec.update(acquireTime=stamp, leaseTransitions=int(spec.get("leaseTransitions") or 0) + (lease is not None))
    return {"apiVersion": "coordination.k8s.io/v1", "kind": "Lease", "metadata": metadata, "spec": spec}


def default_identity() -> str:
    return f"{socket.gethostname()}-{os.urandom(3).hex()}"


class LeaderElection:
    def __init__(
        self,
        client: KubeClient,
        namespace: str,
        *,
        identity: str | None = None,
        name: str = LEASE_NAME,
        lease_duration_s: float = LEASE_DURATION_S_DEFAULT,
        renew_interval_s: float = RENEW_INTERVAL_S_DEFAULT,
        clock: Callable[[], datetime] = lambda: datetime.now(UTC),
    ) -> None:
        if renew_interval_s * 2 > lease_duration_s:
            raise ValueError("the lease must last at least two renew intervals")
        self.client = client
        self.path = f"/apis/coordination.k8s.io/v1/namespaces/{namespace}/leases"
        self.identity = identity or default_identity()
        self.name = name
        self.lease_duration_s = lease_duration_s
        self.renew_interval_s = renew_interval_s
        self.clock = clock
        self.leading = False

    async def _attempt(self) -> bool:
        """One read and, when due, one compare-and-swap write; True while this replica holds the Lease."""
        api = self.client.api()
        try:
            lease: dict[str, Any] | None = await api.request("GET", f"{self.path}/{self.name}")
        except KubeApiError as exc:
            if exc.status != NOT_FOUND:
                raise
            lease = None
        now = self.clock()
        action = plan_lease(lease, self.identity, now)
        if action is LeaseAction.FOLLOW:
            return False
        body = lease_body(lease, self.identity, now, self.lease_duration_s, self.name)
        try:
            if action is LeaseAction.CREATE:
                await api.request("POST", self.path, body=body)
            else:
                await api.request("PUT", f"{self.path}/{self.name}", body=body)
        except KubeApiError as exc:
            if exc.status == CONFLICT:  # another replica wrote first
                return False
            raise
        return True

    async def run(self, work: Callable[[], Coroutine[Any, Any, None]]) -> None:
        """Forever: run ``work`` while this replica leads; cancel it when the Lease is lost or cannot be
        renewed for half its duration (well before another replica may take it)."""
        task: asyncio.Task[None] | None = None
        loop = asyncio.get_running_loop()
        held_until = -1.0
        try:
            while True:
                try:
                    leading = await self._attempt()
                    if leading:
                        held_until = loop.time() + self.lease_duration_s / 2
                except KubeApiError as exc:
                    log.warning("batch lease not renewed", extra={"ctx": {"error": str(exc)}})
                    leading = loop.time() < held_until
                if task is not None and task.done():  # the work ended (it should not): start it again
                    if not task.cancelled() and task.exception() is not None:
                        log.error("batch runner failed", exc_info=task.exception())
                    task = None
                if leading and task is None:
                    log.info("batch runner leading", extra={"ctx": {"identity": self.identity}})
                    task = asyncio.create_task(work(), name="batch-runner")
                elif not leading and task is not None:
                    log.info("batch runner lost the lease", extra={"ctx": {"identity": self.identity}})
                    task.cancel()
                    await asyncio.gather(task, return_exceptions=True)
                    task = None
                self.leading = task is not None
                await asyncio.sleep(self.renew_interval_s)
        finally:
            if task is not None:
                task.cancel()
                await asyncio.gather(task, return_exceptions=True)
