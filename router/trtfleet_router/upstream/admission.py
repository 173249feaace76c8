"""Admission: when a request may start on a pod, which pod, and the books kept while it runs there.

:meth:`Admission.decide` asks the base model's fleet for a pod (the routing core, pure). When the fleet has
none to give the request waits, in one place per reason, both :class:`~.waiting.WaitLine` s:

* **for LoRA cache capacity** (:mod:`.capacity`): every candidate pod's LoRA cache is full of adapters that
  requests still use (``CachesBusy``; TRT-LLM would answer "Cache is full"); woken as requests end, at most
  ``capacityWaitS`` and never past the deadline, turned away at once when the drain estimate says the wait is
  hopeless; then 503 with ``Retry-After``;
* **for a ready pod** (:mod:`.hold`): the base model has none (``NoReadyPod``: scaled to zero, or its first
  pods starting); woken, paced, as pods turn ready; at most ``holdWaitS``; held requests are the demand that
  scales the base model from zero.

**Bands.** Every request has a :class:`~.waiting.Priority`. Interactive requests are woken before batch lines
wherever they wait, and a batch line starts only while :func:`batch_may_start` holds: no interactive request
waits for capacity and the chosen pod's load is below ``batch_pod_slots`` (below the engine's max batch, so an
interactive request finds a free slot: an engine does not preempt a running sequence). Otherwise the line
waits and routes again when a request ends; after ``capacityWaitS`` it starts anyway (the bound that keeps a
batch progressing on a saturated fleet). TensorRT-LLM's executor has a per-request priority, but the Triton
``tensorrt_llm`` model takes none (docs/operations.md, Batches): a batch line queued in a pod cannot be
overtaken there, so the router keeps batch lines out of the pod's queue instead.

:meth:`Admission.lease` starts a decided request on its pod (the fleet's ticket); the :class:`Lease` records
the first answer and, at the end, the outcome, and wakes what the end may free (:meth:`request_ended`).
:class:`InteractiveSignal` is what the batch runner backs off on: interactive first answers slower than a target.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable

from trtfleet_router.errors import AdapterUnservable, RouterError
from trtfleet_router.liveview import FleetSet, PodEndpoint
from trtfleet_router.metrics import RouterMetrics
from trtfleet_router.routing.fleet import Fleet
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
from trtfleet_router.upstream.capacity import CapacityWaits
from trtfleet_router.upstream.hold import PodHolds, fleet_budget, hold_for_pods
from trtfleet_router.upstream.protocol import UpstreamFailure
from trtfleet_router.upstream.recovery import no_pod_error
from trtfleet_router.upstream.waiting import Priority


def batch_may_start(*, pod_load: int, pod_slots: int, interactive_waiting: int) -> bool:
    """Whether a batch line may start on a pod whose load is ``pod_load`` (pure)."""
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
    def __init__(self, fleets: FleetSet, metrics: RouterMetrics) -> None:
        self.fleets = fleets
        self.metrics = metrics
        config = fleets.routing_config
        self.capacity = CapacityWaits(config.capacity_queue_max)
        self.holds = PodHolds(config.hold_queue_max, fleet_budget(fleets))
        self.batch_pod_slots: int | None = None
        """Batch lines start on a pod only while its load is below this (None: no batch headroom rule)."""
        self.batch_reserve_pods = 0
        """Pods kept free of batch lines while interactive requests come (``routing/reserve.py``)."""
        self.interactive = InteractiveSignal()
        fleets.pod_listeners.append(self.holds.pods_changed)

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
        self, fleet: Fleet, route: RouteRequest, priority: Priority, last: UpstreamFailure | None, deadline_s: float
    ) -> Decision:
        """The pod for ``route``, after any wait its band and the fleet's state call for (see the module
        docstring); raises the client-facing error when there is none in time."""
        if priority is Priority.BATCH and self.batch_pod_slots is not None:
            return await self._decide_batch(fleet, route, last, deadline_s, self.batch_pod_slots)
        return await self._decide(fleet, route, last, deadline_s, priority)

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

    def retry_after_s(self, base_model: str) -> int:
        return self.capacity.retry_after_s(base_model)

    async def _decide(
        self,
        fleet: Fleet,
        route: RouteRequest,
        last: UpstreamFailure | None,
        deadline_s: float,
        priority: Priority = Priority.INTERACTIVE,
    ) -> Decision:
        waits = self.capacity
        base = route.model
        woken = False
        config = self.fleets.routing_config
        wait_until_s = min(time.monotonic() + config.capacity_wait_s, deadline_s)
        hold_until_s = min(time.monotonic() + config.hold_wait_s, deadline_s)
        held = False
        while True:
            try:
                decision = self._route_once(fleet, route)
            except CachesBusy as exc:
                if not woken:
                    expected_s = waits.expected_wait_s(base)
                    hopeless = expected_s is not None and expected_s > wait_until_s - time.monotonic()
                    if hopeless or not waits.can_wait(base):
                        self.metrics.capacity_waits.labels(base, "queue_full").inc()
                        raise self._busy_error(exc, base, last) from exc
                waiting = self.metrics.capacity_waiting.labels(base)
                waiting.inc()
                try:
                    woken = await waits.wait(base, wait_until_s - time.monotonic(), first=woken, priority=priority)
                finally:
                    waiting.dec()
                if woken:
                    continue
                self.metrics.capacity_waits.labels(base, "timed_out").inc()
                raise self._busy_error(exc, base, last) from exc
            except NoReadyPod as exc:
                if last is None and config.hold_wait_s > 0:
                    held = await hold_for_pods(self.holds, self.metrics, base, exc, hold_until_s)
                    continue
                raise _no_capacity_error(exc, last) from exc
            except NoCapacity as exc:
                raise _no_capacity_error(exc, last) from exc
            if held:
                self.metrics.holds.labels(base, "released").inc()
            if woken:
                self.metrics.capacity_waits.labels(base, "routed").inc()
                waits.wake(base)  # the freed capacity may hold the next waiter too
            return decision

    async def _decide_batch(
        self, fleet: Fleet, route: RouteRequest, last: UpstreamFailure | None, deadline_s: float, pod_slots: int
    ) -> Decision:
        """A batch line's decision: routed as any request, then waiting in its band while
        :func:`batch_may_start` says no; after ``capacityWaitS`` it goes anyway (progress)."""
        base = route.model
        until_s = min(time.monotonic() + self.fleets.routing_config.capacity_wait_s, deadline_s)
        while True:
            decision = await self._decide(fleet, route, last, deadline_s, Priority.BATCH)
            waiting = self.capacity.waiting(base)
            if batch_may_start(pod_load=fleet.load_of(decision.pod), pod_slots=pod_slots, interactive_waiting=waiting):
                return decision
            if not await self.capacity.wait(base, until_s - time.monotonic(), priority=Priority.BATCH):
                self.metrics.capacity_waits.labels(base, "batch_bound").inc()
                return await self._decide(fleet, route, last, deadline_s, Priority.BATCH)

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
