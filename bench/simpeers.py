"""A shared view with a propagation delay, for the simulator's router replicas (:mod:`bench.simulate`).

Each replica keeps its own :class:`~trtfleet_router.routing.fleet.Fleet`; every bookkeeping call a replica
makes for its own request (``start`` with the decision, ``confirm``, ``finish`` with the outcome) is replayed,
``delay_s`` later and in the same order, on every other replica's ``Fleet`` through the same public calls.
So each replica sees the others' weight sends, pins, in-flight load, misses and cache-full answers as a peer
event stream would deliver them. The simulator schedules the replays (:meth:`DelayedMirror.apply` is
called from its event queue); its own counters count each request once, on the replica that routed it.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from trtfleet_router.routing.fleet import Fleet
from trtfleet_router.routing.types import Decision, Outcome, RouteRequest, Ticket

START, CONFIRM, FINISH = "start", "confirm", "finish"


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
        else:
            self.finish(origin, ticket, detail)

    def start(self, origin: int, ticket: Ticket, decision: Decision, request: RouteRequest) -> None:
        self._copies[(origin, ticket.ticket_id)] = {
            index: fleet.start(decision, request) for index, fleet in enumerate(self._fleets) if index != origin
        }

    def confirm(self, origin: int, ticket: Ticket) -> None:
        for index, copy in self._copies[(origin, ticket.ticket_id)].items():
            self._fleets[index].confirm(copy)

    def finish(self, origin: int, ticket: Ticket, outcome: Outcome) -> None:
        for index, copy in self._copies.pop((origin, ticket.ticket_id)).items():
            self._fleets[index].finish(copy, outcome)

    @property
    def pending(self) -> int:
        """Tickets whose finish has not been replayed yet."""
        return len(self._copies)
