"""The fleet simulator with a pod count that changes: a controller loop, cold starts, drains, held requests.

:class:`ScalingSimulation` is :class:`bench.simulate.FleetSimulation` (the router's real ``Fleet`` over
simulated pods) plus what an autoscaled fleet adds, checked at every metrics scrape (1 s, the
resolution of everything below):

* **controller**: every ``scaler.interval_s`` it reads :class:`bench.scalers.FleetSignals` (requests in
  the router, held, waiting for LoRA capacity; running and queued in the pods; mean KV use; LoRA pages of
  the adapters in flight, weighted by their requests in the last ``adapter_window_s``, as the router's
  ``trtfleet_router_active_adapter_pages``) and asks the scaler for a pod count; a scaler with a
  ``hold_watch`` (trtfleet's operator) is also asked at once when its rule says so (a new hold episode: a
  request held while none was; or more held than its last decision covered), checked at each scrape;
* **scale-up**: a new pod is ready ``ColdStart.seconds`` after the decision (engine bytes over the
  storage bandwidth plus the load); it costs pod-seconds from the decision on. With ``warm_start`` it
  takes traffic with the window's hottest adapters already stored (as many as its device tier holds, the
  router's prewarm: each over the pod's link, the router's books told through ``Fleet.prewarm_decision``);
  without, its LoRA cache is empty;
* **scale-down**: pods still starting go first (newest first), then the ready pods whose warm adapters
  carry the least demand (requests in the window; ``least_valuable``, the operator's pod-deletion cost),
  or else the fewest requests: they turn not ready (the router stops routing to them), finish what they
  hold, and leave once nothing is in flight or in transit to them;
* **held**: a request that arrives while no pod is ready waits in the router (FIFO) until one is, at
  most ``hold_wait_s`` (then it fails, ``held_timeout``); its TTFT includes the wait. With
  ``release_per_pod`` the held queue goes to the pods (FIFO) at most that many requests in flight per
  ready pod, at each scrape, not all at once onto new pods; arrivals once a pod is ready are routed at
  once, not queued behind the backlog (which is late whatever is done: it waited a cold start);
* **end**: the run stops ``grace_s`` after ``duration_s``; a request still open then fails
  (``unfinished``). Heavily overloaded simulated pods can stall with requests queued (seen on the bursty
  trace at 2.7 times a static fleet's capacity), so a run must not wait for every request.

Pod-seconds count every pod that is starting, ready or draining, over ``[0, duration_s]``.
"""

from __future__ import annotations

import dataclasses
import math
from collections import Counter, deque
from collections.abc import Sequence
from dataclasses import dataclass

from trtfleet_router.routing.fleet import Fleet
from trtfleet_router.routing.types import Outcome, PodInfo, RouteRequest

from bench.podsim import SimPod
from bench.scalers import Autoscaler, FleetSignals
from bench.simulate import FleetSimulation, FleetSpec, SimResult
from bench.traces import TraceRequest
from trtfleet.autoscaling import working_set_pages
from trtfleet.loracache import LoraCacheFull

GIB = 1024**3


@dataclass(frozen=True, slots=True)
class ColdStart:
    """Time from the decision to a ready pod: ``engine_bytes / storage_bytes_per_s + load_s``."""

    engine_bytes: int = 16 * GIB  # Llama-3-8B fp16 TensorRT engine, about its weights
    storage_bytes_per_s: float = 1e9  # a network volume or object store read at 1 GB/s
    load_s: float = 20.0  # pod start, Triton start, engine deserialisation and warm-up

    @property
    def seconds(self) -> float:
        return self.engine_bytes / self.storage_bytes_per_s + self.load_s


@dataclass
class ScaleRun:
    result: SimResult
    pod_seconds: float
    scale_events: int
    held_requests: int
    peak_pods: int
    timeline: list[tuple[float, int]]  # (time s, pods allocated) at every change


class ScalingSimulation(FleetSimulation):
    def __init__(
        self,
        trace: Sequence[TraceRequest],
        spec: FleetSpec,
        scaler: Autoscaler,
        *,
        initial_pods: int,
        duration_s: float,
        cold_start: ColdStart = ColdStart(),
        hold_wait_s: float = 300.0,
        adapter_window_s: float = 60.0,
        grace_s: float = 300.0,
        policy: str = "ttft-cost",
        seed: int = 0,
        warm_start: bool = False,
        least_valuable: bool = False,
        release_per_pod: int | None = None,
    ) -> None:
        super().__init__(trace, policy, dataclasses.replace(spec, pods=initial_pods), seed=seed)
        self.scaler = scaler
        self.horizon_s = duration_s
        self.duration_s = duration_s
        self.cold_start_s = cold_start.seconds
        self.hold_wait_s = hold_wait_s
        self.adapter_window_s = adapter_window_s
        self.grace_s = grace_s
        self.unfinished = 0
        self.ready: set[str] = set(self.pods)
        self.draining: set[str] = set()
        self.starting: list[float] = []  # ready times of pods being started
        self._next_id = 0
        self._next_tick_s = 0.0
        self._held: deque[int] = deque()
        self.hold_episode = 0  # the router's: a request held while none was starts the next one
        self._held_since: dict[int, float] = {}
        self.held_total = 0
        self._seen = bytearray(len(trace))
        self._recent: deque[tuple[float, str]] = deque()
        self._recent_count: Counter[str] = Counter()
        self.scale_events = 0
        self.timeline: list[tuple[float, int]] = [(0.0, initial_pods)]
        self.warm_start = warm_start
        self.least_valuable = least_valuable
        self.release_per_pod = release_per_pod
        self.prewarmed = 0
        self.watch_decisions = 0  # decisions the hold watch asked for (besides the timer's)
        self._adapter_of = {ref.task_id: name for name, ref in self.refs.items()}

    # -- bookkeeping -------------------------------------------------------------------------------------
    @property
    def allocated(self) -> int:
        return len(self.ready) + len(self.draining) + len(self.starting)

    def _note(self) -> None:
        if self.timeline[-1][1] != self.allocated:
            self.timeline.append((self.now_s, self.allocated))

    def _publish(self) -> None:
        """Tell the router's Fleet the pods and their readiness (draining pods: not ready)."""
        spec = self.spec.pod
        self.fleet.set_pods({
            pod_id: PodInfo(pod_id, f"{pod_id}:8001", f"uid-{pod_id}", spec.host_pages, spec.device_pages,
                            ready=pod_id in self.ready, kv_blocks=spec.kv_capacity_tokens // self.block_tokens)
            for pod_id in sorted(self.ready | self.draining)
        })

    def pod_seconds(self) -> float:
        total = 0.0
        points = [*self.timeline, (self.duration_s, self.timeline[-1][1])]
        for (start_s, pods), (end_s, _next) in zip(points, points[1:], strict=False):
            total += pods * max(0.0, min(end_s, self.duration_s) - min(start_s, self.duration_s))
        return total

    # -- requests ----------------------------------------------------------------------------------------
    def _try_route(self, key: int) -> None:
        if not self._seen[key]:
            self._seen[key] = 1
            adapter = self.trace[key].adapter
            self._recent.append((self.now_s, adapter))
            self._recent_count[adapter] += 1
        if not self.ready:
            if not self._held:
                self.hold_episode += 1
            if key not in self._held_since:
                self.held_total += 1
            self._held.append(key)
            self._held_since.setdefault(key, self.now_s)
            return
        super()._try_route(key)

    def _release_held(self) -> None:
        budget = len(self._held)
        if self.release_per_pod is not None and self._held:
            # what the router has sent and not seen end (in transit or at a pod) or holds for LoRA capacity
            sent = sum(1 for ticket in self.fleet.open_tickets() if ticket.pod in self.ready)
            sent += sum(len(replica.waiting) for replica in self.replicas)
            budget = self.release_per_pod * len(self.ready) - sent
        while self._held and self.ready and budget > 0:
            budget -= 1
            key = self._held.popleft()
            self.records[key].waited_s += self.now_s - self._held_since.pop(key)
            super()._try_route(key)

    def _expire_held(self) -> None:
        while self._held and self.now_s - self._held_since[self._held[0]] >= self.hold_wait_s:
            key = self._held.popleft()
            self._held_since.pop(key)
            self._fail(self.records[key], "held_timeout")

    # -- the controller ----------------------------------------------------------------------------------
    def signals(self) -> FleetSignals:
        horizon = self.now_s - self.adapter_window_s
        while self._recent and self._recent[0][0] < horizon:
            _t, adapter = self._recent.popleft()
            self._recent_count[adapter] -= 1
            if not self._recent_count[adapter]:
                del self._recent_count[adapter]
        serving = [self.pods[pod_id] for pod_id in self.ready | self.draining]
        ready = [self.pods[pod_id] for pod_id in self.ready]
        return FleetSignals(
            ready_pods=len(self.ready),
            router_requests=self._open,
            held_requests=len(self._held),
            router_waiting=sum(len(replica.waiting) for replica in self.replicas),
            pod_running=sum(pod.active for pod in serving),
            pod_queued=sum(pod.queue_depth for pod in serving),
            kv_cache_fraction=sum(pod.kv_used_fraction() for pod in ready) / len(ready) if ready else None,
            active_adapter_pages=working_set_pages(
                ((count, self.spec.adapter_pages) for count in self._recent_count.values()), self._open),
        )

    def _scale_to(self, target: int) -> None:
        current = len(self.ready) + len(self.starting)
        if target == current:
            return
        self.scale_events += 1
        if target > current:
            self.starting.extend([self.now_s + self.cold_start_s] * (target - current))
        else:
            surplus = current - target
            while surplus and self.starting:
                self.starting.pop()
                surplus -= 1
            if surplus:
                by_load = sorted(self.ready, key=lambda p: (self.warm_value(p) if self.least_valuable else 0,
                                                            self.pods[p].active + self.pods[p].queue_depth, p))
                for pod_id in by_load[:surplus]:
                    self.ready.discard(pod_id)
                    self.draining.add(pod_id)
                self._publish()
        self._note()

    def _start_ready_pods(self) -> None:
        done = [at for at in self.starting if at <= self.now_s]
        if not done:
            return
        self.starting = [at for at in self.starting if at > self.now_s]
        before = set(self.ready)
        for _ in done:
            pod_id = f"pod-s{self._next_id:04d}"
            self._next_id += 1
            self.pods[pod_id] = SimPod(pod_id, self.spec.pod, self.spec.model)
            self.link_free_s[pod_id] = self.now_s
            self.ready.add(pod_id)
        self._publish()
        if self.warm_start:
            for pod_id in sorted(self.ready - before):
                self._prewarm(pod_id)
        self._release_held()

    def warm_value(self, pod_id: str) -> int:
        """The demand a pod's stored adapters carry: their requests in the window."""
        return sum(self._recent_count.get(self._adapter_of[task], 0) for task in self.pods[pod_id].cache.resident())

    def _prewarm(self, pod_id: str) -> None:
        """Warm scale-up: the window's hottest adapters to a new pod, as the router's prewarm pushes them."""
        slots = self.spec.pod.device_pages // max(1, self.spec.adapter_pages)
        pod = self.pods[pod_id]
        for name, _count in self._recent_count.most_common(slots):
            ref = self.refs[name]
            try:
                pod.cache.put(ref.task_id, ref.pages)
            except LoraCacheFull:
                break
            for replica in self.replicas:
                route = RouteRequest(model=self.model_name, adapter=ref, prompt_tokens=1, max_tokens=1,
                                     request_id=f"prewarm-{pod_id}-{name}")
                ticket = replica.fleet.start(Fleet.prewarm_decision(pod_id), route)
                replica.fleet.confirm(ticket)
                replica.fleet.finish(ticket, Outcome.OK)
            self.link_free_s[pod_id] = max(self.link_free_s[pod_id], self.now_s) + (
                ref.weights_bytes / self.spec.link_bytes_per_s)
            self.prewarmed += 1

    def _remove_drained(self) -> None:
        if not self.draining:
            return
        in_transit = {ticket.pod for ticket in self.fleet.open_tickets()}
        gone = [pod_id for pod_id in self.draining
                if pod_id not in in_transit and not self.pods[pod_id].active and not self.pods[pod_id].queue_depth
                and not self.pods[pod_id].stepping]
        if gone:
            self.draining.difference_update(gone)
            self._publish()
            self._note()

    def _stop(self) -> None:
        """End the run: what is still open fails as ``unfinished``; no event is handled after this."""
        for record in self.records:
            if record.error is None and record.e2e_s is None:
                record.error = "unfinished"
                self.unfinished += 1
        self._events.clear()
        self._open = 0  # with no arrival left and the horizon passed, the run loop schedules nothing more
        self.horizon_s = 0.0

    def _scrape(self) -> None:
        if self.now_s >= self.duration_s + self.grace_s:
            self._stop()
            return
        self._start_ready_pods()
        self._remove_drained()
        self._expire_held()
        if self.release_per_pod is not None:
            self._release_held()
        if self.now_s >= self._next_tick_s and self.now_s < self.duration_s:
            self._next_tick_s = self.now_s + self.scaler.interval_s
            current = len(self.ready) + len(self.starting)
            self._scale_to(self.scaler.decide(self.signals(), current, self.now_s))
        watch = getattr(self.scaler, "hold_watch", None)
        held = len(self._held)
        if watch is not None and self.now_s < self.duration_s and watch.wants_decision(held, self.hold_episode,
                                                                                        self.now_s):
            current = len(self.ready) + len(self.starting)
            self._scale_to(self.scaler.decide(self.signals(), current, self.now_s))
            watch.decided(held, self.hold_episode, self.now_s)
            self.watch_decisions += 1
        self._note()
        super()._scrape()

    def run_scaled(self) -> ScaleRun:
        result = self.run()
        return ScaleRun(
            result=result, pod_seconds=self.pod_seconds(), scale_events=self.scale_events,
            held_requests=self.held_total, peak_pods=max(pods for _t, pods in self.timeline),
            timeline=self.timeline,
        )


def initial_pods_for(rate_per_s: float, pod_rate_per_s: float, min_pods: int) -> int:
    """Pods a fleet that had been autoscaled before the run would have at its start."""
    return max(min_pods, math.ceil(rate_per_s / pod_rate_per_s - 1e-9))
