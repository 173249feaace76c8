"""Micro-benchmark: time of one routing decision vs pods x adapters, and the fleet's memory.

    .venv/bin/python bench/routing_decision.py                      # trtfleet, default grid
    .venv/bin/python bench/routing_decision.py --policy all --json  # every policy, JSON lines

For each (pods, adapters) it builds a Fleet, warms it with a Zipf(s) request stream that keeps
``--concurrency`` requests in flight (start/finish around every decision, so shadow caches fill,
evict, and rankings get cached), then times ``Fleet.route`` alone with ``perf_counter_ns`` over
``--requests`` more requests of the same stream, and ``start`` + ``finish`` separately. Pod metrics
are observed every 64 requests so the staleness path is exercised. Memory: tracemalloc's traced
bytes held by the fleet after the warm-up (a separate run, tracing slows Python down).

Target: trtfleet p50 < 100 us at 64 pods x 5,000 adapters.
"""

from __future__ import annotations

import argparse
import gc
import json
import random
import statistics
import sys
import time
import tracemalloc
from collections import deque
from collections.abc import Callable

from trtfleet_router.routing import (
    AdapterRef,
    Fleet,
    Outcome,
    PodInfo,
    PodMetrics,
    RouteRequest,
    build_policy,
    parse_routing_config,
    policy_names,
)

DEFAULT_GRID = ((8, 500), (16, 1000), (64, 1000), (64, 5000), (128, 5000))
ADAPTER_PAGES = 2  # a rank-16 adapter of a 7B model is a couple of pages
HOST_PAGES = 128  # 64 such adapters per pod
DEVICE_PAGES = 32


class Clock:
    def __init__(self) -> None:
        self.now_s = 0.0

    def __call__(self) -> float:
        return self.now_s


def zipf_sampler(count: int, s: float, rng: random.Random) -> Callable[[], int]:
    weights = [1.0 / (rank**s) for rank in range(1, count + 1)]
    total = sum(weights)
    cumulative = []
    acc = 0.0
    for weight in weights:
        acc += weight / total
        cumulative.append(acc)
    population = list(range(count))

    def draw() -> int:
        return rng.choices(population, cum_weights=cumulative)[0]

    return draw


def build_fleet(policy: str, pods: int, clock: Clock, seed: int) -> Fleet:
    config = parse_routing_config({"policy": policy})
    fleet = Fleet(build_policy(config), now=clock, rng=random.Random(seed), config=config, model="bench")
    fleet.set_pods(
        {
            f"pod-{i:03d}": PodInfo(f"pod-{i:03d}", f"10.0.{i // 256}.{i % 256}:8001", f"uid-{i}", HOST_PAGES,
                                    DEVICE_PAGES)
            for i in range(pods)
        }
    )
    return fleet


def run_case(policy: str, pods: int, adapters: int, args: argparse.Namespace) -> dict[str, object]:
    rng = random.Random(args.seed)
    draw = zipf_sampler(adapters, args.zipf_s, rng)
    refs = [AdapterRef(f"adapter-{i:05d}", i + 1, 8 * 2**20, ADAPTER_PAGES) for i in range(adapters)]
    requests = [RouteRequest("bench", refs[i], 256, 128, request_id=str(i)) for i in range(adapters)]
    pod_ids = [f"pod-{i:03d}" for i in range(pods)]

    def drive(fleet: Fleet, clock: Clock, count: int, timed: bool) -> tuple[list[int], list[int]]:
        open_tickets: deque = deque()  # type: ignore[type-arg]
        route_ns: list[int] = []
        book_ns: list[int] = []
        perf = time.perf_counter_ns
        for n in range(count):
            clock.now_s += 0.001
            if n % 64 == 0:
                pod = pod_ids[(n // 64) % pods]
                fleet.observe_metrics(pod, PodMetrics(active_requests=8, waiting_requests=n % 3,
                                                      kv_cache_used_fraction=0.5))
            request = requests[draw()]
            t0 = perf()
            decision = fleet.route(request)
            t1 = perf()
            ticket = fleet.start(decision, request)
            open_tickets.append(ticket)
            if len(open_tickets) > args.concurrency:
                fleet.finish(open_tickets.popleft(), Outcome.OK)
            t2 = perf()
            if timed:
                route_ns.append(t1 - t0)
                book_ns.append(t2 - t1)
        while open_tickets:
            fleet.finish(open_tickets.popleft(), Outcome.OK)
        return route_ns, book_ns

    clock = Clock()
    fleet = build_fleet(policy, pods, clock, args.seed)
    drive(fleet, clock, args.warmup, timed=False)
    gc.collect()
    gc.disable()
    try:
        route_ns, book_ns = drive(fleet, clock, args.requests, timed=True)
    finally:
        gc.enable()
    fleet.check_invariants()
    snapshot = fleet.snapshot()
    warm = snapshot.warm_routes_total
    cold = snapshot.cold_loads_total

    tracemalloc.start()
    before = tracemalloc.get_traced_memory()[0]
    mem_clock = Clock()
    mem_fleet = build_fleet(policy, pods, mem_clock, args.seed)
    drive(mem_fleet, mem_clock, args.warmup, timed=False)
    held = tracemalloc.get_traced_memory()[0] - before
    tracemalloc.stop()
    del mem_fleet

    def quantile_us(values: list[int], q: float) -> float:
        return statistics.quantiles(values, n=1000)[int(q * 1000) - 1] / 1000

    return {
        "policy": policy,
        "pods": pods,
        "adapters": adapters,
        "route_p50_us": round(quantile_us(route_ns, 0.5), 1),
        "route_p99_us": round(quantile_us(route_ns, 0.99), 1),
        "start_finish_p50_us": round(quantile_us(book_ns, 0.5), 1),
        "start_finish_p99_us": round(quantile_us(book_ns, 0.99), 1),
        "fleet_memory_mib": round(held / 2**20, 2),
        "warm_share": round(warm / max(1, warm + cold), 3),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--policy", default="ttft-cost", help=f"one of {', '.join(policy_names())} or all")
    parser.add_argument("--grid", default=",".join(f"{p}x{a}" for p, a in DEFAULT_GRID),
                        help="comma-separated PODSxADAPTERS cases")
    parser.add_argument("--requests", type=int, default=20_000, help="timed decisions per case")
    parser.add_argument("--warmup", type=int, default=20_000, help="untimed decisions first")
    parser.add_argument("--concurrency", type=int, default=256, help="requests kept in flight")
    parser.add_argument("--zipf-s", type=float, default=1.0, help="Zipf exponent of adapter popularity")
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--json", action="store_true", help="one JSON object per case")
    args = parser.parse_args(argv)

    policies = list(policy_names()) if args.policy == "all" else [args.policy]
    grid = [tuple(int(x) for x in case.split("x")) for case in args.grid.split(",")]
    if not args.json:
        print(f"{'policy':<18} {'pods':>5} {'adapters':>8} {'route p50 us':>13} {'route p99 us':>13} "
              f"{'start+finish p50 us':>20} {'memory MiB':>11} {'warm share':>10}")
    for policy in policies:
        for pods, adapters in grid:
            row = run_case(policy, pods, adapters, args)
            if args.json:
                print(json.dumps(row))
            else:
                print(
                    f"{policy:<18} {pods:>5} {adapters:>8} {row['route_p50_us']:>13} "
                    f"{row['route_p99_us']:>13} {row['start_finish_p50_us']:>20} "
                    f"{row['fleet_memory_mib']:>11} {row['warm_share']:>10}"
                )
            sys.stdout.flush()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
