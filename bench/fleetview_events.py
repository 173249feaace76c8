"""Micro-benchmark: what sharing the view between router replicas costs per request.

    python -m bench.fleetview_events                 # 8 pods, 50 adapters, Zipf 1.0
    python -m bench.fleetview_events --json

One replica's request path, ``route`` + ``start`` + ``confirm`` + ``first_token`` + ``finish`` (16 requests in flight,
a Zipf stream, weights sent when the view says cold), is timed three ways over the same stream:

* ``alone``: a fleet without a journal (peering off: ``--peer-port -1``);
* ``publish``: the same fleet with the replica's :class:`~trtfleet_router.peering.journal.EventLog`
  (events numbered; at the end of each event-loop turn, here every ``--batch`` requests, encoded to
  NDJSON and appended to the ring, and the subscribers woken);
* ``apply``: a second replica decoding those NDJSON lines and applying them to its own fleet
  (``Fleet.apply_remote``), per request of the first.

Reported: microseconds per request (the fastest of ``--repeats`` runs: the machine is shared) and events per request. No
network: the stream's socket write is one ``write`` per turn of whatever the batch holds.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import time
from collections import deque

from trtfleet_router.peering.journal import EventLog
from trtfleet_router.routing import (
    AdapterRef,
    Fleet,
    Outcome,
    PodInfo,
    RouteRequest,
    Ticket,
    build_policy,
    parse_routing_config,
)
from trtfleet_router.routing.events import Journal, decode_event


def _fleet(pods: int, host_pages: int, seed: int, journal: Journal | None) -> Fleet:
    config = parse_routing_config({"policy": "trtfleet"})
    fleet = Fleet(
        build_policy(config), now=time.monotonic, rng=random.Random(seed), config=config, model="m", journal=journal
    )
    fleet.set_pods({f"p{i}": PodInfo(f"p{i}", f"p{i}:1", f"u{i}", host_pages, host_pages) for i in range(pods)})
    return fleet


def _stream(adapters: int, requests: int, zipf_s: float, seed: int) -> list[AdapterRef]:
    weights = [1.0 / (rank**zipf_s) for rank in range(1, adapters + 1)]
    refs = [AdapterRef(f"a{i}", 100 + i, 1 << 20, 1) for i in range(adapters)]
    return random.Random(seed).choices(refs, weights, k=requests)


async def _drive_async(fleet: Fleet, stream: list[AdapterRef], inflight: int, batch: int) -> float:
    window: deque[Ticket] = deque()
    started = time.perf_counter()
    for index, adapter in enumerate(stream):
        request = RouteRequest("m", adapter, 16, 16)
        ticket = fleet.start(fleet.route(request), request)
        fleet.confirm(ticket)
        fleet.first_token(ticket)  # the router's first response: both, one after the other
        window.append(ticket)
        if len(window) > inflight:
            fleet.finish(window.popleft(), Outcome.OK)
        if index % batch == batch - 1:
            await asyncio.sleep(0)  # the turn ends: the journal's flush (scheduled with call_soon) runs
    while window:
        fleet.finish(window.popleft(), Outcome.OK)
    await asyncio.sleep(0)
    return time.perf_counter() - started


def _drive(fleet: Fleet, stream: list[AdapterRef], inflight: int, batch: int) -> float:
    """Seconds for the whole stream through route/start/confirm/first_token/finish, ``batch`` requests a turn."""
    return asyncio.run(_drive_async(fleet, stream, inflight, batch))


def run(args: argparse.Namespace) -> dict[str, float]:
    stream = _stream(args.adapters, args.requests, args.zipf, args.seed)
    alone, publish, apply = [], [], []
    events = 0
    for repeat in range(args.repeats):
        alone.append(_drive(_fleet(args.pods, args.host_pages, repeat, None), stream, args.inflight, args.batch))
        log = EventLog("bench", ring_events=len(stream) * 8)
        fleet = _fleet(args.pods, args.host_pages, repeat, log)
        publish.append(_drive(fleet, stream, args.inflight, args.batch))
        gap, lines = log.after(0)
        assert not gap
        events = len(lines)
        other = _fleet(args.pods, args.host_pages, repeat + 1000, None)
        started = time.perf_counter()
        for line in lines:
            other.apply_remote(decode_event("bench", line))
        apply.append(time.perf_counter() - started)
        other.check_invariants()
    per_request = 1e6 / len(stream)
    result = {
        "alone_us": min(alone) * per_request,
        "publish_us": min(publish) * per_request,
        "apply_us": min(apply) * per_request,
        "events_per_request": events / len(stream),
    }
    result["publish_added_us"] = result["publish_us"] - result["alone_us"]
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--pods", type=int, default=8)
    parser.add_argument("--adapters", type=int, default=50)
    parser.add_argument("--host-pages", type=int, default=4)
    parser.add_argument("--zipf", type=float, default=1.0)
    parser.add_argument("--requests", type=int, default=20000)
    parser.add_argument("--inflight", type=int, default=16)
    parser.add_argument("--batch", type=int, default=8, help="requests per event-loop turn (one flush each)")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    result = run(args)
    if args.json:
        print(json.dumps(result))
    else:
        for key, value in result.items():
            print(f"{key:>20}: {value:8.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
