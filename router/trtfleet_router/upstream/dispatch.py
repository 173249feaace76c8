"""Sends one request to a pod of its base model: decide, attempt, recover, until it is answered or fails.

:meth:`Dispatcher.stream` yields the pod's responses to an :class:`~.call.UpstreamCall`, in named steps:

* **decide** (:meth:`~.admission.Admission.decide`): the fleet's
  :class:`~trtfleet_router.routing.types.Decision` picks the pod, after any wait for capacity or for a ready
  pod; then :meth:`~.admission.Admission.lease` starts the request in the fleet's books;
* **attempt** (:meth:`Dispatcher._attempt`): when the decision says cold, the adapter's pre-serialised weights
  go along (only over gRPC: raw ``lora_weights``/``lora_config`` tensors); when it says *loading* (warm, but the
  weights are still in transit with an earlier request) they go along too: TRT-LLM ignores weights for an id it
  holds, while an id-only request could overtake them and miss. A runtime ``pytorch`` pod reads the adapter from
  its ``lora_path`` instead, so nothing travels. The attempt runs on the first transport that carries it
  (:mod:`.attempt`); its first answer confirms the lease (later requests go id-only);
* **recover** (:func:`~.recovery.next_step`, pure): a ``LoRA task N not found in cache`` answer before anything
  was yielded is resent with weights to the same pod, once, invisibly; a full LoRA cache or queue, a failing
  pod (refused or broken connection, a dead stub) or a stalled one (see ``streamTimeouts``) tries the next pod
  up to ``max_attempts``, then :class:`~trtfleet_router.errors.Overloaded` (429) or
  :class:`~trtfleet_router.errors.Unavailable` (503). Pod failures count toward outlier detection, which ejects
  the pod with back-off (:meth:`~trtfleet_router.liveview.FleetSet.record_failure`); request errors never do. A
  failure after the first response was yielded is never retried (the client has part of the answer):
  :class:`~trtfleet_router.errors.StreamInterrupted`.

While a request runs it counts as demand of its base model and adapter (prewarming does not). Cancellation (the
consumer closes the generator, e.g. the client went away) closes the attempt: an own gRPC call is cancelled and
an HTTP connection closed, which makes the pod cancel the request; one multiplexed on a shared stream is only
abandoned (see :mod:`.grpc_transport`).
"""

from __future__ import annotations

import time
from collections.abc import AsyncGenerator
from dataclasses import replace
from typing import Final

from tritonclient.grpc import service_pb2

from trtfleet_router.errors import NoCapacityAvailable
from trtfleet_router.liveview import FleetSet
from trtfleet_router.metrics import RouterMetrics
from trtfleet_router.routing.config import StreamTimeouts
from trtfleet_router.routing.types import Decision, Outcome, RouteRequest, UnknownPod
from trtfleet_router.upstream.admission import Admission, Lease
from trtfleet_router.upstream.attempt import Attempts, AttemptStream
from trtfleet_router.upstream.attempt_log import log_done, log_failure, tracing
from trtfleet_router.upstream.call import UpstreamCall
from trtfleet_router.upstream.failures import UpstreamCallFailed
from trtfleet_router.upstream.grpc_transport import STREAMS_PER_POD_DEFAULT, UpstreamCalls
from trtfleet_router.upstream.modelinfo import ModelInfoCache
from trtfleet_router.upstream.pool import ChannelPool
from trtfleet_router.upstream.protocol import FailureKind, UpstreamFailure, check_weights
from trtfleet_router.upstream.recovery import Action, AttemptState, Step, final_error, next_step
from trtfleet_router.upstream.transport import AttachedWeights, Attempt
from trtfleet_router.upstream.waiting import Priority
from trtfleet_router.weights import ArtifactRef, WeightStore

__all__ = ["Dispatcher"]


MAX_ATTEMPTS_DEFAULT: Final = 3
MISS_RECOVERY_REASON: Final = "miss-recovery"

_OUTCOMES: Final = {
    FailureKind.MISS: Outcome.MISS,
    FailureKind.CACHE_FULL: Outcome.CACHE_FULL,
}


class _Tries:
    """Where a request stands between its attempts: what the next decision must honour."""

    __slots__ = ("attempts", "forced", "last", "max_attempts", "miss_recovered", "route")

    def __init__(self, route: RouteRequest, pinned: Decision | None, max_attempts: int) -> None:
        self.route = route
        self.forced = pinned  # the next attempt's decision, made already (prewarming, miss recovery)
        self.last: UpstreamFailure | None = None
        self.attempts = 0
        self.miss_recovered = False
        self.max_attempts = max_attempts

    def exclude(self, pod: str) -> None:
        self.route = replace(self.route, exclude_pods=self.route.exclude_pods | {pod})


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
        self.admission = Admission(fleets, metrics)

    async def stream(self, call: UpstreamCall) -> AsyncGenerator[service_pb2.ModelInferResponse, None]:
        """Responses of the pod that serves ``call`` (see the module docstring)."""
        target = call.target
        base_name = target.base.name
        adapter = target.adapter
        adapter_label = self.metrics.adapter_label(adapter.served_name if adapter else None)
        demand = call.pinned_decision is None  # prewarming is not demand
        if demand:
            self.admission.demand_started(call)
        fleet = self.fleets.fleet(base_name)
        timeouts = self.fleets.routing_config.timeouts_for(base_name)
        pinned = call.pinned_decision
        tries = _Tries(self.admission.route_request(call), pinned, 1 if pinned is not None else self.max_attempts)
        started_s = time.monotonic()
        traced = tracing()
        try:
            while True:
                # decide
                if tries.forced is not None:
                    decision, tries.forced = tries.forced, None
                else:
                    decision = await self.admission.decide(
                        fleet, tries.route, call.priority, tries.last, call.deadline_s, call=call
                    )
                try:
                    lease = self.admission.lease(fleet, decision, tries.route)
                except UnknownPod:
                    if pinned is not None:
                        raise NoCapacityAvailable(f"pod {decision.pod} left the fleet") from None
                    tries.exclude(decision.pod)
                    continue
                tries.attempts += 1
                decided_s = time.monotonic() if traced else 0.0  # what the debug line reports
                pod_load = fleet.load_of(decision.pod) if traced else 0
                first_answer_s: float | None = None
                outcome = Outcome.FAILED
                yielded = False
                stream: AttemptStream | None = None
                try:
                    # attempt
                    stream = await self._attempt(call, decision, lease, adapter_label, timeouts)
                    while (response := await stream.next()) is not None:
                        if not yielded:
                            yielded = True
                            if traced:
                                first_answer_s = time.monotonic() - decided_s
                            lease.answered()
                            if call.priority is not Priority.BATCH:
                                self.admission.interactive.first_answer(base_name, time.monotonic() - started_s)
                        yield response
                    outcome = Outcome.OK
                    if adapter is not None and not decision.send_weights:
                        self.metrics.adapter_cache_hits.labels(adapter_label).inc()
                    if traced:
                        log_done(
                            call,
                            decision,
                            adapter_label,
                            tries.attempts,
                            decided_s=decided_s - started_s,
                            first_answer_s=first_answer_s,
                            pod_load=pod_load,
                        )
                    return
                except UpstreamCallFailed as exc:
                    # recover
                    failure = exc.failure
                    outcome = _OUTCOMES.get(failure.kind, Outcome.FAILED)
                    self._recover(call, decision, failure, yielded, tries, adapter_label, exc)
                finally:
                    if stream is not None:
                        await stream.close()
                    lease.end(outcome)
        finally:
            if demand:
                self.admission.demand_ended(call)

    async def _attempt(
        self, call: UpstreamCall, decision: Decision, lease: Lease, adapter_label: str, timeouts: StreamTimeouts
    ) -> AttemptStream:
        """Start the request on the leased pod, with the adapter's weights when the decision says so."""
        attempt = Attempt(
            call.payload,
            lease.endpoint,
            call.deadline_s,
            call.client_streaming,
            await self._weights_for(call, decision, adapter_label),
        )
        return self.attempts.open(attempt, lease.base_model, timeouts, call.max_tokens, call.client_id)

    async def _weights_for(self, call: UpstreamCall, decision: Decision, adapter_label: str) -> AttachedWeights | None:
        """The weights an attempt carries: when the decision says cold (or loading) and the pod cannot read the
        adapter itself (runtime ``pytorch`` pods read ``lora_path``)."""
        adapter = call.target.adapter
        if adapter is None or not (decision.send_weights or decision.loading):
            return None
        if adapter.lora_path:
            if decision.send_weights:
                self.metrics.adapter_loads.labels(adapter_label).inc()  # the pod reads it from lora_path
            return None
        weights = await self.weights.get(ArtifactRef(adapter.artifact_uri, adapter.sha256))
        info = await self.model_info.info(call.target.base)
        check_weights(info, weights)
        if decision.send_weights:
            self.metrics.adapter_loads.labels(adapter_label).inc()
        self.metrics.weight_bytes_sent.inc(weights.nbytes)
        return AttachedWeights(info, weights)

    def _recover(
        self,
        call: UpstreamCall,
        decision: Decision,
        failure: UpstreamFailure,
        yielded: bool,
        tries: _Tries,
        adapter_label: str,
        exc: UpstreamCallFailed,
    ) -> Step:
        """Apply :func:`~.recovery.next_step` to a failed attempt: set up the next one, or raise the final error."""
        adapter = call.target.adapter
        base_name = call.target.base.name
        log_failure(call, decision, failure, yielded)
        state = AttemptState(
            tries.attempts,
            tries.max_attempts,
            yielded,
            tries.miss_recovered,
            decision.send_weights,
            adapter is not None,
        )
        step = next_step(failure, state)
        if step.blames_pod:
            self.blame(base_name, decision.pod, failure.kind.value)
        if failure.kind is FailureKind.MISS and adapter is not None:
            self.metrics.adapter_cache_misses.labels(adapter_label).inc()
        if step.action is Action.RETRY_WITH_WEIGHTS:
            tries.miss_recovered = True
            self.metrics.upstream_retries.labels("miss").inc()
            tries.forced = Decision(decision.pod, True, False, decision.policy, MISS_RECOVERY_REASON)
            return step
        tries.last = failure
        if step.action is Action.RETRY_ELSEWHERE:
            self.metrics.upstream_retries.labels(failure.kind.value).inc()
            tries.exclude(decision.pod)
            return step
        retry_after_s = self.admission.retry_after_s(base_name)
        raise final_error(failure, decision.pod, yielded=yielded, retry_after_s=retry_after_s) from exc

    def blame(self, base_name: str, pod: str, reason: str) -> None:
        """A pod failure (``reason``: pod_failed, stalled, probe). When it ejects the pod, the attempts
        there still waiting for their first answer end at once (as stalled), to be retried elsewhere."""
        self.metrics.pod_failures.labels(pod, reason).inc()
        if self.fleets.record_failure(base_name, pod) is None:
            return
        self.metrics.pod_ejections.labels(pod).inc()
        self.attempts.end_first_answer_waits(base_name, pod)

    def retain(self, addresses: set[str]) -> None:
        """Forget shared streams to pods discovery no longer lists."""
        self.attempts.retain(addresses)

    async def close(self) -> None:
        await self.attempts.close()
