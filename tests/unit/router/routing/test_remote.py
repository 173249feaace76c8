"""Router replicas sharing residency events: applying them, pins per origin, dead replicas, pod resets, gaps.

Two or three :class:`Fleet` objects stand for router replicas over the same pods; each records its own
events in a list (its journal) and the test delivers them to the others, in order, when it chooses.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass, field

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
from trtfleet_router.routing.events import (
    EventKind,
    ResidencyEvent,
)
from trtfleet_router.routing.load import ActivityWindow
from trtfleet_router.routing.prefix import token_block_hashes

PODS = ("p0", "p1")


@dataclass
class Replica:
    """One router replica's fleet and the events it made, not yet delivered."""

    name: str
    fleet: Fleet
    outbox: list[ResidencyEvent] = field(default_factory=list)
    seq: int = 0

    def record(
        self,
        base_model: str,
        pod_id: str,
        pod_uid: str,
        kind: EventKind,
        ticket: int = 0,
        task_id: int | None = None,
        pages: int = 0,
        blocks: Sequence[int] = (),
        background: bool = False,
    ) -> None:
        self.seq += 1
        self.outbox.append(
            ResidencyEvent(self.name, self.seq, base_model, pod_id, pod_uid, kind, ticket, task_id, pages,
                           tuple(blocks), background)
        )

    def start(self, pod: str, adapter: AdapterRef | None, background: bool = False) -> Ticket:
        """A request sent to ``pod`` (weights when this replica's view says cold), as if routed there."""
        warm = adapter is None or self.fleet.is_warm(pod, adapter.task_id)
        request = RouteRequest("m", adapter, 16, 16, background=background)
        ticket = self.fleet.start(Decision(pod, not warm, warm, "test", "setup"), request)
        self.fleet.confirm(ticket)
        return ticket

    def resident(self, pod: str) -> list[int]:
        return list(self.fleet.residency.pod(pod).cache.resident())

    def busy(self, pod: str) -> set[int]:
        return set(self.fleet.residency.pod(pod).cache.host.busy)


class World:
    def __init__(self, replicas: int = 2, host_pages: int = 3) -> None:
        self.now_s = 100.0
        self.host_pages = host_pages
        self.ready = dict.fromkeys(PODS, True)
        config = parse_routing_config({"policy": "trtfleet"})
        self.replicas: list[Replica] = []
        for index in range(replicas):
            replica = Replica(f"r{index}", None)  # type: ignore[arg-type]
            replica.fleet = Fleet(
                build_policy(config),
                now=lambda: self.now_s,
                rng=random.Random(index),
                config=config,
                model="m",
                journal=replica,
            )
            self.replicas.append(replica)
        for replica in self.replicas:
            self.set_pods(replica)

    def set_pods(self, replica: Replica) -> None:
        replica.fleet.set_pods(
            {
                pod: PodInfo(pod, f"{pod}:8001", f"uid-{pod}", self.host_pages, self.host_pages, self.ready[pod])
                for pod in PODS
            }
        )

    def deliver(self) -> None:
        """Every replica's events so far, to every other replica, in each origin's order."""
        for origin in self.replicas:
            events, origin.outbox = origin.outbox, []
            for event in events:
                for other in self.replicas:
                    if other is not origin:
                        other.fleet.apply_remote(event)

    def check(self) -> None:
        for replica in self.replicas:
            replica.fleet.check_invariants()


def adapter(index: int, pages: int = 1) -> AdapterRef:
    return AdapterRef(f"adapter-{index}", 1000 + index, 1 << 20, pages)


def test_an_adapter_loaded_through_one_replica_is_warm_for_the_other() -> None:
    world = World()
    a, b = world.replicas
    a.fleet.finish(a.start("p0", adapter(1)), Outcome.OK)
    assert not b.fleet.is_warm("p0", 1001)
    world.deliver()
    assert b.fleet.is_warm("p0", 1001)
    decision = b.fleet.route(RouteRequest("m", adapter(1), 16, 16))
    assert (decision.pod, decision.send_weights) == ("p0", False)
    world.check()


def prompt(adapter_ref: AdapterRef, tokens: int = 2048) -> RouteRequest:
    return RouteRequest("m", adapter_ref, tokens, 16,
                        blocks=token_block_hashes(list(range(tokens)), adapter_ref.task_id, 32))


def test_a_conversation_served_through_one_replica_has_its_prefix_on_the_other() -> None:
    world = World()
    a, b = world.replicas
    subject = adapter(1)
    for pod in PODS:  # warm everywhere, so only the prefix tells the pods apart
        a.fleet.finish(a.start(pod, subject), Outcome.OK)
    first_turn = prompt(subject)
    decision = a.fleet.route(first_turn)
    a.fleet.finish(a.fleet.start(decision, first_turn), Outcome.OK)
    hashes = first_turn.blocks.hashes
    assert b.fleet.prefix_index.match(hashes) == {}
    world.deliver()
    assert b.fleet.prefix_index.match(hashes) == {decision.pod: len(hashes)}
    second_turn = prompt(subject, 4096)  # the first turn's 2,048 tokens, then more
    assert b.fleet.route(second_turn).pod == a.fleet.route(second_turn).pod == decision.pod
    world.check()


def test_lru_order_follows_every_replicas_traffic() -> None:
    world = World(host_pages=3)
    a, b = world.replicas
    for replica, index in ((a, 1), (b, 2), (a, 3), (b, 1)):  # 1 is used again last: the LRU is 2, 3, 1
        replica.fleet.finish(replica.start("p0", adapter(index)), Outcome.OK)
        world.deliver()
    assert a.resident("p0") == b.resident("p0") == [1002, 1003, 1001]
    a.fleet.finish(a.start("p0", adapter(4)), Outcome.OK)  # evicts 1002, the least recently used by anyone
    world.deliver()
    assert a.resident("p0") == b.resident("p0") == [1003, 1001, 1004]
    world.check()


@dataclass(frozen=True)
class PinCase:
    id: str
    local_pin: bool  # the receiving replica has its own request on the adapter
    remote_release: bool  # the other replica's request ended
    busy: bool  # the adapter is pinned in the receiver's view afterwards


@pytest.mark.parametrize(
    "case",
    [
        pytest.param(PinCase("remote-pin-only", False, False, True), id="remote pin holds the adapter"),
        pytest.param(PinCase("remote-released", False, True, False), id="remote release unpins"),
        pytest.param(PinCase("both-remote-released", True, True, True), id="a remote release keeps the local pin"),
        pytest.param(PinCase("local-only", True, False, True), id="both pins"),
    ],
)
def test_pins_are_kept_per_origin(case: PinCase) -> None:
    world = World()
    a, b = world.replicas
    b.fleet.finish(b.start("p0", adapter(1)), Outcome.OK)
    world.deliver()
    remote = a.start("p0", adapter(1))
    local = b.start("p0", adapter(1)) if case.local_pin else None
    world.deliver()
    if case.remote_release:
        a.fleet.finish(remote, Outcome.OK)
        world.deliver()
    assert (1001 in b.busy("p0")) is case.busy
    assert b.fleet.pods["p0"].load.remote_inflight == (0 if case.remote_release else 1)
    world.check()
    if local is not None:
        b.fleet.finish(local, Outcome.OK)
    if not case.remote_release:
        a.fleet.finish(remote, Outcome.OK)
    world.deliver()
    assert b.busy("p0") == a.busy("p0") == set()
    world.check()


def test_a_remote_release_of_an_unknown_request_touches_nothing() -> None:
    world = World()
    a, b = world.replicas
    local = b.start("p0", adapter(1))
    b.outbox.clear()
    assert not b.fleet.apply_remote(ResidencyEvent("r0", 9, "m", "p0", "uid-p0", EventKind.RELEASE, 77, 1001))
    assert 1001 in b.busy("p0")
    b.fleet.finish(local, Outcome.OK)
    world.check()


def test_a_gone_replica_leaves_nothing_pinned() -> None:
    world = World(replicas=3)
    a, b, c = world.replicas
    pins = [a.start("p0", adapter(1)), a.start("p1", adapter(2)), a.start("p1", None)]
    c_pin = c.start("p0", adapter(1))
    world.deliver()
    assert b.busy("p0") == {1001} and b.busy("p1") == {1002}
    assert b.fleet.inflight_total() == 4
    assert b.fleet.forget_origin("r0") == 3
    assert b.busy("p0") == {1001}  # c's request still pins it
    assert b.busy("p1") == set()
    assert b.fleet.inflight_total() == 1
    assert b.fleet.is_warm("p1", 1002)  # gone replica's adapters stay resident, only unpinned
    world.check()
    a.fleet.finish(pins[0], Outcome.OK)  # a late release (the replica was only slow): ignored by b
    world.deliver()
    assert b.busy("p0") == {1001}
    c.fleet.finish(c_pin, Outcome.OK)
    world.deliver()
    assert b.busy("p0") == set()
    for ticket in pins[1:]:
        a.fleet.finish(ticket, Outcome.OK)
    world.check()


def test_a_miss_seen_by_one_replica_makes_the_adapter_cold_for_all() -> None:
    world = World()
    a, b = world.replicas
    a.fleet.finish(a.start("p0", adapter(1)), Outcome.OK)
    world.deliver()
    b.fleet.finish(b.start("p0", adapter(1)), Outcome.MISS)
    world.deliver()
    assert not a.fleet.is_warm("p0", 1001) and not b.fleet.is_warm("p0", 1001)
    world.check()


def test_a_pod_reset_empties_the_pod_for_every_replica_once() -> None:
    world = World()
    a, b = world.replicas
    a.fleet.finish(a.start("p0", adapter(1)), Outcome.OK)
    b_ticket = b.start("p0", adapter(2))
    world.deliver()
    world.now_s += 60
    world.ready["p0"] = False  # replica a saw the pod's Triton go away and come back
    world.set_pods(a)
    world.ready["p0"] = True
    world.set_pods(a)
    assert [e.kind for e in a.outbox] == [EventKind.POD_RESET]
    world.deliver()
    assert b.resident("p0") == [] and a.resident("p0") == []
    b.fleet.finish(b_ticket, Outcome.OK)  # a request of the old incarnation: releases nothing
    a.fleet.finish(a.start("p0", adapter(3)), Outcome.OK)
    world.deliver()
    # b saw the same restart itself a moment later: its own reset event does not empty a's view again
    world.ready["p0"] = False
    world.set_pods(b)
    world.ready["p0"] = True
    world.set_pods(b)
    world.deliver()
    assert a.resident("p0") == [1003]
    world.check()


def test_events_about_another_incarnation_of_a_pod_are_ignored() -> None:
    world = World()
    _, b = world.replicas
    event = ResidencyEvent("r0", 1, "m", "p0", "uid-older", EventKind.PUT, 1, 1001, 1)
    assert not b.fleet.apply_remote(event)
    assert not b.fleet.apply_remote(ResidencyEvent("r0", 2, "m", "p9", "uid-p9", EventKind.ACQUIRE, 2))
    assert b.resident("p0") == []
    world.check()


def test_a_put_the_view_cannot_store_pins_nothing() -> None:
    world = World(host_pages=1)
    a, b = world.replicas
    b_pin = b.start("p0", adapter(1))  # b's own request fills p0's one page
    assert b.fleet.apply_remote(ResidencyEvent("r0", 1, "m", "p0", "uid-p0", EventKind.PUT, 1, 1002, 1))
    assert b.busy("p0") == {1001} and b.resident("p0") == [1001]  # booked, but nothing stored or pinned
    assert b.fleet.apply_remote(ResidencyEvent("r0", 2, "m", "p0", "uid-p0", EventKind.RELEASE, 1))
    b.fleet.finish(b_pin, Outcome.OK)
    world.check()


def test_activity_window_counts_the_last_window_only() -> None:
    window = ActivityWindow(10)
    for second, task in ((100.2, 1), (100.9, 1), (105.0, 2), (109.5, None)):
        window.record(task, second)
    assert window.counts(109.9) == {1: 2, 2: 1, None: 1}
    assert window.counts(111.0) == {2: 1, None: 1}  # second 100 left the window
    window.record(3, 130.0)
    assert window.counts(130.0) == {3: 1}


def test_a_restart_one_replica_detects_empties_the_pod_everywhere() -> None:
    world = World()
    a, b = world.replicas
    a.fleet.finish(a.start("p0", adapter(1)), Outcome.OK)
    in_flight = b.start("p0", adapter(2))
    world.deliver()
    world.now_s += 60
    b.fleet.reset_pod("p0", "request counters went back")  # b's scrape saw the counters go back
    assert [e.kind for e in b.outbox] == [EventKind.POD_RESET]
    world.deliver()
    assert a.resident("p0") == b.resident("p0") == []
    assert a.fleet.route(RouteRequest("m", adapter(1), 16, 16)).send_weights
    b.fleet.finish(in_flight, Outcome.OK)  # started before the restart: its release touches the new shadow nowhere
    world.deliver()
    world.check()


def test_a_request_ended_after_its_pod_was_reset_still_ends_on_the_others() -> None:
    world = World()
    a, b = world.replicas
    ticket = a.start("p0", adapter(1))
    world.deliver()
    assert b.fleet.inflight_total() == 1 and b.fleet.remote.origins() == ["r0"]
    world.now_s += 60
    a.fleet.reset_pod("p0", "test")  # a's view of p0 starts over: its own ticket is void there
    world.deliver()
    a.fleet.finish(ticket, Outcome.OK)
    world.deliver()
    assert list(b.fleet.remote.tickets()) == []  # nothing left booked (nor counted as demand) on b
    world.check()


def test_one_restart_seen_three_ways_empties_the_view_once() -> None:
    world = World()
    a, b = world.replicas
    world.now_s += 60
    world.ready["p0"] = False  # a ejects p0 (its probes fail while Triton restarts)
    world.set_pods(a)
    world.now_s += 10
    a.fleet.reset_pod("p0", "request counters went back")  # Triton is back: its counters went back
    a.fleet.finish(a.start("p1", adapter(1)), Outcome.OK)
    world.now_s += 1
    a.fleet.reset_pod("p0", "request counters went back")  # the next scrape says so again
    world.ready["p0"] = True  # and the probe readmits it: the same restart, the view is not emptied again
    world.set_pods(a)
    a.fleet.finish(a.start("p0", adapter(2)), Outcome.OK)
    world.set_pods(a)
    assert a.resident("p0") == [1002]
    assert [e.kind for e in a.outbox].count(EventKind.POD_RESET) == 1
    world.deliver()
    assert b.resident("p0") == [1002]
    world.check()


def test_another_replicas_batch_lines_leave_interactive_requests_room_here_too() -> None:
    world = World()
    r0, r1 = world.replicas
    lines = [r0.start("p0", None, background=True) for _ in range(3)]
    chat = r0.start("p1", None)
    world.deliver()
    pods = r1.fleet.pods
    assert pods["p0"].load.remote_inflight == 3 and pods["p0"].load.remote_background == 3
    # an interactive request compares p0 without the batch lines, as r0 itself does; a batch line counts them
    assert [pods[p].load.foreground(world.now_s) for p in PODS] == [0, 1]
    assert [pods[p].load.load(world.now_s) for p in PODS] == [3, 1]
    interactive = r1.fleet.route(RouteRequest("m", None, 16, 16))
    assert interactive.pod == "p0"
    world.check()
    for ticket in [*lines, chat]:
        r0.fleet.finish(ticket, Outcome.OK)
    world.deliver()
    assert pods["p0"].load.remote_inflight == 0 and pods["p0"].load.remote_background == 0
    world.check()
