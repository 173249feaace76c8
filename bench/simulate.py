"""Discrete-event simulation of a trtfleet fleet, driving the router's REAL routing code.

Every decision comes from :class:`trtfleet_router.routing.fleet.Fleet` with a policy from the router's
own registry (``build_policy``): route -> start -> finish, scraped metrics through ``observe_metrics``,
exactly the calls the router's server makes. Pods are :class:`bench.podsim.SimPod` (in-flight batching
steps from :class:`bench.podsim.StepTimeModel`, the real :class:`trtfleet.loracache.LoraPageCache`).

What a request goes through (times in simulated seconds; the clock is the event queue's):

1. arrival at the router (trace time); ``Fleet.route`` (its measured wall time is added to the request's
   latency when ``add_decision_time``) and ``Fleet.start``;
2. weights, when the decision sends them: fetched from artifact storage unless the router's weight store
   (an LRU of ``router_store_bytes``) holds them; then the request crosses the pod's inbound link
   (``link_bytes_per_s``, FIFO per pod) plus ``one_way_latency_s``;
3. the pod's executor takes it (``SimPod.arrive``): miss / cache full / queue full come back as errors
   after one more one-way latency and the router retries like the server does (miss: route again; cache
   full, queue full: route again excluding that pod; at most ``max_attempts`` attempts); when every
   cache is full of busy adapters (``CachesBusy``) the request waits in the router's FIFO as the
   dispatcher does (``capacity_wait_s``, ``capacity_queue_max``; routed again each time a request ends),
   any other "no capacity" from the Fleet is the 503 the server answers, an error for the client; the
   pod's admission confirms the ticket (``Fleet.confirm``); a *loading* decision sends weights too;
4. steps until its last token; first and last tokens reach the client one latency later.

``runtime="pytorch"`` (trtllm-serve pods): adapters are ``read_by_pod`` for the router's cost model; nothing
travels with a request (no artifact fetch, no link transfer), the pod reads a cold adapter at
``pod_read_bytes_per_s`` (:class:`bench.podsim.SimPod`), never answers a miss, and holds a request whose
adapter finds no host pages in its own queue.

Router replicas (``FleetSpec.router_replicas``, ``router_view``): with ``shadow`` each replica is its own
:class:`RouterReplica` (a ``Fleet``, a weight store and a capacity queue) that sees only the requests the
Service sends it (each request, retries included, goes to one replica drawn by a seeded RNG) and scrapes
every pod; the pods' true caches are the simulated pods' own, so a replica's stale view shows as misses and
repeated weight sends. With ``shared`` one view takes every request: the single router exactly; with a
``router_view_delay_s`` too, each replica has its own view and the others' events reach it that much later
(:class:`bench.simpeers.DelayedMirror`).

Placement (``placement.enabled`` in the routing config): every ``placement.intervalS`` each replica's fleet
re-plans the host copies of the ``registered`` adapters (default: the trace's) and every
``placement.prefetch.tickS`` asks for due prefetches; each is a one-token request pinned to its pod with
the weights (runtime ``tensorrtllm``; a pytorch pod reads them), on the same link as requests' weights, recorded
as a *background* record (no demand, never retried, not in the latency figures).

The result counts, per request: hit (adapter resident at admission, see ``bench.optimal``), the pod loads
it caused, weight bytes sent, TTFT, end-to-end latency, output tokens, errors by kind.
"""

from __future__ import annotations

import dataclasses
import heapq
import math
import time
from collections.abc import Sequence
from typing import Any

from trtfleet_router.routing.config import RoutingConfig
from trtfleet_router.routing.fleet import Fleet
from trtfleet_router.routing.policies import parse_routing_config
from trtfleet_router.routing.prefix import NO_BLOCKS, PromptBlocks
from trtfleet_router.routing.types import (
    AdapterRef,
    AdapterTooLarge,
    CachesBusy,
    Decision,
    NoCapacity,
    Outcome,
    PodInfo,
    PodMetrics,
    RouteRequest,
    Ticket,
)

from bench.podsim import ArrivalError, SimPod, SimRequest
from bench.simpeers import CONFIRM, FINISH, FIRST_TOKEN, START, RouterReplica, build_router_views
from bench.simtypes import (
    RUNTIMES,
    FleetSpec,
    RequestRecord,
    SimResult,
    adapter_refs,
)
from bench.traces import TraceRequest

__all__ = ["RUNTIMES", "FleetSimulation", "FleetSpec", "RequestRecord", "SimResult", "adapter_refs", "simulate"]

(_ARRIVAL, _DELIVER, _STEP_END, _REPLY_ERROR, _FINISH, _SCRAPE, _WAIT_TIMEOUT, _READ_DONE, _MIRROR, _REPLAN,
 _PREFETCH) = range(11)
PREFETCH_PROMPT_TOKENS = 3  # the router's prewarm prompt (trtfleet_router.upstream.prewarm)
FIRST_OWN_EVENT = 100
"""Event kinds from here on are a subclass's (:meth:`FleetSimulation._event`)."""
_OUTCOMES = {"miss": Outcome.MISS, "cache_full": Outcome.CACHE_FULL, "queue_full": Outcome.FAILED}


SIM_LOAD_PRICES = {"loadOverheadS": 0.0, "podReadOverheadS": 0.0}
"""The simulated pods pay no fixed cost per cold load (a load is its bytes over the link or the pod's read),
so the trtfleet policies are told so: the router prices what its pods pay (the real runs measure theirs)."""


def sim_routing_config(data: dict[str, Any], spec: FleetSpec | None = None) -> RoutingConfig:
    """:func:`parse_routing_config` of ``data`` with :data:`SIM_LOAD_PRICES` in the trtfleet policies' blocks and,
    given ``spec``, ``tiered-cost``'s copy bandwidth set to what the simulated pods pay: they copy whole cache pages
    (``adapter_pages x page_bytes``) at ``host_to_device_bytes_per_s``, the policy prices ``weights_bytes``."""
    merged = dict(data)
    for section in ("ttft_cost", "adapter_affinity", "tiered_cost"):
        merged[section] = {**SIM_LOAD_PRICES, **dict(data.get(section) or {})}
    if spec is not None:
        copied = spec.adapter_pages * spec.pod.page_bytes
        merged["tiered_cost"] = {
            "hostToDeviceBytesPerS": spec.pod.host_to_device_bytes_per_s * spec.adapter_weights_bytes / copied,
            "linkBandwidthBytesPerS": spec.link_bytes_per_s,
            **merged["tiered_cost"],
        }
    return parse_routing_config(merged)


class FleetSimulation:
    def __init__(
        self,
        trace: Sequence[TraceRequest],
        policy: str,
        spec: FleetSpec,
        *,
        seed: int = 0,
        config: RoutingConfig | None = None,
        model_name: str = "llama3-8b",
        replica_of: Sequence[int] | None = None,
        registered: Sequence[str] | None = None,
    ) -> None:
        """``replica_of``: the replica each request goes to in the ``shadow`` view (default: seeded draws);
        ``registered``: the adapters the placement plans (default: the trace's)."""
        self.trace = list(trace)
        self.spec = spec
        self.now_s = 0.0
        routing = config if config is not None else sim_routing_config({"policy": policy}, spec)
        if routing.policy != policy:
            routing = routing.model_copy(update={"policy": policy})
        views = build_router_views(spec, routing, seed=seed, model_name=model_name, now=lambda: self.now_s,
                                   requests=len(trace), replica_of=replica_of)
        self.replicas, self.mirror, self.replica_of = views.replicas, views.mirror, views.replica_of
        self.fleet = self.replicas[0].fleet
        self.counters = dict.fromkeys(("warm_routes", "cold_loads", "misses", "cache_full"), 0)
        self.reads = spec.runtime == "pytorch"
        pod_spec = dataclasses.replace(spec.pod, read_bytes_per_s=spec.pod_read_bytes_per_s) if self.reads else spec.pod
        self.block_tokens = spec.pod.kv_tokens_per_block
        self.pods = {f"pod-{i:02d}": SimPod(f"pod-{i:02d}", pod_spec, spec.model) for i in range(spec.pods)}
        kv_blocks = spec.pod.kv_capacity_tokens // self.block_tokens
        infos = {
            pod_id: PodInfo(pod_id, f"{pod_id}:8001", f"uid-{pod_id}", spec.pod.host_pages, spec.pod.device_pages,
                            kv_blocks=kv_blocks)
            for pod_id in self.pods
        }
        for replica in self.replicas:
            replica.fleet.set_pods(infos)
        names = sorted({r.adapter for r in trace} | set(registered or ()))
        self.refs = adapter_refs(names, spec.adapter_pages, spec.adapter_weights_bytes, self.reads)
        planned = sorted(set(registered)) if registered is not None else sorted({r.adapter for r in trace})
        self.registered: list[AdapterRef] = [self.refs[name] for name in planned]
        self.background: set[int] = set()  # keys of prefetch records
        self.link_free_s = dict.fromkeys(self.pods, 0.0)
        self.records = [RequestRecord(i, r.t_s, r.adapter) for i, r in enumerate(trace)]
        self.decision_times_s: list[float] = []
        self.admitted: list[str] = []
        self._events: list[tuple[float, int, int, object]] = []
        self._seq = 0
        self._open = 0
        self.model_name = model_name
        self.routing = routing
        self.horizon_s = 0.0  # scrapes go on until then even when nothing is open (bench/simscale.py)

    def _push(self, at_s: float, kind: int, payload: object) -> None:
        self._seq += 1
        heapq.heappush(self._events, (at_s, self._seq, kind, payload))

    def run(self) -> SimResult:
        started = time.perf_counter()
        for index, request in enumerate(self.trace):
            self._push(request.t_s, _ARRIVAL, index)
        self._push(0.0, _SCRAPE, None)
        placement = self.routing.placement
        if placement.enabled:
            self._push(0.0, _REPLAN, None)
            self._push(0.0, _PREFETCH, None)
        remaining_arrivals = len(self.trace)
        events = self._events
        while events:
            at_s, _seq, kind, payload = heapq.heappop(events)
            self.now_s = at_s
            if kind == _STEP_END:
                self._step_end(payload)  # type: ignore[arg-type]
            elif kind == _ARRIVAL:
                remaining_arrivals -= 1
                self._open += 1
                self._try_route(payload)  # type: ignore[arg-type]
            elif kind == _DELIVER:
                self._deliver(*payload)  # type: ignore[misc]
            elif kind == _FINISH:
                self._finish(*payload)  # type: ignore[misc]
            elif kind == _REPLY_ERROR:
                self._reply_error(*payload)  # type: ignore[misc]
            elif kind == _READ_DONE:
                self._kick(payload)  # type: ignore[arg-type]
            elif kind == _MIRROR:
                assert self.mirror is not None
                self.mirror.replay(*payload)  # type: ignore[misc]
            elif kind == _WAIT_TIMEOUT:
                self._wait_timeout(payload)  # type: ignore[arg-type]
            elif kind == _SCRAPE:
                self._scrape()
                if remaining_arrivals or self._open or at_s < self.horizon_s:
                    self._push(at_s + self.spec.scrape_interval_s, _SCRAPE, None)
            elif kind == _REPLAN:
                for replica in self.replicas:
                    replica.fleet.replan(self.registered)
                if remaining_arrivals or at_s < self.horizon_s:
                    self._push(at_s + placement.interval_s, _REPLAN, None)
            elif kind == _PREFETCH:
                self._prefetch_tick()
                if remaining_arrivals or at_s < self.horizon_s:
                    self._push(at_s + placement.prefetch.tick_s, _PREFETCH, None)
            else:
                self._event(kind, payload)
        counters = {**self.counters, "open_tickets": 0, "artifact_fetches": 0}  # each request counted once
        counters["device_copies"] = sum(pod.device_copies_total for pod in self.pods.values())
        counters["device_copy_bytes"] = sum(pod.device_copy_bytes_total for pod in self.pods.values())
        for replica in self.replicas:
            replica.fleet.check_invariants()
            counters["open_tickets"] += replica.fleet.snapshot().open_tickets
            counters["artifact_fetches"] += replica.store.fetches
        return SimResult(
            policy=self.fleet.policy_name,
            records=self.records,
            decision_times_s=self.decision_times_s,
            pod_loads=sum(pod.loads_total for pod in self.pods.values()),
            pod_busy_s=[pod.busy_s for pod in self.pods.values()],
            sim_end_s=self.now_s,
            fleet_counters=counters,
            wall_s=time.perf_counter() - started,
            admitted_adapters=self.admitted,
        )

    def _event(self, kind: int, payload: object) -> None:
        """An event of a kind a subclass added (numbered from :data:`FIRST_OWN_EVENT`)."""
        raise ValueError(f"unknown simulation event {kind}")

    # -- router side -------------------------------------------------------------------------------------
    def _route_request(self, record: RequestRecord) -> RouteRequest:
        request = self.trace[record.key]
        return RouteRequest(
            model=self.model_name,
            adapter=self.refs[request.adapter],
            prompt_tokens=request.prompt_tokens,
            max_tokens=request.max_tokens,
            request_id=request.request_id,
            exclude_pods=frozenset(record.excluded),
            blocks=PromptBlocks(request.blocks, self.block_tokens, True) if request.blocks else NO_BLOCKS,
        )

    def _fail(self, record: RequestRecord, kind: str) -> None:
        record.error = kind
        self._open -= 1

    def _replica(self, key: int) -> RouterReplica:
        return self.replicas[self.replica_of[key]]

    def _share(self, key: int, op: str, ticket: Ticket, detail: object) -> None:
        """A delayed shared view: the other replicas replay this call ``router_view_delay_s`` later."""
        if self.mirror is not None:
            self._push(self.now_s + self.spec.router_view_delay_s, _MIRROR, (self.replica_of[key], op, ticket, detail))

    def _try_route(self, key: int) -> None:
        if not self._route_once(key):
            replica = self._replica(key)
            if len(replica.waiting) >= self.routing.capacity_queue_max or self.routing.capacity_wait_s <= 0:
                self._fail(self.records[key], "no_capacity")
                return
            replica.waiting.append(key)
            replica.wait_since[key] = self.now_s
            self._push(self.now_s + self.routing.capacity_wait_s, _WAIT_TIMEOUT, key)

    def _wake(self, replica: RouterReplica) -> None:
        """A request of ``replica`` ended: its waiters route again in FIFO order until one finds no room."""
        while replica.waiting:
            key = replica.waiting[0]
            if self._route_once(key):
                replica.waiting.popleft()
                since = replica.wait_since.pop(key)
                self.records[key].waited_s += self.now_s - since
            else:
                return

    def _wait_timeout(self, key: int) -> None:
        replica = self._replica(key)
        since = replica.wait_since.pop(key, None)
        if since is None:
            return  # routed meanwhile
        replica.waiting.remove(key)
        self.records[key].waited_s += self.now_s - since
        self._fail(self.records[key], "no_capacity")  # 503 after the bounded wait

    def _route_once(self, key: int) -> bool:
        """Route and send ``key``; False when every cache is full of busy adapters (wait for capacity)."""
        record = self.records[key]
        replica = self._replica(key)
        route_request = self._route_request(record)
        began = time.perf_counter()
        try:
            decision = replica.fleet.route(route_request)
        except CachesBusy:
            return False
        except NoCapacity:
            self._fail(record, "no_capacity")  # the server answers 503 + Retry-After; the client sees it
            return True
        except AdapterTooLarge:
            self._fail(record, "adapter_too_large")
            return True
        elapsed = time.perf_counter() - began
        self.decision_times_s.append(elapsed)
        self.counters["cold_loads" if decision.send_weights else "warm_routes"] += 1
        self._send(key, replica.fleet, decision, route_request, elapsed if self.spec.add_decision_time else 0.0)
        return True

    def _send(self, key: int, fleet: Fleet, decision: Decision, route_request: RouteRequest, delay_s: float) -> None:
        """Start ``decision`` in the fleet and send the request: weights over the pod's link when they travel."""
        record = self.records[key]
        replica = self._replica(key)
        ticket = fleet.start(decision, route_request)
        self._share(key, START, ticket, (decision, route_request))
        record.attempts += 1
        depart_s = self.now_s + delay_s
        adapter = route_request.adapter
        assert adapter is not None
        with_weights = decision.send_weights or decision.loading
        if with_weights and not self.reads:
            ready_s = replica.store.ready_at(adapter.name, adapter.weights_bytes, depart_s)
            link_start = max(ready_s, self.link_free_s[decision.pod])
            self.link_free_s[decision.pod] = link_start + adapter.weights_bytes / self.spec.link_bytes_per_s
            arrive_s = self.link_free_s[decision.pod] + self.spec.one_way_latency_s
            record.weights_bytes += adapter.weights_bytes
        else:
            arrive_s = depart_s + self.spec.one_way_latency_s
        self._push(arrive_s, _DELIVER, (decision.pod, key, ticket, with_weights))

    # -- placement ---------------------------------------------------------------------------------------
    def _prefetch_tick(self) -> None:
        """Each replica's due prefetches, sent as one-token background requests pinned to their pods."""
        for index, replica in enumerate(self.replicas):
            for pod_id, adapter in replica.fleet.prefetch_due():
                key = len(self.trace)
                self.trace.append(TraceRequest(self.now_s, f"prefetch-{key}", adapter.name, PREFETCH_PROMPT_TOKENS, 1))
                self.records.append(RequestRecord(key, self.now_s, adapter.name, background=True))
                self.replica_of.append(index)
                self.background.add(key)
                self._open += 1
                self.counters["prefetches"] = self.counters.get("prefetches", 0) + 1
                request = RouteRequest(self.model_name, adapter, PREFETCH_PROMPT_TOKENS, 1, f"prefetch-{key}")
                self._send(key, replica.fleet, Fleet.prefetch_decision(pod_id), request, 0.0)

    def _prefetch_over(self, key: int, pod_id: str) -> None:
        self._replica(key).fleet.prefetch_ended(pod_id)

    def _reply_error(self, key: int, ticket: Ticket, kind: str) -> None:
        record = self.records[key]
        replica = self._replica(key)
        replica.fleet.finish(ticket, _OUTCOMES[kind])
        self._share(key, FINISH, ticket, _OUTCOMES[kind])
        if kind in ("miss", "cache_full"):
            self.counters["misses" if kind == "miss" else "cache_full"] += 1
        self._wake(replica)
        if key in self.background:
            self._prefetch_over(key, ticket.pod)
            self._fail(record, kind)
            return
        if kind == "miss":
            record.misses += 1
        else:
            record.excluded.add(ticket.pod)
        if record.attempts >= self.spec.max_attempts:
            self._fail(record, kind)
            return
        self._try_route(key)

    def _finish(self, key: int, ticket: Ticket, request: SimRequest) -> None:
        record = self.records[key]
        replica = self._replica(key)
        replica.fleet.finish(ticket, Outcome.OK)
        self._share(key, FINISH, ticket, Outcome.OK)
        self._wake(replica)
        latency = self.spec.one_way_latency_s
        assert request.first_token_s is not None and request.finished_s is not None
        record.ttft_s = request.first_token_s + latency - record.arrival_s
        record.e2e_s = self.now_s - record.arrival_s
        record.output_tokens = request.max_tokens
        record.reused_blocks = request.reused_blocks
        record.loads += int(request.loaded)  # counted once served: a pytorch pod may load it after admission
        self._open -= 1
        if key in self.background:
            self._prefetch_over(key, ticket.pod)

    def _scrape(self) -> None:
        for pod_id, pod in self.pods.items():  # every replica scrapes every pod
            metrics = PodMetrics(pod.active, pod.queue_depth, pod.kv_used_fraction(), pod.kv.reused_total,
                                 pod.kv.missed_total, tokens_per_step=pod.tokens_per_step())
            for replica in self.replicas:
                replica.fleet.observe_metrics(pod_id, metrics)

    # -- pod side ----------------------------------------------------------------------------------------
    def _deliver(self, pod_id: str, key: int, ticket: Ticket, with_weights: bool) -> None:
        trace_request = self.trace[key]
        adapter = self.refs[trace_request.adapter]
        request = SimRequest(
            key, adapter.task_id, trace_request.prompt_tokens, trace_request.max_tokens,
            with_weights or self.reads,  # a pytorch pod always has the adapter's path
            adapter.pages, weights_bytes=adapter.weights_bytes, blocks=trace_request.blocks,
        )
        pod = self.pods[pod_id]
        record = self.records[key]
        try:
            ready_s = pod.arrive(request, self.now_s)
        except ArrivalError as exc:
            self._push(self.now_s + self.spec.one_way_latency_s, _REPLY_ERROR, (key, ticket, exc.kind))
            return
        self._replica(key).fleet.confirm(ticket)  # the pod admitted it: weights it carried are stored
        self._share(key, CONFIRM, ticket, None)
        if key not in self.background:  # the per-run bound is over clients' admissions
            self.admitted.append(trace_request.adapter)
        record.hit = request.hit and record.misses == 0
        request.ticket = ticket
        self._wake_at(pod_id, [ready_s])
        self._kick(pod_id)

    def _wake_at(self, pod_id: str, ready_s: Sequence[float]) -> None:
        """runtime pytorch: start the idle pod again when an adapter it is reading is ready."""
        for at_s in ready_s:
            if self.now_s < at_s < math.inf:
                self._push(at_s, _READ_DONE, pod_id)

    def _kick(self, pod_id: str) -> None:
        pod = self.pods[pod_id]
        if not pod.stepping:
            duration = pod.start_step(self.now_s)
            if duration > 0:
                self._push(self.now_s + duration, _STEP_END, pod_id)

    def _step_end(self, pod_id: str) -> None:
        pod = self.pods[pod_id]
        done = pod.end_step(self.now_s)
        for first in pod.first_tokens:
            self._replica(first.key).fleet.first_token(first.ticket)  # type: ignore[arg-type]
            self._share(first.key, FIRST_TOKEN, first.ticket, None)
        for request in done:
            reply_s = self.now_s + self.spec.one_way_latency_s
            self._push(reply_s, _FINISH, (request.key, request.ticket, request))
        self._wake_at(pod_id, pod.unblock(self.now_s))
        duration = pod.start_step(self.now_s)
        if duration > 0:
            self._push(self.now_s + duration, _STEP_END, pod_id)


def simulate(
    trace: Sequence[TraceRequest], policy: str, spec: FleetSpec, *, seed: int = 0,
    config: RoutingConfig | None = None, registered: Sequence[str] | None = None,
) -> SimResult:
    return FleetSimulation(trace, policy, spec, seed=seed, config=config, registered=registered).run()
