"""Requests held while their base model has no ready pod (scaled to zero, or its first pods starting).

Instead of answering 503 at once, the dispatcher parks such a request here: at most ``max_held`` per
base model (beyond: the newest held request of a less important band is pushed out, else 503 at once), each
until it is released to route again or until its own limit passes (``holdWaitS``, capped by the request's
deadline): then 503 with ``Retry-After``. The held requests are the
demand that scales the base model from zero (``trtfleet_router_held_requests``).

**Paced release.** When pods of the base model turn ready (discovery calls :meth:`PodHolds.pods_changed`),
the held requests are released in band and tenant order (:mod:`.waiting`), but only as many as the base
model's *release budget* allows: ``holdReleasePerPod`` requests per ready pod (by default the BaseModel's
``spec.autoscaling.targetRequestsPerPod``) less the requests already in flight there, every replica's, and
less those released and not yet started. The rest follow as requests end (:meth:`capacity_freed`) or, at the
latest, at the next re-check (:data:`RECHECK_S`: other replicas' requests end without telling this one). A
backlog held through a cold start would otherwise land on the first pod at once, all cold, and queue there
behind each other while the next pods come up; requests that arrive once a pod is ready are routed at once,
not queued behind the backlog. Without a budget (``holdReleasePerPod: 0``) every held request is released
together. Pure asyncio on the event loop thread; the holds are :class:`~.waiting.WaitLine` s.

**Hold episodes.** The first request held while none of its base model is held starts an *episode*,
numbered on one sequence per router process (:meth:`PodHolds.episode`). The operator long-polls for a new
one, or for more held requests than its last decision covered (:meth:`PodHolds.wait_episode`, served on the
peer port as ``GET /fleet/v1/held``), so it scales a base model from zero as soon as a request waits, and
sizes the cold start to the backlog as it grows, not at its next autoscaling tick; the router needs no
permission to write BaseModels.
"""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Final

from trtfleet_router.errors import NoCapacityAvailable
from trtfleet_router.liveview import FleetSet
from trtfleet_router.metrics import RouterMetrics
from trtfleet_router.routing.fairqueue import Priority, TenantOrder
from trtfleet_router.routing.tenancy import DEFAULT_TENANT
from trtfleet_router.routing.types import NoReadyPod
from trtfleet_router.upstream.waiting import WaitLine, Wake

RETRY_AFTER_S_HELD: Final = 5
"""``Retry-After`` of a request turned away after or instead of a hold: a cold start takes this long at least."""

RECHECK_S: Final = 0.5
"""A held request re-checks its base model's budget this often (requests of other replicas end unseen)."""

ReleaseBudget = Callable[[str], int | None]
"""Held requests of a base model that may route now (None: all of them)."""


def fleet_budget(fleets: FleetSet) -> ReleaseBudget:
    """The router's budget: per ready pod the BaseModel's ``spec.autoscaling.targetRequestsPerPod`` (else the
    routing config's ``holdReleasePerPod``), less every replica's requests in flight on the base model's pods;
    None (release all) when that is 0."""

    def budget(base_model: str) -> int | None:
        entry = fleets.registry.bases.get(base_model)
        per_pod = entry.hold_release_per_pod if entry is not None else None
        if per_pod is None:
            per_pod = fleets.routing_config.hold_release_per_pod
        if per_pod <= 0:
            return None
        fleet = fleets.fleets.get(base_model)
        if fleet is None:  # not discovered (yet, or any more): nothing to release to
            return 0
        return math.floor(per_pod * fleet.ready_count()) - fleet.inflight_total()

    return budget


class HoldsFull(Exception):
    """``max_held`` requests of the base model are already held, none in a less important band."""


class HoldShed(Exception):
    """A held request was pushed out by a more important one while the holds were full."""


@dataclass
class _Holders:
    line: WaitLine = field(default_factory=WaitLine)
    released: int = 0
    """Released to route and not yet resumed: counted against the budget until they start."""


class PodHolds:
    """Bounded holds per base model, released in band and tenant order within the base model's budget."""

    def __init__(
        self, max_held: int, budget: ReleaseBudget | None = None, orders: Callable[[str], TenantOrder] | None = None
    ) -> None:
        self.max_held = max_held
        self.budget = budget
        self._orders = orders
        self._bases: dict[str, _Holders] = {}
        self._episodes = 0
        self._episode_of: dict[str, int] = {}
        self._episode_watchers: list[asyncio.Future[None]] = []

    def episode(self, base_model: str) -> int:
        """The number of the base model's latest hold episode (0: none since this router started)."""
        return self._episode_of.get(base_model, 0)

    async def wait_episode(self, base_model: str, after: int, timeout_s: float, above: int | None = None) -> int:
        """Wait until the base model's latest episode is numbered above ``after``, or (``above`` given) more
        than ``above`` of its requests are held, or ``timeout_s`` passes; the latest episode's number."""
        loop = asyncio.get_running_loop()
        until_s = loop.time() + timeout_s
        while self.episode(base_model) <= after and (above is None or self.held(base_model) <= above):
            left_s = until_s - loop.time()
            if left_s <= 0:
                break
            watcher: asyncio.Future[None] = loop.create_future()
            self._episode_watchers.append(watcher)
            try:
                await asyncio.wait((watcher,), timeout=left_s)
            finally:
                if watcher in self._episode_watchers:
                    self._episode_watchers.remove(watcher)
        return self.episode(base_model)

    def _start_episode(self, base_model: str) -> None:
        self._episodes += 1
        self._episode_of[base_model] = self._episodes
        self._wake_watchers()

    def _wake_watchers(self) -> None:
        watchers, self._episode_watchers = self._episode_watchers, []
        for watcher in watchers:
            if not watcher.done():
                watcher.set_result(None)

    def held(self, base_model: str) -> int:
        holders = self._bases.get(base_model)
        return holders.line.waiting() if holders is not None else 0

    async def wait(
        self,
        base_model: str,
        timeout_s: float,
        *,
        band: Priority = Priority.INTERACTIVE,
        tenant: str = DEFAULT_TENANT,
    ) -> bool:
        """Hold until released to route again (True) or until ``timeout_s`` passes (False).

        With ``max_held`` requests held already, pushes out the newest of a less important band (the one shed
        first, which raises :class:`HoldShed`), else raises :class:`HoldsFull` at once.
        """
        held = self.held(base_model)
        holders = self._bases.get(base_model)
        if held >= self.max_held and (holders is None or holders.line.shed(band) is None):
            raise HoldsFull(f"{held} requests already wait for a pod of base model {base_model!r}")
        if timeout_s <= 0:
            return False
        if holders is None:
            order = self._orders(base_model) if self._orders is not None else None
            holders = self._bases[base_model] = _Holders(WaitLine(order))
        if not holders.line:
            self._start_episode(base_model)
        if self._episode_watchers:
            loop = asyncio.get_running_loop()  # one more held: a watcher waiting for more than N re-checks
            loop.call_soon(self._wake_watchers)

        def lost_turn() -> None:  # released, then cancelled before it resumed: its turn passes on
            holders.released -= 1
            self._release(base_model)

        try:
            # one re-check of the budget per base model, by the oldest held request (requests of other
            # replicas end unseen)
            recheck = (lambda: self._release(base_model)) if self.budget is not None else None
            outcome = await holders.line.wait(
                timeout_s, band=band, tenant=tenant, tick_s=RECHECK_S, on_tick=recheck, on_lost_wake=lost_turn
            )
            if outcome is Wake.SHED:
                raise HoldShed(f"a more important request took this request's place among the held of {base_model!r}")
            if outcome is Wake.WOKEN:
                holders.released -= 1
            return outcome is Wake.WOKEN
        finally:
            if not holders.line and holders.released == 0 and self._bases.get(base_model) is holders:
                del self._bases[base_model]

    def pods_changed(self, base_models: set[str] | None = None) -> None:
        """Pods of ``base_models`` (None: all) changed: release what their budgets allow. Released requests
        route again and, if still no pod is ready, are held again for the rest of their time."""
        for name in list(self._bases if base_models is None else base_models & self._bases.keys()):
            self._release(name)

    def capacity_freed(self, base_model: str) -> None:
        """A request of the base model ended: the budget may let the next held request go."""
        if base_model in self._bases:
            self._release(base_model)

    def _release(self, base_model: str) -> None:
        holders = self._bases.get(base_model)
        if holders is None or not holders.line:
            return
        budget = self.budget(base_model) if self.budget is not None else None
        count = holders.line.waiting() if budget is None else budget - holders.released
        if count > 0:
            holders.released += holders.line.wake(count)


async def hold_for_pods(
    holds: PodHolds,
    metrics: RouterMetrics,
    base: str,
    exc: NoReadyPod,
    until_s: float,
    *,
    band: Priority = Priority.INTERACTIVE,
    tenant: str = DEFAULT_TENANT,
) -> bool:
    """Hold a request of ``base`` (the dispatcher's, for ``exc``) until discovery hands its fleet new pods
    (True: route again); 503 with ``Retry-After`` when the holds are full, it was pushed out by a more important
    request, or the hold's time runs out."""
    gauge = metrics.held_requests.labels(base)
    gauge.inc()
    try:
        if await holds.wait(base, until_s - time.monotonic(), band=band, tenant=tenant):
            return True
    except HoldsFull as full:
        metrics.holds.labels(base, "queue_full").inc()
        raise NoCapacityAvailable(
            f"base model {base!r} has no ready pod and {full}; retry later", retry_after_s=RETRY_AFTER_S_HELD
        ) from exc
    except HoldShed as shed:
        metrics.holds.labels(base, "shed").inc()
        raise NoCapacityAvailable(
            f"base model {base!r} has no ready pod and {shed}; retry later", retry_after_s=RETRY_AFTER_S_HELD
        ) from exc
    finally:
        gauge.dec()
    metrics.holds.labels(base, "timed_out").inc()
    raise NoCapacityAvailable(
        f"base model {base!r} has no ready pod: the request was held until its limit (holdWaitS or its "
        "deadline) while pods start (the base model may be scaled to zero); retry later",
        retry_after_s=RETRY_AFTER_S_HELD,
    ) from exc
