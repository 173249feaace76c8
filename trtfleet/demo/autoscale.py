"""``trtfleet demo --autoscale N``: workers started and stopped by the operator's own decision function.

Every ``TICK_S`` the demo reads the router's ``/metrics`` (:func:`trtfleet.demand.parse_router_metrics`),
asks :func:`trtfleet.autoscaling.decide` for a worker count between 0 and N (the spec below: short
windows so a laptop shows 0 -> N -> 0 within a minute) and resizes a :class:`WorkerPool`:

* a new worker process joins the router's fleet file once it answers its health check; until then the
  router holds the requests (its routing file sets ``holdWaitS``), so nothing is lost at zero;
* a worker to stop leaves the fleet file first, and is stopped once the router no longer lists it and
  has no request in flight on it (bounded by ``DRAIN_TIMEOUT_S``).
"""

from __future__ import annotations

import json
import time
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Final

import yaml

from trtfleet.api import AutoscalingSpec
from trtfleet.autoscaling import DemandSignals, Recommended, decide
from trtfleet.demand import MetricsParseError, parse_router_metrics, prometheus_samples
from trtfleet.demo.fleet import BASE_MODEL, WorkerEndpoint
from trtfleet.demo.processes import Child

TICK_S: Final = 1.0
HOLD_WAIT_S: Final = 300.0
DRAIN_TIMEOUT_S: Final = 30.0
TARGET_REQUESTS_PER_WORKER: Final = 2.0
SCALE_DOWN_WINDOW_S: Final = 10
ZERO_AFTER_S: Final = 30


def demo_spec(max_workers: int, zero_after_s: int = ZERO_AFTER_S) -> AutoscalingSpec:
    return AutoscalingSpec(
        min_replicas=0,
        max_replicas=max_workers,
        target_requests_per_pod=TARGET_REQUESTS_PER_WORKER,
        target_kv_cache_fraction=None,
        adapter_working_set=False,
        scale_down_stabilization_seconds=min(SCALE_DOWN_WINDOW_S, zero_after_s),
        scale_to_zero_after_seconds=zero_after_s,
    )


def write_routing_file(path: Path) -> Path:
    """The router's routing file: hold requests while no worker is ready."""
    path.write_text(yaml.safe_dump({"holdWaitS": HOLD_WAIT_S}))
    return path


@dataclass
class WorkerPool:
    """Worker processes; the router's fleet file lists the ready ones."""

    spawn: Callable[[int], tuple[WorkerEndpoint, Child]]
    ready: Callable[[WorkerEndpoint], bool]
    write_fleet: Callable[[list[WorkerEndpoint]], None]
    drained: Callable[[WorkerEndpoint], bool]
    serving: list[tuple[WorkerEndpoint, Child]] = field(default_factory=list)
    starting: list[tuple[WorkerEndpoint, Child]] = field(default_factory=list)
    next_index: int = 1

    def size(self) -> int:
        return len(self.serving) + len(self.starting)

    def children(self) -> list[Child]:
        return [c for _, c in (*self.serving, *self.starting)]

    def resize(self, target: int) -> None:
        while self.size() < target:
            self.starting.append(self.spawn(self.next_index))
            self.next_index += 1
        while self.size() > target:
            if self.starting:  # never served: stop at once
                self.starting.pop()[1].stop(DRAIN_TIMEOUT_S)
                continue
            worker, child = self.serving.pop()
            self.write_fleet([w for w, _ in self.serving])
            deadline = time.monotonic() + DRAIN_TIMEOUT_S
            while not self.drained(worker) and time.monotonic() < deadline:
                time.sleep(0.1)
            child.stop(DRAIN_TIMEOUT_S)

    def poll(self) -> list[WorkerEndpoint]:
        """Workers that became ready since the last poll (now in the fleet file)."""
        joined = [(w, c) for w, c in self.starting if self.ready(w)]
        if joined:
            self.starting = [(w, c) for w, c in self.starting if (w, c) not in joined]
            self.serving.extend(joined)
            self.write_fleet([w for w, _ in self.serving])
        return [w for w, _ in joined]


def router_drained(metrics_url: str, worker: WorkerEndpoint) -> bool:
    """The router no longer lists ``worker`` and has no request in flight on it."""
    try:
        with urllib.request.urlopen(metrics_url.replace("/metrics", "/debug/fleets"), timeout=5) as resp:
            pods = [p["pod_id"] for p in json.loads(resp.read()).get(BASE_MODEL, {}).get("pods", [])]
        with urllib.request.urlopen(metrics_url, timeout=5) as resp:
            samples = prometheus_samples(resp.read().decode())
    except (OSError, ValueError):
        return False
    inflight = sum(v for n, labels, v in samples
                   if n == "trtfleet_router_inflight_requests" and labels.get("pod") == worker.name)
    return worker.name not in pods and inflight == 0


class DemoAutoscaler:
    """One decision per tick from the router's demand; the history stays in memory (a demo restarts cold)."""

    def __init__(self, spec: AutoscalingSpec, pool: WorkerPool, metrics_url: str,
                 say: Callable[[str], None], now: Callable[[], float] = time.monotonic) -> None:
        self.spec = spec
        self.pool = pool
        self.metrics_url = metrics_url
        self.say = say
        self.now = now
        self.history: tuple[Recommended, ...] = ()

    def tick(self) -> None:
        signals: DemandSignals | None
        try:
            with urllib.request.urlopen(self.metrics_url, timeout=5) as resp:
                reading = parse_router_metrics(resp.read().decode(), BASE_MODEL)
            signals = DemandSignals(reading.requests, reading.held, ready_pods=len(self.pool.serving))
        except (OSError, MetricsParseError):
            signals = None
        current = self.pool.size()
        decision = decide(self.spec, signals, self.history, current, self.now())
        self.history = decision.history
        if decision.replicas != current:
            self.pool.resize(decision.replicas)  # a stop waits for the worker's requests (the drain)
            self.say(f"[{time.strftime('%H:%M:%S')}] autoscaler {decision.reason.value}: {decision.message}")
        for worker in self.pool.poll():
            self.say(f"[{time.strftime('%H:%M:%S')}] {worker.name} ready: in the router's fleet")
