"""A harness around one Fleet: a hand-driven clock, forced setup decisions, and teardown checks."""

from __future__ import annotations

import random
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import replace
from typing import Any

import pytest
from trtfleet_router.routing import (
    AdapterRef,
    Decision,
    Fleet,
    Outcome,
    PodInfo,
    RouteRequest,
    Ticket,
    build_policy,
    parse_routing_config,
)

MIB = 2**20


class Harness:
    """One fleet of pods ``p0..p{n-1}`` with a clock the test moves."""

    def __init__(
        self,
        policy: str = "ttft-cost",
        *,
        pods: int = 4,
        host_pages: int = 8,
        device_pages: int = 4,
        config: Mapping[str, Any] | None = None,
        seed: int = 0,
    ) -> None:
        self.now_s = 100.0
        self.config = parse_routing_config({"policy": policy, **(config or {})})
        self.policy = build_policy(self.config)
        self.rng = random.Random(seed)
        self.fleet = Fleet(self.policy, now=lambda: self.now_s, rng=self.rng, config=self.config, model="m")
        self.host_pages = host_pages
        self.device_pages = device_pages
        self.pod_ids = [f"p{i}" for i in range(pods)]
        self.uids = {pod: f"uid-{pod}" for pod in self.pod_ids}
        self.ready = dict.fromkeys(self.pod_ids, True)
        self.open: list[Ticket] = []
        self.sync_pods()

    # -- pods -----------------------------------------------------------------------------------------
    def sync_pods(self) -> None:
        self.fleet.set_pods({
            pod: PodInfo(
                pod, f"{pod}:8001", self.uids[pod], self.host_pages, self.device_pages, self.ready[pod]
            )
            for pod in self.pod_ids
        })

    # -- requests --------------------------------------------------------------------------------------
    @staticmethod
    def adapter(index: int, *, pages: int = 1, weights_mib: int = 8, min_pods: int = 0) -> AdapterRef:
        return AdapterRef(f"adapter-{index}", 1000 + index, weights_mib * MIB, pages, min_pods)

    @staticmethod
    def request(adapter: AdapterRef | None, *, exclude: Iterable[str] = ()) -> RouteRequest:
        return RouteRequest("m", adapter, 16, 16, exclude_pods=frozenset(exclude))

    def route(self, adapter: AdapterRef | None, *, exclude: Iterable[str] = ()) -> Decision:
        return self.fleet.route(self.request(adapter, exclude=exclude))

    def send(self, adapter: AdapterRef | None, *, exclude: Iterable[str] = ()) -> tuple[Decision, Ticket]:
        """Route and start; the ticket stays open (in flight) until ``finish``/teardown."""
        request = self.request(adapter, exclude=exclude)
        decision = self.fleet.route(request)
        ticket = self.fleet.start(decision, request)
        self.open.append(ticket)
        return decision, ticket

    def run(
        self, adapter: AdapterRef | None, outcome: Outcome = Outcome.OK, *, exclude: Iterable[str] = ()
    ) -> Decision:
        """Route, start and finish one request."""
        decision, ticket = self.send(adapter, exclude=exclude)
        self.finish(ticket, outcome)
        return decision

    def finish(self, ticket: Ticket, outcome: Outcome = Outcome.OK) -> None:
        self.open.remove(ticket)
        self.fleet.finish(ticket, outcome)

    # -- forced setup (decisions the test makes, not the policy) --------------------------------------
    def force(
        self, pod: str, adapter: AdapterRef | None, *, admitted: bool = True, background: bool = False
    ) -> Ticket:
        """Start a request on ``pod`` as if routed there (weights sent when the shadow says cold);
        ``admitted``: the pod has answered (its weights are stored, not in transit); ``background``: a batch line.
        """
        request = replace(self.request(adapter), background=background)
        warm = adapter is None or self.fleet.is_warm(pod, adapter.task_id)
        decision = Decision(pod, not warm, warm, "test", "setup")
        ticket = self.fleet.start(decision, request)
        if admitted:
            self.fleet.confirm(ticket)
        self.open.append(ticket)
        return ticket

    def make_warm(self, pod: str, adapter: AdapterRef) -> None:
        """``adapter`` resident and idle on ``pod``."""
        self.finish(self.force(pod, adapter))

    def pin(self, pod: str, adapter: AdapterRef, *, admitted: bool = True) -> Ticket:
        """``adapter`` resident and busy on ``pod`` (a request in flight)."""
        return self.force(pod, adapter, admitted=admitted)

    def load(self, pod: str, inflight: int, *, background: bool = False) -> None:
        """``inflight`` base-model requests in flight on ``pod`` (``background``: batch lines)."""
        for _ in range(inflight):
            self.force(pod, None, background=background)

    def resident(self, pod: str) -> set[int]:
        return set(next(p for p in self.fleet.snapshot().pods if p.pod_id == pod).resident_task_ids)

    def close(self) -> None:
        for ticket in list(self.open):
            self.finish(ticket)
        self.fleet.check_invariants()
        snapshot = self.fleet.snapshot()
        assert snapshot.open_tickets == 0
        assert all(pod.inflight == 0 for pod in snapshot.pods)


@pytest.fixture
def make_harness() -> Iterator[Callable[..., Harness]]:
    """Harness factory; at teardown every open request is finished and the books must balance."""
    made: list[Harness] = []

    def make(*args: Any, **kwargs: Any) -> Harness:
        harness = Harness(*args, **kwargs)
        made.append(harness)
        return harness

    yield make
    for harness in made:
        harness.close()
