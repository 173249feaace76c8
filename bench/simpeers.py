"""The simulator's router replicas (:mod:`bench.simulate`): each replica's view, and a shared view with a
propagation delay.

:func:`build_router_views` makes the replicas of a :class:`~bench.simtypes.FleetSpec`: with
``router_view="shadow"`` one :class:`RouterReplica` per replica, each fed only by its own requests; with
``shared`` one view fed by every request (the single router exactly), or with ``router_view_delay_s`` one view
per replica fed by all through a :class:`DelayedMirror`.

Each replica keeps its own :class:`~trtfleet_router.routing.fleet.Fleet`; every bookkeeping call a replica
makes for its own request (``start`` with the decision, ``confirm``, ``first_token``, ``finish`` with the outcome)
is replayed,
``delay_s`` later and in the same order, on every other replica's ``Fleet`` through the same public calls.
So each replica sees the others' weight sends, pins, in-flight load, misses and cache-full answers as a peer
event stream would deliver them. The simulator schedules the replays (:meth:`DelayedMirror.apply` is
called from its event queue); its own counters count each request once, on the replica that routed it.
"""

from __future__ import annotations

import random
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from trtfleet_router.routing.config import RoutingConfig
from trtfleet_router.routing.fleet import Fleet
from trtfleet_router.routing.policies import build_policy
from trtfleet_router.routing.types import Decision, Outcome, RouteRequest, Ticket

from bench.replicas import assign_replicas
from bench.simtypes import FleetSpec, WeightStoreModel

START, CONFIRM, FIRST_TOKEN, FINISH = "start", "confirm", "first_token", "finish"


@dataclass(slots=True)
class RouterReplica:
    """One router process: its view of the pods (a :class:`Fleet`), weight store and capacity queue."""

    fleet: Fleet
    store: WeightStoreModel
    waiting: deque[int] = field(default_factory=deque)  # keys waiting for LoRA cache capacity, FIFO
    wait_since: dict[int, float] = field(default_factory=dict)


class DelayedMirror:
    """The other replicas' copies of each replica's tickets, and the replay of its calls on them."""

    def __init__(self, fleets: Sequence[Fleet]) -> None:
        self._fleets = list(fleets)
        self._copies: dict[tuple[int, int], dict[int, Ticket]] = {}

    def replay(self, origin: int, op: str, ticket: Ticket, detail: Any) -> None:
        """Replay one call the simulator queued: ``detail`` is (decision, request), None, or the outcome."""
        if op == START:
            self.start(origin, ticket, *detail)
        elif op == CONFIRM:
            self.confirm(origin, ticket)
        elif op == FIRST_TOKEN:
            self.first_token(origin, ticket)
        else:
            self.finish(origin, ticket, detail)

    def start(self, origin: int, ticket: Ticket, decision: Decision, request: RouteRequest) -> None:
        self._copies[(origin, ticket.ticket_id)] = {
            index: fleet.start(decision, request) for index, fleet in enumerate(self._fleets) if index != origin
        }

    def confirm(self, origin: int, ticket: Ticket) -> None:
        for index, copy in self._copies[(origin, ticket.ticket_id)].items():
            self._fleets[index].confirm(copy)

    def first_token(self, origin: int, ticket: Ticket) -> None:
        """Its first token came back: its prefill no longer queues on the pod in any replica's view (the peer
        event stream's ``loaded`` at first token)."""
        for index, copy in self._copies.get((origin, ticket.ticket_id), {}).items():
            self._fleets[index].first_token(copy)

    def finish(self, origin: int, ticket: Ticket, outcome: Outcome) -> None:
        for index, copy in self._copies.pop((origin, ticket.ticket_id)).items():
            self._fleets[index].finish(copy, outcome)

    @property
    def pending(self) -> int:
        """Tickets whose finish has not been replayed yet."""
        return len(self._copies)


@dataclass(frozen=True, slots=True)
class RouterViews:
    """The replicas' views, the mirror between them (None: no delay to model), and each request's replica."""

    replicas: list[RouterReplica]
    mirror: DelayedMirror | None
    replica_of: list[int]


def build_router_views(
    spec: FleetSpec,
    routing: RoutingConfig,
    *,
    seed: int,
    model_name: str,
    now: Callable[[], float],
    requests: int,
    replica_of: Sequence[int] | None,
) -> RouterViews:
    """The views of ``spec``'s router replicas for ``requests`` requests; ``replica_of`` (the replica each
    request goes to in the ``shadow`` view) defaults to seeded draws."""
    # shared: one view fed by every request (the single router, whatever the replica count), or with a
    # delay one view per replica fed by all; shadow: one view per replica, fed only by its own requests
    delayed = spec.router_view == "shared" and spec.router_view_delay_s > 0
    views = spec.router_replicas if spec.router_view == "shadow" or delayed else 1
    replicas = [
        RouterReplica(
            Fleet(build_policy(routing), now=now,
                  rng=random.Random(seed if index == 0 else f"{seed}/replica-{index}"), config=routing,
                  model=model_name),
            WeightStoreModel(spec.router_store_bytes, spec.artifact_fetch_latency_s, spec.artifact_bytes_per_s),
        )
        for index in range(views)
    ]
    mirror = DelayedMirror([r.fleet for r in replicas]) if delayed and views > 1 else None
    if views == 1:
        chosen = [0] * requests
    elif replica_of is None:
        chosen = assign_replicas(requests, views, random.Random(f"{seed}/assign"))
    elif len(replica_of) != requests or not all(0 <= index < views for index in replica_of):
        raise ValueError(f"replica_of needs one replica in 0..{views - 1} per request ({requests})")
    else:
        chosen = list(replica_of)
    return RouterViews(replicas, mirror, chosen)
