"""Tenants on the simulated fleet: the router's admission (bands, tenant order, saturation) in front of
:class:`bench.simulate.FleetSimulation`'s pods and routing.

Three admissions, the same pods, routing policy and trace:

* ``fcfs``: the router as it was: no queue of its own; every request goes to a pod at once and waits in the pod's
  queue (first come, first served; a full pod queue refuses, and the router retries elsewhere as it does);
* ``llmd``: llm-d's flow control re-implemented (``routing/baselines/llmd_flow_control.py``): requests wait in the
  router while the utilization detector over the pods' scraped queue and KV use says saturated; a dispatch cycle
  every millisecond starts one request (bands strictly, round robin over tenants, oldest first); a band holds at
  most ``5000`` requests, each at most 60 s (its defaults);
* ``vtc``: trtfleet's (``upstream/admission.py`` with the real :class:`~trtfleet_router.routing.fairqueue.FairQueue`
  and :class:`~trtfleet_router.routing.vtc.VirtualTokenCounters`): requests wait in the router while the requests in
  flight reach ``inflight_per_pod`` on every pod (and a request goes only to a pod with room), strict bands, the
  least-served tenant by weighted tokens first; a
  request turned away when the line's drain estimate says it cannot start within ``capacity_wait_s``, or when the
  line is full and it displaces nobody (the router's rules, with its :class:`~trtfleet_router.upstream.capacity.
  DrainRate`); tenants charged the prompt when a request starts and the output when it ends (the router charges
  output as it streams; the simulator's pods report a request's tokens only at its end). With
  ``reserved_per_pod`` N, a flooding request (:func:`~trtfleet_router.routing.tenancy.may_take_reserved` over the
  router's :class:`~trtfleet_router.routing.tenancy.ServedShares`, charged the same way) sees the limit
  ``inflight_per_pod - N``, and the room above it goes to the first waiter that may take it, as the router does.

Arrivals are open loop (Poisson per tenant), so a tenant over its share builds a backlog wherever requests wait.
"""

from __future__ import annotations

import dataclasses
import math
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Final

from trtfleet_router.routing.baselines.llmd_flow_control import RoundRobinOrder, pool_saturation
from trtfleet_router.routing.fairqueue import ArrivalOrder, Entry, FairQueue, Priority, TenantOrder
from trtfleet_router.routing.tenancy import ServedShares, may_take_reserved
from trtfleet_router.routing.types import RouteRequest, Ticket
from trtfleet_router.routing.vtc import INPUT_COST_DEFAULT, OUTPUT_COST_DEFAULT, VirtualTokenCounters
from trtfleet_router.upstream.capacity import DrainRate

from bench.podsim import SimRequest
from bench.simulate import FIRST_OWN_EVENT, FleetSimulation, FleetSpec, RequestRecord, sim_routing_config
from bench.traces import LengthSpec, TraceRequest

ADMISSIONS: Final = ("fcfs", "llmd", "vtc")
LLMD_CYCLE_S: Final = 0.001
LLMD_BAND_MAX_REQUESTS: Final = 5000
LLMD_REQUEST_TTL_S: Final = 60.0
LLMD_SCRAPE_INTERVAL_S: Final = 0.05
"""llm-d's default metrics refresh (its detector would be blind at the router's 1 s)."""
_TICK: Final = FIRST_OWN_EVENT
_EXPIRE: Final = FIRST_OWN_EVENT + 1


PROMPT: Final = LengthSpec(median=1000, sigma=0.5, min_tokens=64, max_tokens=4000)
OUTPUT: Final = LengthSpec(median=250, sigma=0.6, min_tokens=16, max_tokens=1024)
"""Every tenant's request sizes (lognormal: equal sizes would finish in lock-step cohorts on 64 identical pods)."""


@dataclass(frozen=True, slots=True)
class Traffic:
    """One tenant's open-loop load: Poisson arrivals on one adapter, sizes drawn from ``prompt`` and ``output``."""

    tenant: str
    band: Priority
    rate_per_s: float
    adapter: str
    start_s: float = 0.0
    prompt: LengthSpec = PROMPT
    output: LengthSpec = OUTPUT


def _draw(rng: random.Random, spec: LengthSpec) -> int:
    value = round(spec.median * math.exp(spec.sigma * rng.gauss(0.0, 1.0)))
    return min(spec.max_tokens, max(spec.min_tokens, value))


def tenant_trace(traffic: Sequence[Traffic], duration_s: float, seed: int) -> tuple[list[TraceRequest], list[Traffic]]:
    """Requests of every tenant merged by time; beside them the traffic each came from."""
    rng = random.Random(seed)
    arrivals: list[tuple[float, int]] = []
    for index, source in enumerate(traffic):
        t = source.start_s
        while True:
            t += rng.expovariate(source.rate_per_s)
            if t >= duration_s:
                break
            arrivals.append((t, index))
    arrivals.sort()
    trace = []
    for index, (t, flow) in enumerate(arrivals):
        spec = traffic[flow]
        trace.append(TraceRequest(t, f"r{index}", spec.adapter, _draw(rng, spec.prompt), _draw(rng, spec.output)))
    return trace, [traffic[flow] for _t, flow in arrivals]


@dataclass(frozen=True, slots=True)
class Admission:
    mode: str
    inflight_per_pod: int = 64
    capacity_wait_s: float = 10.0
    queue_max: int = 1024
    weights: tuple[tuple[str, float], ...] = ()
    reserved_per_pod: int = 0
    """vtc: each pod's last slots below ``inflight_per_pod`` only for requests not flooding (0: none)."""

    def weight(self, tenant: str) -> float:
        return dict(self.weights).get(tenant, 1.0)

    def order(self) -> TenantOrder:
        if self.mode == "vtc":
            return VirtualTokenCounters(dict(self.weights))
        return RoundRobinOrder() if self.mode == "llmd" else ArrivalOrder()


class TenantSimulation(FleetSimulation):
    def __init__(
        self, trace: Sequence[TraceRequest], flows: Sequence[Traffic], spec: FleetSpec, admission: Admission, *,
        seed: int = 0,
    ) -> None:
        if admission.mode not in ADMISSIONS:
            raise ValueError(f"admission {admission.mode!r} is not one of {', '.join(ADMISSIONS)}")
        if admission.mode == "llmd":
            spec = dataclasses.replace(spec, scrape_interval_s=LLMD_SCRAPE_INTERVAL_S)
        config = sim_routing_config({"policy": "ttft-cost", "capacityWaitS": 0})
        super().__init__(trace, "ttft-cost", spec, seed=seed, config=config)
        self.flows = flows
        self.admission = admission
        self.order = admission.order()
        self.line: FairQueue[int] = FairQueue(self.order)
        self.entries: dict[int, Entry[int]] = {}
        self.expires: dict[int, float] = {}
        self.drain = DrainRate(lambda: self.now_s)
        self.saturation = 0.0  # llmd: the detector's pool saturation as of the last scrape
        self.ticking = False
        self.started_s: dict[int, float] = {}
        self.shares = ServedShares(lambda: self.now_s)

    # -- admission ---------------------------------------------------------------------------------------
    def _try_route(self, key: int) -> None:
        record = self.records[key]
        if self.admission.mode == "fcfs" or record.attempts > 0:
            super()._try_route(key)
            return
        flow = self.flows[key]
        reserved = self._may_reserve(flow.tenant, flow.band)
        if self.admission.reserved_per_pod and reserved:
            ahead = self.line.waiting_from(flow.band, self._may_reserve)
        else:
            ahead = self.line.waiting_from(flow.band)
        if self._saturated(reserved) or ahead > 0:
            self._enqueue(key)
            if self.admission.mode == "llmd":
                self._tick_soon()
            return
        self.line.passed(flow.tenant, flow.band)
        self._start(key)

    def _start(self, key: int) -> None:
        flow = self.flows[key]
        self.order.charge(flow.tenant, input_tokens=self.trace[key].prompt_tokens)
        self.shares.add(flow.tenant, INPUT_COST_DEFAULT * self.trace[key].prompt_tokens)
        self.started_s[key] = self.now_s
        super()._try_route(key)

    def _may_reserve(self, tenant: str, band: Priority) -> bool:
        """Whether a request may take the pods' reserved slots (always without a reserve)."""
        if not self.admission.reserved_per_pod:
            return True
        return may_take_reserved(band, self.shares.over_share(tenant, self.admission.weight) is not None)

    def _limit(self, reserved: bool) -> int:
        return self.admission.inflight_per_pod - (0 if reserved else self.admission.reserved_per_pod)

    def _saturated(self, reserved: bool = True) -> bool:
        if self.admission.mode == "llmd":
            return self.saturation >= 1.0
        return self.fleet.room(self._limit(reserved))[0] <= 0

    def _route_request(self, record: RequestRecord) -> RouteRequest:
        """vtc: kept off the pods that hold ``inflight_per_pod`` already, as the router keeps it."""
        route = super()._route_request(record)
        if self.admission.mode != "vtc":
            return route
        flow = self.flows[record.key]
        free, full = self.fleet.room(self._limit(self._may_reserve(flow.tenant, flow.band)))
        if not full or free <= 0:
            return route
        return dataclasses.replace(route, exclude_pods=route.exclude_pods | full)

    def _enqueue(self, key: int) -> None:
        flow = self.flows[key]
        if self.admission.mode == "llmd":
            if self.line.waiting(flow.band) >= LLMD_BAND_MAX_REQUESTS:
                self._shed(key, "queue_full")
                return
            wait_s = LLMD_REQUEST_TTL_S
        else:
            wait_s = self.admission.capacity_wait_s
            expected = self.drain.wait_s(self.model_name, self.line.ahead(flow.band, flow.tenant))
            if expected is not None and expected > wait_s:
                self._shed(key, "hopeless")
                return
            if len(self.line) - self.line.waiting(Priority.BATCH) >= self.admission.queue_max:
                victim = self.line.displaceable(flow.band, flow.tenant)
                if victim is None:
                    self._shed(key, "queue_full")
                    return
                self.line.remove(victim)
                self._drop_waiting(victim.item)
                self._shed(victim.item, "pushed_out")
        self.entries[key] = self.line.push(key, flow.band, flow.tenant)
        self.expires[key] = self.now_s + wait_s
        self._push(self.now_s + wait_s, _EXPIRE, key)

    def _drop_waiting(self, key: int) -> None:
        self.entries.pop(key, None)
        self.expires.pop(key, None)
        self.records[key].waited_s = self.now_s - self.records[key].arrival_s

    def _shed(self, key: int, reason: str) -> None:
        self._fail(self.records[key], reason)

    def _dispatch(self) -> None:
        """Start waiting requests while the fleet has room (vtc: each end frees one; llmd: one a cycle)."""
        if self.admission.mode == "llmd":
            self._tick_soon()
            return
        while self.line and not self._saturated():
            if not self.admission.reserved_per_pod or not self._saturated(reserved=False):
                self._start_next()
            elif not self._start_next(self._may_reserve):
                break  # only reserved room, and nobody waiting may take it

    def _start_next(self, eligible: Callable[[str, Priority], bool] | None = None) -> bool:
        entry = self.line.pop(eligible)
        if entry is None:
            return False
        self._drop_waiting(entry.item)
        self._start(entry.item)
        return True

    def _tick_soon(self) -> None:
        if not self.ticking and self.line:
            self.ticking = True
            self._push(self.now_s + LLMD_CYCLE_S, _TICK, None)

    def _tick(self) -> None:
        self.ticking = False
        if self.line and not self._saturated():
            self._start_next()
        self._tick_soon()

    def _expire(self, key: int) -> None:
        entry = self.entries.get(key)
        if entry is None or self.expires.get(key, math.inf) > self.now_s:
            return
        self.line.remove(entry)
        self._drop_waiting(key)
        self._shed(key, "timed_out")

    # -- events ------------------------------------------------------------------------------------------
    def _event(self, kind: int, payload: object) -> None:
        if kind == _TICK:
            self._tick()
        elif kind == _EXPIRE:
            assert isinstance(payload, int)
            self._expire(payload)
        else:
            super()._event(kind, payload)

    def _finish(self, key: int, ticket: Ticket, request: SimRequest) -> None:
        super()._finish(key, ticket, request)
        flow = self.flows[key]
        self.order.charge(flow.tenant, output_tokens=request.max_tokens)
        self.shares.add(flow.tenant, OUTPUT_COST_DEFAULT * request.max_tokens)
        self.drain.record_end(self.model_name)
        if self.admission.mode != "fcfs":
            self._dispatch()

    def _scrape(self) -> None:
        super()._scrape()
        if self.admission.mode == "llmd":
            self.saturation = pool_saturation(
                [(pod.queue_depth, pod.kv_used_fraction()) for pod in self.pods.values()]
            )
            self._tick_soon()

