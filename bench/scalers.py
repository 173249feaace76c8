"""The autoscalers the autoscaling benchmark compares, each a pure ``decide(signals, current, now_s) -> pods``.

All read the same :class:`FleetSignals` (what the simulated fleet shows at a tick) and keep their own
state; none reads a clock.

* :class:`StaticScaler`: a fixed pod count (static peak or static average sizing).
* :class:`QueueScaler`: Kubernetes' HPA on one metric, requests *waiting* per pod (in the pods' queues,
  in the router waiting for LoRA capacity, held for want of a pod): ``desired = ceil(current * metric /
  target)``, skipped within HPA's 10 % tolerance, scale-up at once, scale-down to the highest desired
  count of the last 300 s (HPA's default ``behavior``), never below 1 (an HPA does not scale to zero).
* :class:`KubeAiScaler`: KubeAI's model autoscaler (kubeai-project/kubeai@f442a2cd,
  ``internal/modelautoscaler/autoscaler.go`` ``Start``, ``internal/modelclient/scale.go`` ``Scale``,
  ``internal/config/system.go``): every ``interval`` the active requests summed over its proxies (in flight
  or waiting for a pod) enter a simple moving average of ``timeWindow / interval`` samples (a new model's
  window starts at zeros); desired = ``ceil(average / targetRequests)`` within min/max; a scale-down
  happens only after ``ceil(scaleDownDelaySeconds / interval)`` consecutive lower answers. A request for a
  model at zero replicas scales it to one at once (``ScaleAtLeastOneReplica``, from the proxy).
* :class:`ForesightScaler`: the offline bound (:mod:`bench.scalebound`) replayed: it knows the trace, so it
  asks at each tick for the pods of the window it is in and of the next tick's (with no cold start, pods
  asked for at one scrape serve from the next), whatever the signals say.
* :class:`TrtfleetScaler`: :func:`trtfleet.autoscaling.decide` itself with an ``AutoscalingSpec``; with
  ``hold_watch`` (the operator's default) it also decides at once on held requests, by the operator's own
  :class:`HoldWatchRule` (``trtfleet_operator.holdwatch``), not only every ``interval_s``.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass, field
from typing import Protocol

from trtfleet_operator.holdwatch import DECIDE_GAP_S, Cursor, HeldAnswer, advance, is_new

from bench.scalebound import ScaleBound
from trtfleet.api.autoscaling import AutoscalingSpec
from trtfleet.autoscaling import DemandSignals, Recommended, decide


@dataclass(frozen=True, slots=True)
class FleetSignals:
    """One reading of the simulated fleet (counts summed over pods and the router)."""

    ready_pods: int = 0
    router_requests: int = 0  # arrived and not ended: at a pod, waiting for LoRA capacity, or held
    held_requests: int = 0  # waiting for a ready pod
    router_waiting: int = 0  # waiting in the router for LoRA cache capacity
    pod_running: int = 0
    pod_queued: int = 0
    kv_cache_fraction: float | None = None
    active_adapter_pages: int = 0  # pages of the adapters with a request in the router's window

    @property
    def waiting(self) -> int:
        return self.pod_queued + self.router_waiting + self.held_requests


class Autoscaler(Protocol):
    name: str
    interval_s: float

    def decide(self, signals: FleetSignals, current: int, now_s: float) -> int: ...


@dataclass
class StaticScaler:
    pods: int
    name: str = "static"
    interval_s: float = 3600.0

    def decide(self, signals: FleetSignals, current: int, now_s: float) -> int:
        return self.pods


@dataclass
class QueueScaler:
    target_waiting_per_pod: float
    max_pods: int
    min_pods: int = 1
    tolerance: float = 0.1
    scale_down_window_s: float = 300.0
    interval_s: float = 15.0  # HPA's --horizontal-pod-autoscaler-sync-period
    name: str = "queue-only"
    _recommendations: deque[tuple[float, int]] = field(default_factory=deque)

    def desired(self, metric_per_pod: float, current: int) -> int:
        """HPA's formula with its tolerance; ``current`` 0 (nothing to scale) stays 0 here."""
        ratio = metric_per_pod / self.target_waiting_per_pod
        if abs(ratio - 1.0) <= self.tolerance:
            return current
        return math.ceil(current * ratio)

    def decide(self, signals: FleetSignals, current: int, now_s: float) -> int:
        if current == 0:
            return self.min_pods
        metric = signals.waiting / max(current, 1)
        wanted = min(max(self.desired(metric, current), self.min_pods), self.max_pods)
        self._recommendations.append((now_s, wanted))
        while self._recommendations and self._recommendations[0][0] < now_s - self.scale_down_window_s:
            self._recommendations.popleft()
        if wanted >= current:
            return wanted
        return min(current, max(pods for _t, pods in self._recommendations))


@dataclass
class KubeAiScaler:
    target_requests: float
    max_pods: int
    min_pods: int = 0
    interval_s: float = 10.0  # KubeAI's modelAutoscaling.interval default
    time_window_s: float = 600.0  # modelAutoscaling.timeWindow default
    scale_down_delay_s: float = 30.0  # Model.spec.scaleDownDelaySeconds default
    name: str = "kubeai"
    _samples: deque[float] = field(default_factory=deque)
    _consecutive_downs: int = 0

    def __post_init__(self) -> None:
        self._samples = deque([0.0] * self.window_count, maxlen=self.window_count)

    @property
    def window_count(self) -> int:
        return math.ceil(self.time_window_s / self.interval_s)

    @property
    def required_downs(self) -> int:
        return math.ceil(self.scale_down_delay_s / self.interval_s)

    def decide(self, signals: FleetSignals, current: int, now_s: float) -> int:
        self._samples.append(float(signals.router_requests))
        average = sum(self._samples) / len(self._samples)
        wanted = min(max(math.ceil(average / self.target_requests), self.min_pods), self.max_pods)
        if current == 0 and signals.held_requests > 0:
            wanted = max(wanted, 1)  # the proxy's ScaleAtLeastOneReplica
        if wanted < current:
            if self._consecutive_downs < self.required_downs:
                self._consecutive_downs += 1
                return current
        else:
            self._consecutive_downs = 0
        return wanted


@dataclass
class ForesightScaler:
    bound: ScaleBound
    interval_s: float = 1.0  # the simulation's scrape: a decision at every one
    name: str = "foresight"

    def decide(self, signals: FleetSignals, current: int, now_s: float) -> int:
        return max(self.bound.pods_at(now_s), self.bound.pods_at(now_s + self.interval_s))


@dataclass
class HoldWatchRule:
    """The operator's hold watch over one router (``trtfleet_operator.holdwatch.HoldWatch._follow``): a decision
    at once when requests are held in a new hold episode, or more are held than the watch's last decision in it
    sized the fleet for; at most one such decision per ``DECIDE_GAP_S`` (a blocked one is asked again after it).
    The router answers its long poll within milliseconds; the simulation asks at each 1 s scrape."""

    per_pod: float | None
    cursor: Cursor | None = None
    decided_s: float = -math.inf

    def wants_decision(self, held: int, episode: int, now_s: float) -> bool:
        """Whether the watch decides now; call :meth:`decided` after that decision."""
        answer = HeldAnswer("router", held, episode)
        if is_new(answer, self.cursor):
            return bool(now_s - self.decided_s >= DECIDE_GAP_S)  # else asked again, the cursor unchanged
        self.cursor = advance(answer, self.cursor, False, self.per_pod)
        return False

    def decided(self, held: int, episode: int, now_s: float) -> None:
        self.cursor = advance(HeldAnswer("router", held, episode), self.cursor, True, self.per_pod)
        self.decided_s = now_s


@dataclass
class TrtfleetScaler:
    spec: AutoscalingSpec
    lora_pages_per_pod: int | None
    interval_s: float = 15.0  # the operator's --autoscale-interval default
    name: str = "trtfleet"
    history: tuple[Recommended, ...] = ()
    last_reason: str = ""
    hold_watch: HoldWatchRule | None = None
    """The operator's long poll for held requests (its default, ``--held-wait 20``); None: the timer alone."""

    def decide(self, signals: FleetSignals, current: int, now_s: float) -> int:
        demand = DemandSignals(
            router_requests=signals.router_requests,
            held_requests=signals.held_requests,
            pod_requests=signals.pod_running + signals.pod_queued,
            kv_cache_fraction=signals.kv_cache_fraction,
            active_adapter_pages=signals.active_adapter_pages,
            ready_pods=signals.ready_pods,
        )
        decision = decide(self.spec, demand, self.history, current, now_s,
                          lora_pages_per_pod=self.lora_pages_per_pod)
        self.history = decision.history
        self.last_reason = decision.reason.value
        return decision.replicas
