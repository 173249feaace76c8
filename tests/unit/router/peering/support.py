"""A router replica's fleet and event log for the peering tests (no event loop, no server), and a membership
that records whom the peer server heard of."""

from __future__ import annotations

import random
from typing import Any

from trtfleet_router.peering.journal import EventLog
from trtfleet_router.routing import (
    AdapterRef,
    Decision,
    Fleet,
    PodInfo,
    RouteRequest,
    build_policy,
    parse_routing_config,
)
from trtfleet_router.routing.events import STREAM_VERSION, decode_event


class Replica:
    def __init__(self, name: str) -> None:
        self.journal = EventLog(name)
        config = parse_routing_config({"policy": "trtfleet"})
        self.fleet = Fleet(
            build_policy(config),
            now=lambda: 100.0,
            rng=random.Random(0),
            config=config,
            model="m",
            journal=self.journal,
        )
        self.fleet.set_pods({pod: PodInfo(pod, f"{pod}:1", f"uid-{pod}", 3, 3) for pod in ("p0", "p1")})

    def start(self, pod: str, task_id: int) -> Any:
        adapter = AdapterRef(f"a{task_id}", task_id, 1, 1)
        warm = self.fleet.is_warm(pod, task_id)
        return self.fleet.start(Decision(pod, not warm, warm, "t", "t"), RouteRequest("m", adapter, 1, 1))

    def deliver_to(self, other: Replica) -> None:
        self.journal.flush()
        for line in self.journal.after(0, STREAM_VERSION)[1]:  # as a subscriber of this version asks
            other.fleet.apply_remote(decode_event(self.journal.replica_id, line))


class Membership:
    """The peer server's :class:`~trtfleet_router.peering.server.Membership`, recording every ``heard_of``."""

    def __init__(self) -> None:
        self.heard: list[tuple[str, str]] = []

    def heard_of(self, replica_id: str, advertise_url: str) -> None:
        self.heard.append((replica_id, advertise_url))

    def watermarks(self) -> dict[str, int]:
        return {}

    def known_peers(self) -> dict[str, str]:
        return {}
