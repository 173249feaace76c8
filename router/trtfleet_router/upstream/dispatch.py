"""Sends one request to a pod of its base model: route, attach weights, stream, recover, retry.

One :class:`UpstreamCall` is a ``ModelInferRequest`` for the base model's upstream model with
``lora_task_id`` already set for an adapter (text requests also carry the same request as Triton
generate JSON). :meth:`Dispatcher.stream` yields the pod's responses:

* the fleet's :class:`~trtfleet_router.routing.types.Decision` picks the pod; when it says cold, the
  adapter's pre-serialised weights go along as raw ``lora_weights``/``lora_config`` tensors (gRPC);
  when it says *loading* (warm, but the weights are still in transit with an earlier request), the
  weights go along too: TRT-LLM ignores weights for an id it holds, so the cost is one transfer of the
  (already cached) weights, while an id-only request could overtake them and miss, and waiting for the
  earlier request's admission would cost its transfer + queue + prefill (and fail with it);
* the first response confirms the ticket (``Fleet.confirm``: the pod admitted the request and stored
  the weights it carried, so later requests go id-only);
* **waiting for capacity**: when every pod's LoRA cache is full of busy adapters (``CachesBusy``: the
  engine would say "Cache is full"), the request waits in a bounded FIFO per base model
  (:mod:`.capacity`, ``capacityWaitS`` / ``capacityQueueMax``, capped by its deadline) and routes again
  each time a request of that base model ends; 503 only after that;
* **interactive first** (:mod:`.priority`): a batch line starts on its pod only while the pod has
  headroom and no interactive request waits; otherwise it waits in the batch lane and routes again;
* **holding for a pod**: when the base model has no ready pod at all (``NoReadyPod``: scaled to zero, or
  its first pods starting), the request is held (:mod:`.hold`, ``holdWaitS`` / ``holdQueueMax``, capped by
  its deadline) and routes again whenever discovery hands the fleet new pods; 503 with ``Retry-After``
  only after that. Held requests count as demand (``trtfleet_router_held_requests``), which scales the
  base model from zero;
* **transport** per attempt: a warm text request goes over Triton HTTP when the pod's HTTP port is
  known (:mod:`.http_transport`), everything else over gRPC ``ModelStreamInfer``, as its own call
  for client streams and multiplexed on shared streams for unary requests (:mod:`.transport`);
* **miss recovery**: a ``LoRA task N not found in cache`` answer before anything was yielded ->
  ``finish(MISS)`` and the same request *with* weights to the same pod, once, invisibly;
* **back-pressure**: a full LoRA cache or queue -> ``finish(CACHE_FULL | FAILED)``, next pod
  (``exclude_pods``) up to ``max_attempts``, then :class:`~trtfleet_router.errors.Overloaded` (429);
* **pod failure** (refused or broken connection, a dead Python stub) or a **stalled pod** (no first
  answer within the first-token timeout, no next answer within the inter-token timeout, see
  ``streamTimeouts``) before the first response -> ``finish(FAILED)``, next pod, then
  :class:`~trtfleet_router.errors.Unavailable` (503); the failure counts against the pod, which outlier
  detection ejects with back-off (:meth:`~trtfleet_router.fleets.FleetSet.record_failure`);
* a failure after the first response was yielded is never retried (the client already has part of
  the answer): :class:`~trtfleet_router.errors.StreamInterrupted`, and a stalled stream ends so within
  its inter-token timeout instead of at the request deadline.

The rules live in one pure function, :func:`~.recovery.next_step`; request errors (invalid input, a
miss, a full queue) never count against a pod.

Cancellation (the consumer closes the generator or its task is cancelled, e.g. the client went
away) cancels an own gRPC call or closes the HTTP connection, which makes Triton cancel the request;
a request multiplexed on a shared stream is only abandoned (see :mod:`.transport`).
"""

from __future__ import annotations

import math
import time
from collections.abc import AsyncGenerator
from dataclasses import replace
from typing import Final

from tritonclient.grpc import service_pb2

from trtfleet_router.errors import AdapterUnservable, NoCapacityAvailable, RouterError
from trtfleet_router.fleets import FleetSet
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
    UnknownPod,
)
from trtfleet_router.upstream.attempt import Attempts
from trtfleet_router.upstream.attempt_log import log_done, log_failure, tracing
from trtfleet_router.upstream.call import UpstreamCall, UpstreamCalls
from trtfleet_router.upstream.capacity import CapacityWaits
from trtfleet_router.upstream.failures import UpstreamCallFailed
from trtfleet_router.upstream.hold import PodHolds, fleet_budget, hold_for_pods
from trtfleet_router.upstream.modelinfo import ModelInfoCache
from trtfleet_router.upstream.pool import ChannelPool
from trtfleet_router.upstream.priority import InteractiveSignal, Priority, batch_may_start
from trtfleet_router.upstream.protocol import (
    FailureKind,
    UpstreamFailure,
    with_weights,
)
from trtfleet_router.upstream.recovery import Action, AttemptState, final_error, next_step, no_pod_error
from trtfleet_router.upstream.transport import (
    STREAMS_PER_POD_DEFAULT,
)
from trtfleet_router.weights import ArtifactRef, WeightStore

__all__ = ["Dispatcher", "UpstreamCall", "UpstreamCalls"]


MAX_ATTEMPTS_DEFAULT: Final = 3
MISS_RECOVERY_REASON: Final = "miss-recovery"

_OUTCOMES: Final = {
    FailureKind.MISS: Outcome.MISS,
    FailureKind.CACHE_FULL: Outcome.CACHE_FULL,
}


class Dispatcher:
    def __init__(
        self,
        fleets: FleetSet,
        pool: ChannelPool,
        weights: WeightStore,
        model_info: ModelInfoCache,
        metrics: RouterMetrics,
        *,
        max_attempts: int = MAX_ATTEMPTS_DEFAULT,
        calls: UpstreamCalls = UpstreamCalls.AUTO,
        streams_per_pod: int = STREAMS_PER_POD_DEFAULT,
        warm_over_http: bool = True,
    ) -> None:
        self.fleets = fleets
        self.pool = pool
        self.weights = weights
        self.model_info = model_info
        self.metrics = metrics
        self.max_attempts = max_attempts
        self.attempts = Attempts(
            pool, metrics, calls=calls, streams_per_pod=streams_per_pod, warm_over_http=warm_over_http
        )
        self.capacity_waits = CapacityWaits(fleets.routing_config.capacity_queue_max)
        self.holds = PodHolds(fleets.routing_config.hold_queue_max, fleet_budget(fleets))
        self.batch_pod_slots: int | None = None
        """Batch lines start on a pod only while its load is below this (None: no batch headroom rule)."""
        self.batch_reserve_pods = 0
        """Pods kept free of batch lines while interactive requests come (``routing/reserve.py``)."""
        self.interactive = InteractiveSignal()
        fleets.pod_listeners.append(self.holds.pods_changed)

    async def stream(self, call: UpstreamCall) -> AsyncGenerator[service_pb2.ModelInferResponse, None]:
        """:meth:`_stream`, counted as demand of its base model (and its adapter) while it lasts; prewarming
        (a pinned decision) is not demand."""
        if call.pinned_decision is not None:
            async for response in self._stream(call):
                yield response
            return
        base_name = call.target.base.name
        adapter = call.target.adapter
        if adapter is not None:
            self.metrics.adapter_requests.labels(base_name, self.metrics.adapter_label(adapter.served_name)).inc()
            self.metrics.activity.record(base_name, adapter.served_name, adapter.ref.pages)
        demand = self.metrics.base_model_requests.labels(base_name)
        demand.inc()
        try:
            async for response in self._stream(call):
                yield response
        finally:
            demand.dec()
            if adapter is not None:
                self.metrics.activity.finished(base_name)

    async def _stream(self, call: UpstreamCall) -> AsyncGenerator[service_pb2.ModelInferResponse, None]:
        """Responses of the pod that serves ``call``: decide (route), prepare (weights), attempt (one pod,
        with the stream timeouts), then :func:`~.recovery.next_step` on failure (see the module docstring)."""
        target = call.target
        base_name = target.base.name
        fleet = self.fleets.fleet(base_name)
        adapter = target.adapter
        route = RouteRequest(
            base_name,
            adapter.ref if adapter is not None else None,
            call.prompt_tokens,
            call.max_tokens,
            call.request_id,
            blocks=call.blocks,
            # bounded by the batch slots (below), so interactive requests may leave them out of pod loads, and
            # placed where their adapter is warm, one adapter per pod (routing/batchplace.py)
            background=call.priority is Priority.BATCH and self.batch_pod_slots is not None,
            batch_slots=self.batch_pod_slots if call.priority is Priority.BATCH else None,
            reserve_pods=self.batch_reserve_pods if self.batch_pod_slots is not None else 0,
            reserve_room=self.batch_pod_slots or 0,
        )
        attempts = 0
        miss_recovered = False
        forced: Decision | None = call.pinned_decision
        max_attempts = 1 if call.pinned_decision is not None else self.max_attempts
        last: UpstreamFailure | None = None
        adapter_label = self.metrics.adapter_label(adapter.served_name if adapter else None)
        timeouts = self.fleets.routing_config.timeouts_for(base_name)
        started_s = time.monotonic()
        batch = call.priority is Priority.BATCH
        traced = tracing()
        while True:
            # decide
            if forced is not None:
                decision = forced
            elif batch and self.batch_pod_slots is not None:
                decision = await self._route_batch(fleet, route, last, call.deadline_s, self.batch_pod_slots)
            else:
                decision = await self._route(fleet, route, last, call.deadline_s)
            forced = None
            endpoint = self.fleets.endpoint(base_name, decision.pod)
            try:
                if endpoint is None:
                    raise UnknownPod(decision.pod)
                ticket = fleet.start(decision, route)
            except UnknownPod:
                if call.pinned_decision is not None:
                    raise NoCapacityAvailable(f"pod {decision.pod} left the fleet") from None
                route = replace(route, exclude_pods=route.exclude_pods | {decision.pod})
                continue
            attempts += 1
            # what the debug line reports, measured only when it is written
            decided_s = time.monotonic() if traced else 0.0
            pod_load = fleet.load_of(decision.pod) if traced else 0
            first_answer_s: float | None = None
            self.metrics.inflight_requests.labels(decision.pod).inc()
            outcome = Outcome.FAILED
            yielded = False
            try:
                # prepare, attempt
                request = await self._prepare(call, decision, adapter_label)
                async for response in self.attempts.run(endpoint, request, call, timeouts):
                    if not yielded:
                        yielded = True
                        if traced:
                            first_answer_s = time.monotonic() - decided_s
                        fleet.confirm(ticket)
                        fleet.first_token(ticket)
                        self.fleets.record_success(base_name, decision.pod)
                        if not batch:
                            self.interactive.first_answer(base_name, time.monotonic() - started_s)
                    outcome = Outcome.OK
                    yield response
                outcome = Outcome.OK
                if adapter is not None and not decision.send_weights:
                    self.metrics.adapter_cache_hits.labels(adapter_label).inc()
                if traced:
                    log_done(
                        call,
                        decision,
                        adapter_label,
                        attempts,
                        decided_s=decided_s - started_s,
                        first_answer_s=first_answer_s,
                        pod_load=pod_load,
                    )
                return
            except UpstreamCallFailed as exc:
                # recover
                failure = exc.failure
                outcome = _OUTCOMES.get(failure.kind, Outcome.FAILED)
                log_failure(call, decision, failure, yielded)
                state = AttemptState(
                    attempts, max_attempts, yielded, miss_recovered, decision.send_weights, adapter is not None
                )
                step = next_step(failure, state)
                if step.blames_pod:
                    self._blame(base_name, decision.pod, failure)
                if failure.kind is FailureKind.MISS and adapter is not None:
                    self.metrics.adapter_cache_misses.labels(adapter_label).inc()
                if step.action is Action.RETRY_WITH_WEIGHTS:
                    miss_recovered = True
                    self.metrics.upstream_retries.labels("miss").inc()
                    forced = Decision(decision.pod, True, False, decision.policy, MISS_RECOVERY_REASON)
                    continue
                last = failure
                if step.action is Action.RETRY_ELSEWHERE:
                    self.metrics.upstream_retries.labels(failure.kind.value).inc()
                    route = replace(route, exclude_pods=route.exclude_pods | {decision.pod})
                    continue
                retry_after_s = self.capacity_waits.retry_after_s(base_name)
                raise final_error(failure, decision.pod, yielded=yielded, retry_after_s=retry_after_s) from exc
            finally:
                self.metrics.inflight_requests.labels(decision.pod).dec()
                fleet.finish(ticket, outcome)
                self.capacity_waits.notify(base_name)
                self.holds.capacity_freed(base_name)

    async def _prepare(
        self, call: UpstreamCall, decision: Decision, adapter_label: str
    ) -> service_pb2.ModelInferRequest | None:
        """The request with the adapter's weights when the decision says so; None: the call's own."""
        adapter = call.target.adapter
        if adapter is not None and adapter.lora_path and decision.send_weights:
            self.metrics.adapter_loads.labels(adapter_label).inc()  # the pod reads it from lora_path
        if not (decision.send_weights or decision.loading) or adapter is None or adapter.lora_path:
            return None  # runtime pytorch (trtllm-serve or the llmapi model): no weights travel
        weights = await self.weights.get(ArtifactRef(adapter.artifact_uri, adapter.sha256))
        info = await self.model_info.info(call.target.base)
        request = with_weights(call.grpc_request(), info, weights)
        if decision.send_weights:
            self.metrics.adapter_loads.labels(adapter_label).inc()
        self.metrics.weight_bytes_sent.inc(weights.nbytes)
        return request

    def _blame(self, base_name: str, pod: str, failure: UpstreamFailure) -> None:
        self.blame(base_name, pod, failure.kind.value)

    def blame(self, base_name: str, pod: str, reason: str) -> None:
        """A pod failure (``reason``: pod_failed, stalled, probe). When it ejects the pod, the attempts
        there still waiting for their first answer end at once (as stalled), to be retried elsewhere."""
        self.metrics.pod_failures.labels(pod, reason).inc()
        if self.fleets.record_failure(base_name, pod) is None:
            return
        self.metrics.pod_ejections.labels(pod).inc()
        self.attempts.end_first_answer_waits(base_name, pod)

    async def _route(
        self,
        fleet: Fleet,
        route: RouteRequest,
        last: UpstreamFailure | None,
        deadline_s: float,
        priority: Priority = Priority.INTERACTIVE,
    ) -> Decision:
        """The fleet's decision; while every cache is full of busy adapters, wait for capacity (see
        :mod:`.capacity`) until ``capacityWaitS`` or the deadline, then the client-facing error. A request
        whose expected wait (the queue's drain estimate) exceeds what it may wait is turned away at once."""
        waits = self.capacity_waits
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

    async def _route_batch(
        self, fleet: Fleet, route: RouteRequest, last: UpstreamFailure | None, deadline_s: float, pod_slots: int
    ) -> Decision:
        """A batch line's decision: routed as any request, then held in the batch lane while
        :func:`~.priority.batch_may_start` says no; after ``capacityWaitS`` it goes anyway (progress)."""
        base = route.model
        until_s = min(time.monotonic() + self.fleets.routing_config.capacity_wait_s, deadline_s)
        while True:
            decision = await self._route(fleet, route, last, deadline_s, Priority.BATCH)
            waiting = self.capacity_waits.waiting(base)
            if batch_may_start(pod_load=fleet.load_of(decision.pod), pod_slots=pod_slots, interactive_waiting=waiting):
                return decision
            if not await self.capacity_waits.wait(base, until_s - time.monotonic(), priority=Priority.BATCH):
                self.metrics.capacity_waits.labels(base, "batch_bound").inc()
                return await self._route(fleet, route, last, deadline_s, Priority.BATCH)

    def _busy_error(self, exc: CachesBusy, base: str, last: UpstreamFailure | None) -> RouterError:
        """503 for a request that found every LoRA cache busy, ``Retry-After`` from the drain estimate."""
        return no_pod_error(str(exc), last, self.capacity_waits.retry_after_s(base))

    def _route_once(self, fleet: Fleet, route: RouteRequest) -> Decision:
        started = time.perf_counter()
        try:
            return fleet.route(route)
        except AdapterTooLarge as exc:
            raise AdapterUnservable(str(exc)) from exc
        finally:
            self.metrics.routing_decision.observe(time.perf_counter() - started)

    def retain(self, addresses: set[str]) -> None:
        """Forget shared streams to pods discovery no longer lists."""
        self.attempts.retain(addresses)

    async def close(self) -> None:
        await self.attempts.close()


def _no_capacity_error(exc: NoCapacity, last: UpstreamFailure | None) -> RouterError:
    """The client-facing error when the fleet has no pod for the request (after any wait)."""
    return no_pod_error(str(exc), last, max(1, math.ceil(exc.retry_after_s)))
