"""Admission: when a request may start on a pod, which pod, and the books kept while it runs there.

:meth:`Admission.decide` asks the base model's fleet for a pod (the routing core, pure). When the request may not
start yet it waits, in one place per reason, both :class:`~.waiting.WaitLine` s:

* **for capacity** (:mod:`.capacity`): the fleet is saturated (``tenancy.saturation``: every ready pod holds
  ``inflightPerPod`` requests in flight, every replica's; until then a request goes to a pod below it), or every
  candidate pod's LoRA cache is full of adapters that requests still use (``CachesBusy``; TRT-LLM would answer
  "Cache is full"); woken as requests end, at most ``capacityWaitS`` and never past the deadline, turned away at
  once when the drain estimate says the wait is hopeless. A saturated fleet turns requests away with 429
  (:class:`~trtfleet_router.errors.Shed`: the tenant is over its share, its band is shed first, or the wait is too
  long), busy caches with 503; both with ``Retry-After``, the expected wait;
* **for a ready pod** (:mod:`.hold`): the base model has none (``NoReadyPod``: scaled to zero, or its first
  pods starting); woken, paced, as pods turn ready; at most ``holdWaitS``; held requests are the demand that
  scales the base model from zero.

**Tenants and bands.** Every request has a tenant and a :class:`~.waiting.Priority` band
(:func:`~trtfleet_router.routing.tenancy.classify`). Wherever requests wait, a more important band goes first
and, inside a band, the tenant the base model's tenant order picks (``tenancy.order``; trtfleet's is the virtual
token counter, ``routing/vtc.py``: the fewest weighted tokens served). While others of its band or a more
important one wait, a new request queues behind them rather than taking the room a request end freed. A full
line makes room by pushing out the request shed first (the least important band's, the most-over-share
tenant's newest), never a batch line. Tenants are charged their prompt when a request starts and its output
as it streams (:mod:`.tenantbooks`).

**Reserved slots** (``saturation.reservedPerPod``, 0 by default): the last slots below ``inflightPerPod`` on each
pod go only to a request that is not flooding (:func:`~trtfleet_router.routing.tenancy.may_take_reserved`: a
critical or interactive request of a tenant not over its share). A flooding request sees the lower limit: it
starts only on a pod below ``inflightPerPod - reservedPerPod`` and otherwise waits in the same line, and a wake-up
it cannot use for want of room below that limit passes to the first waiter that may take a reserved slot. Engines
do not preempt, so this is what lets a steady tenant start at once beside a flood; the flood pays by leaving the
reserve idle while nobody else needs it.

**Batch lines** are the lowest band: woken only when no client request waits, and a batch line starts only
while :func:`batch_may_start` holds: no client request waits for capacity and the chosen pod's load is below
``batch_pod_slots`` (below the engine's max batch, so an interactive request finds a free slot: an engine does
not preempt a running sequence). Otherwise the line waits and routes again when a request ends; after
``capacityWaitS`` it starts anyway (the bound that keeps a batch progressing on a saturated fleet). The Triton
``tensorrt_llm`` model takes no request priority (docs/operations.md, Batches): a request queued in a pod cannot
be overtaken there, so the router keeps its queues itself; trtllm-serve pods whose BaseModel sets
``serving.waitingQueuePolicy: priority`` get each request's band as its ``priority`` and order their own queue
the same way.

:meth:`Admission.lease` starts a decided request on its pod (the fleet's ticket); the :class:`Lease` records
the first answer and, at the end, the outcome, and wakes what the end may free (:meth:`request_ended`).
:class:`InteractiveSignal` is what the batch runner backs off on: interactive first answers slower than a target.
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
import time
from collections.abc import Callable
from typing import Final

from trtfleet_router.errors import AdapterUnservable, RouterError, Shed
from trtfleet_router.liveview import FleetSet, PodEndpoint
from trtfleet_router.metrics import RouterMetrics
from trtfleet_router.routing.baselines.llmd_flow_control import pool_saturation, scraped_load
from trtfleet_router.routing.fleet import Fleet
from trtfleet_router.routing.tenancy import DEFAULT_TENANT, TenancyConfig, may_take_reserved
from trtfleet_router.routing.types import (
    AdapterTooLarge,
    CachesBusy,
    Decision,
    NoCapacity,
    NoReadyPod,
    Outcome,
    RouteRequest,
    Ticket,
    UnknownPod,
)
from trtfleet_router.upstream.call import UpstreamCall
from trtfleet_router.upstream.capacity import RETRY_AFTER_S_MAX, CapacityWaits
from trtfleet_router.upstream.hold import RECHECK_S, PodHolds, fleet_budget, hold_for_pods
from trtfleet_router.upstream.protocol import UpstreamFailure
from trtfleet_router.upstream.recovery import no_pod_error
from trtfleet_router.upstream.tenantbooks import TenantBooks
from trtfleet_router.upstream.waiting import Priority, Wake

SATURATED: Final = "saturated"
OVER_SHARE: Final = "tenant_over_share"
PRIORITY_SHED: Final = "priority_shed"


def batch_may_start(*, pod_load: int, pod_slots: int, interactive_waiting: int) -> bool:
    """Whether a batch line may start on a pod whose load is ``pod_load`` (pure); ``interactive_waiting``: client
    requests (every band but batch) waiting for capacity."""
    return interactive_waiting == 0 and pod_load < pod_slots


class InteractiveSignal:
    """Per base model: when an interactive first answer last took longer than ``ttft_target_s``
    (None: never compared). Fed by the dispatcher, read by the batch runner's gate."""

    def __init__(self, ttft_target_s: float | None = None, now: Callable[[], float] = time.monotonic) -> None:
        self.ttft_target_s = ttft_target_s
        self._now = now
        self._slow_at_s: dict[str, float] = {}

    def first_answer(self, base_model: str, waited_s: float) -> None:
        """An interactive request of ``base_model`` got its first answer ``waited_s`` after it was routed."""
        if self.ttft_target_s is not None and waited_s > self.ttft_target_s:
            self._slow_at_s[base_model] = self._now()

    def slow_since(self, base_model: str, since_s: float) -> bool:
        """Whether an interactive first answer was slower than the target at or after ``since_s``."""
        return self._slow_at_s.get(base_model, -1.0) >= since_s


class Lease:
    """A request started on a pod: its ticket in the fleet's books until :meth:`end`."""

    __slots__ = ("_admission", "_inflight", "base_model", "endpoint", "fleet", "pod", "ticket")

    def __init__(
        self, admission: Admission, fleet: Fleet, ticket: Ticket, base_model: str, endpoint: PodEndpoint
    ) -> None:
        self._admission = admission
        self.fleet = fleet
        self.ticket = ticket
        self.base_model = base_model
        self.endpoint = endpoint
        self.pod = endpoint.pod_id
        self._inflight = admission.metrics.inflight_requests.labels(self.pod)
        self._inflight.inc()

    def answered(self) -> None:
        """The pod's first answer: it admitted the request and stored the weights it carried."""
        self.fleet.confirm(self.ticket)
        self.fleet.first_token(self.ticket)
        self._admission.fleets.record_success(self.base_model, self.pod)

    def end(self, outcome: Outcome) -> None:
        self._inflight.dec()
        self.fleet.finish(self.ticket, outcome)
        self._admission.request_ended(self.base_model)


class Admission:
    def __init__(self, fleets: FleetSet, metrics: RouterMetrics, *, now: Callable[[], float] = time.monotonic) -> None:
        self.fleets = fleets
        self.metrics = metrics
        config = fleets.routing_config
        self._now = now
        self.tenants = TenantBooks(fleets, metrics, now)
        self.capacity = CapacityWaits(config.capacity_queue_max, orders=self.tenants.order, now=now)
        self.holds = PodHolds(config.hold_queue_max, fleet_budget(fleets), orders=self.tenants.order)
        self.batch_pod_slots: int | None = None
        """Batch lines start on a pod only while its load is below this (None: no batch headroom rule)."""
        self.batch_reserve_pods = 0
        """Pods kept free of batch lines while interactive requests come (``routing/reserve.py``)."""
        self.interactive = InteractiveSignal()
        fleets.pod_listeners.append(self.holds.pods_changed)
        fleets.pod_listeners.append(self._pods_changed)

    @property
    def tenancy(self) -> TenancyConfig:
        return self.fleets.routing_config.tenancy

    def route_request(self, call: UpstreamCall) -> RouteRequest:
        """What the routing core is asked for ``call`` (with the batch rule's fields when it applies)."""
        adapter = call.target.adapter
        batch = call.priority is Priority.BATCH and self.batch_pod_slots is not None
        return RouteRequest(
            call.target.base.name,
            adapter.ref if adapter is not None else None,
            call.prompt_tokens,
            call.max_tokens,
            call.request_id,
            blocks=call.blocks,
            # bounded by the batch slots, so interactive requests may leave them out of pod loads, and placed
            # where their adapter is warm, one adapter per pod (routing/batchplace.py)
            background=batch,
            batch_slots=self.batch_pod_slots if batch else None,
            reserve_pods=self.batch_reserve_pods if self.batch_pod_slots is not None else 0,
            reserve_room=self.batch_pod_slots or 0,
        )

    async def decide(
        self,
        fleet: Fleet,
        route: RouteRequest,
        priority: Priority,
        last: UpstreamFailure | None,
        deadline_s: float,
        *,
        call: UpstreamCall | None = None,
    ) -> Decision:
        """The pod for ``route``, after any wait its band, ``call``'s tenant and the fleet's state call for (see the
        module docstring); raises the client-facing error when there is none in time. A call's first decision charges
        its tenant the prompt (and, for a call whose output is not metered as it streams, its ``max_tokens``)."""
        tenant = call.tenant if call is not None else DEFAULT_TENANT
        started_s = self._now()
        if priority is Priority.BATCH and self.batch_pod_slots is not None:
            decision = await self._decide_batch(fleet, route, last, deadline_s, self.batch_pod_slots, tenant)
        else:
            decision = await self._decide(fleet, route, last, deadline_s, priority, tenant)
        if call is not None and not call.charged:
            call.charged = True
            base = route.model
            label = self.metrics.tenant_label(tenant)
            self.metrics.queue_wait.labels(base, priority.value, label).observe(self._now() - started_s)
            upfront = route.max_tokens if not call.output_metered else 0
            self.tenants.charge(base, tenant, input_tokens=route.prompt_tokens, output_tokens=upfront)
        return decision

    def lease(self, fleet: Fleet, decision: Decision, route: RouteRequest) -> Lease:
        """Start ``route`` on the decided pod; raises ``UnknownPod`` when the pod left the fleet meanwhile."""
        endpoint = self.fleets.endpoint(route.model, decision.pod)
        if endpoint is None:
            raise UnknownPod(decision.pod)
        return Lease(self, fleet, fleet.start(decision, route), route.model, endpoint)

    def demand_started(self, call: UpstreamCall) -> None:
        """``call`` counts as demand of its base model (and adapter) until :meth:`demand_ended`: what the operator's
        autoscaler and the adapter activity window read."""
        base_name = call.target.base.name
        adapter = call.target.adapter
        if adapter is not None:
            metrics = self.metrics
            metrics.adapter_requests.labels(base_name, metrics.adapter_label(adapter.served_name)).inc()
            metrics.activity.record(base_name, adapter.served_name, adapter.ref.pages)
        self.metrics.base_model_requests.labels(base_name).inc()

    def demand_ended(self, call: UpstreamCall) -> None:
        base_name = call.target.base.name
        self.metrics.base_model_requests.labels(base_name).dec()
        if call.target.adapter is not None:
            self.metrics.activity.finished(base_name)

    def request_ended(self, base_model: str) -> None:
        """A request of ``base_model`` ended: capacity and the hold budget may have freed."""
        self.capacity.notify(base_model)
        self.holds.capacity_freed(base_model)

    def remote_ended(self, base_model: str) -> None:
        """Another router replica's request of ``base_model`` ended: with a saturation limit, its room may go to a
        request waiting here (the limit counts every replica's requests)."""
        if self.tenancy.saturation.enabled and self.capacity.line(base_model) is not None:
            self._wake_free(self.fleets.fleet(base_model), base_model)

    def retry_after_s(self, base_model: str) -> int:
        return self.capacity.retry_after_s(base_model)

    # -- saturation ------------------------------------------------------------------------------------
    def saturated(self, fleet: Fleet, base_model: str, reserved: bool = True) -> bool:
        """Whether ``tenancy.saturation`` says the base model's fleet is full (never while it has no ready pod: the
        hold for a ready pod handles that); ``reserved``: for a request that may take the pods' reserved slots."""
        saturation = self.tenancy.saturation
        if saturation.detector == "llmd-utilization":
            pods = scraped_load(fleet.snapshot().pods)
            if not pods:
                return False
            return pool_saturation(
                pods,
                queue_depth_threshold=saturation.queue_depth_threshold,
                kv_cache_util_threshold=saturation.kv_cache_util_threshold,
            ) >= 1.0
        return self._free_slots(fleet, base_model, reserved) <= 0

    def _free_slots(self, fleet: Fleet, base_model: str, reserved: bool = True) -> int:
        """Requests that may start before every ready pod holds ``inflightPerPod`` (less ``reservedPerPod`` unless
        ``reserved``; inflight detector; 1 without a limit or a ready pod), less those woken and about to start."""
        saturation = self.tenancy.saturation
        if saturation.inflight_per_pod <= 0 or fleet.ready_count() == 0:
            return 1
        return fleet.room(saturation.limit(reserved))[0] - self.capacity.woken(base_model)

    def may_reserve(self, base_model: str, tenant: str, band: Priority) -> bool:
        """Whether a request may take the pods' reserved slots (always without ``reservedPerPod``; else when it is
        not flooding: :func:`~trtfleet_router.routing.tenancy.may_take_reserved`)."""
        if not self.tenancy.saturation.reserving:
            return True
        return may_take_reserved(band, self.tenants.over_share(base_model, tenant) is not None)

    def _reserve_eligible(self, base_model: str) -> Callable[[str, Priority], bool]:
        return lambda tenant, band: self.may_reserve(base_model, tenant, band)

    def _route_with_room(self, fleet: Fleet, route: RouteRequest, reserved: bool = True) -> Decision:
        """``route`` decided among the pods below ``inflightPerPod`` (less ``reservedPerPod`` unless ``reserved``)
        while some pod is (a full pod would queue it behind its batch, where the router cannot order it); else among
        those below ``inflightPerPod``; among all pods when none of those can take it (tried already, or their LoRA
        caches busy) or no limit is set."""
        saturation = self.tenancy.saturation
        if saturation.detector == "inflight" and saturation.inflight_per_pod > 0:
            limits: tuple[float, ...] = (saturation.inflight_per_pod,)
            if not reserved and saturation.reserving:
                limits = (saturation.limit(False), *limits)
            for limit in limits:
                free, full = fleet.room(limit)
                if full and free > 0 and not full <= route.exclude_pods:
                    with contextlib.suppress(NoCapacity):  # else the next limit's, then the whole fleet's answer
                        return self._route_once(
                            fleet, dataclasses.replace(route, exclude_pods=route.exclude_pods | full)
                        )
                elif not full:
                    break  # every pod is below this limit: the whole fleet's answer is this limit's
        return self._route_once(fleet, route)

    def _must_wait(self, fleet: Fleet, base: str, band: Priority, woken: bool, reserved: bool = True) -> bool:
        """A request that may not start now: the fleet is saturated (for it: ``reserved`` says whether it may take
        the reserved slots), or (a newcomer) others of its band or a more important one wait already, whose turn
        the room that freed is (for a request that may take reserved slots, only waiters that may too: the others
        cannot use the room it would take)."""
        if not self.tenancy.saturation.enabled:
            return False
        line = self.capacity.line(base)
        if not woken and line is not None:
            if reserved and self.tenancy.saturation.reserving:
                ahead = line.queue.waiting_from(band, self._reserve_eligible(base))
            else:
                ahead = line.waiting_from(band)
            if ahead > 0:
                return True
        return self.saturated(fleet, base, reserved)

    def _wake_free(self, fleet: Fleet, base: str) -> None:
        """Wake as many capacity waiters as the fleet has room for (a head waiter's re-check; new pods; a woken
        flooding request that found only reserved room): the reserved slots' share only to those that may take
        them."""
        saturation = self.tenancy.saturation
        if saturation.detector == "llmd-utilization":
            if not self.saturated(fleet, base):
                self.capacity.wake(base)
            return
        free = self._free_slots(fleet, base)
        if free <= 0:
            return
        if not saturation.reserving:
            self.capacity.wake(base, free)
            return
        general = max(0, min(free, self._free_slots(fleet, base, reserved=False)))
        if general:
            self.capacity.wake(base, general)
        if free > general:
            self.capacity.wake(base, free - general, self._reserve_eligible(base))

    def _pods_changed(self, base_models: set[str]) -> None:
        if not self.tenancy.saturation.enabled:
            return
        for base in base_models:
            if self.capacity.line(base) is not None:
                self._wake_free(self.fleets.fleet(base), base)

    # -- deciding --------------------------------------------------------------------------------------
    async def _decide(
        self,
        fleet: Fleet,
        route: RouteRequest,
        last: UpstreamFailure | None,
        deadline_s: float,
        priority: Priority = Priority.INTERACTIVE,
        tenant: str = DEFAULT_TENANT,
    ) -> Decision:
        base = route.model
        woken = False
        gated = True
        config = self.fleets.routing_config
        wait_until_s = min(time.monotonic() + config.capacity_wait_s, deadline_s)
        hold_until_s = min(time.monotonic() + config.hold_wait_s, deadline_s)
        held = False
        while True:
            reserved = self.may_reserve(base, tenant, priority)
            if gated and self._must_wait(fleet, base, priority, woken, reserved):
                if woken and not reserved:
                    self._wake_free(fleet, base)  # room it may not take goes to a waiter that may
                woken = await self._wait(fleet, base, priority, tenant, woken, wait_until_s, None, last)
                if not woken:  # a batch line past its bound: it goes anyway
                    gated = False
                continue
            try:
                decision = self._route_with_room(fleet, route, reserved) if gated else self._route_once(fleet, route)
            except CachesBusy as exc:
                woken = await self._wait(fleet, base, priority, tenant, woken, wait_until_s, exc, last)
                if not woken:
                    raise self._busy_error(exc, base, last) from exc
                continue
            except NoReadyPod as exc:
                if last is None and config.hold_wait_s > 0:
                    held = await hold_for_pods(
                        self.holds, self.metrics, base, exc, hold_until_s, band=priority, tenant=tenant
                    )
                    continue
                raise _no_capacity_error(exc, last) from exc
            except NoCapacity as exc:
                raise _no_capacity_error(exc, last) from exc
            if held:
                self.metrics.holds.labels(base, "released").inc()
            if woken:
                self.metrics.capacity_waits.labels(base, "routed").inc()
                if not self.tenancy.saturation.enabled or not self.saturated(fleet, base):
                    self.capacity.wake(base)  # the freed capacity may hold the next waiter too
            else:
                line = self.capacity.line(base)
                if line is not None:
                    line.queue.passed(tenant, priority)
                else:
                    order = self.tenants.order(base)
                    order.joined(tenant, priority, ())
                    order.admitted(tenant, priority)
            return decision

    async def _wait(
        self,
        fleet: Fleet,
        base: str,
        band: Priority,
        tenant: str,
        woken: bool,
        until_s: float,
        busy: CachesBusy | None,
        last: UpstreamFailure | None,
    ) -> bool:
        """Wait in the capacity line (the fleet is saturated, or ``busy``: every LoRA cache is); True when woken.
        A client request turned away or shed raises (429 for a saturated fleet, 503 for busy caches); a batch line
        is never turned away: False when its time is up."""
        waits = self.capacity
        metrics = self.metrics
        batch = band is Priority.BATCH
        if not woken and not batch:
            line = waits.line(base)
            ahead = line.queue.ahead(band, tenant) if line is not None else 0
            expected_s = waits.drain.wait_s(base, ahead)
            hopeless = expected_s is not None and expected_s > until_s - time.monotonic()
            if not hopeless and not waits.can_wait(base):
                # take the place of the request shed first (which answers 429 itself), else turned away
                hopeless = waits.make_room(base, band, tenant) is None
            if hopeless:
                metrics.capacity_waits.labels(base, "queue_full").inc()
                if busy is not None:
                    raise self._busy_error(busy, base, last) from busy
                raise self._shed_error(base, band, tenant, ahead)
        gauge = metrics.queue_waiting.labels(base, band.value)
        waiting = metrics.capacity_waiting.labels(base)
        gauge.inc()
        waiting.inc()
        recheck = (lambda: self._wake_free(fleet, base)) if busy is None else None
        try:
            outcome = await waits.wait(
                base,
                until_s - time.monotonic(),
                first=woken,
                priority=band,
                tenant=tenant,
                tick_s=RECHECK_S if recheck is not None else None,
                on_tick=recheck,
            )
        finally:
            gauge.dec()
            waiting.dec()
        if outcome is Wake.WOKEN:
            return True
        if outcome is Wake.SHED:
            raise self._shed_error(base, band, tenant, 0, pushed_out=True)
        if batch:
            metrics.capacity_waits.labels(base, "batch_bound").inc()
            return False
        metrics.capacity_waits.labels(base, "timed_out").inc()
        if busy is not None:
            raise self._busy_error(busy, base, last) from busy
        raise self._shed_error(base, band, tenant, None)

    def _shed_error(
        self, base: str, band: Priority, tenant: str, ahead: int | None, *, pushed_out: bool = False
    ) -> Shed:
        """The 429 of a request a saturated fleet turns away: its tenant over its share, its band shed first, or
        simply too long a wait; ``Retry-After`` the expected wait of its place in the line."""
        waits = self.capacity
        line = waits.line(base)
        if ahead is None or pushed_out:
            ahead = line.queue.ahead(band, tenant) if line is not None else 0
        expected_s = waits.drain.wait_s(base, ahead)
        retry_after_s = 1 if expected_s is None else min(RETRY_AFTER_S_MAX, max(1, math.ceil(expected_s)))
        over = self.tenants.over_share(base, tenant)
        more_important = line is not None and line.waiting_from(band) > line.waiting(band)
        when = "was pushed out of the line" if pushed_out else "cannot start in time"
        if over is not None:
            reason = OVER_SHARE
            message = (
                f"tenant {tenant!r} is over its share of base model {base!r}: it received {over[0]:.0%} of the "
                f"tokens served lately against a fair share of {over[1]:.0%} by weight, so its requests wait behind "
                f"other tenants' while the fleet is saturated, and this one {when}; retry after {retry_after_s} s"
            )
        elif more_important or pushed_out:
            reason = PRIORITY_SHED
            message = (
                f"base model {base!r} is saturated and requests of priority band {band.value!r} are shed first "
                f"(more important requests wait); this one {when}; retry after {retry_after_s} s"
            )
        else:
            reason = SATURATED
            message = (
                f"base model {base!r} is saturated: about {ahead} requests would go before this one, longer than it "
                f"may wait (capacityWaitS or its deadline); retry after {retry_after_s} s"
            )
        self.metrics.shed_requests.labels(base, band.value, self.metrics.tenant_label(tenant), reason).inc()
        return Shed(message, retry_after_s=retry_after_s, code=reason)

    async def _decide_batch(
        self,
        fleet: Fleet,
        route: RouteRequest,
        last: UpstreamFailure | None,
        deadline_s: float,
        pod_slots: int,
        tenant: str = DEFAULT_TENANT,
    ) -> Decision:
        """A batch line's decision: routed as any request, then waiting in its band while
        :func:`batch_may_start` says no; after ``capacityWaitS`` it goes anyway (progress)."""
        base = route.model
        until_s = min(time.monotonic() + self.fleets.routing_config.capacity_wait_s, deadline_s)
        while True:
            decision = await self._decide(fleet, route, last, deadline_s, Priority.BATCH, tenant)
            waiting = self.capacity.waiting(base)
            if batch_may_start(pod_load=fleet.load_of(decision.pod), pod_slots=pod_slots, interactive_waiting=waiting):
                return decision
            outcome = await self.capacity.wait(
                base, until_s - time.monotonic(), priority=Priority.BATCH, tenant=tenant
            )
            if outcome is not Wake.WOKEN:
                self.metrics.capacity_waits.labels(base, "batch_bound").inc()
                return await self._decide(fleet, route, last, deadline_s, Priority.BATCH, tenant)

    def _busy_error(self, exc: CachesBusy, base: str, last: UpstreamFailure | None) -> RouterError:
        """503 for a request that found every LoRA cache busy, ``Retry-After`` from the drain estimate."""
        return no_pod_error(str(exc), last, self.capacity.retry_after_s(base))

    def _route_once(self, fleet: Fleet, route: RouteRequest) -> Decision:
        started = time.perf_counter()
        try:
            return fleet.route(route)
        except AdapterTooLarge as exc:
            raise AdapterUnservable(str(exc)) from exc
        finally:
            self.metrics.routing_decision.observe(time.perf_counter() - started)


def _no_capacity_error(exc: NoCapacity, last: UpstreamFailure | None) -> RouterError:
    """The client-facing error when the fleet has no pod for the request (after any wait)."""
    return no_pod_error(str(exc), last, max(1, math.ceil(exc.retry_after_s)))
