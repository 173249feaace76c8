"""Router replicas in the fleet simulation: the "at scale" scenario through R router replicas.

    .venv/bin/python -m bench --only replicas-sim [--replicas 1,2,4,8]

The simulator's 64-pod scenario (:func:`bench.simbench` "at scale": H100 Llama-3-8B pods, 5,000 adapters,
Zipf 1.0, 1,000 req/s for 60 s) for ``trtfleet`` and the ``chwbl`` baseline, at each replica count, in both
views of :class:`bench.simtypes.FleetSpec`: ``shadow`` (each replica its own view, fed by the requests the
Service sends it) and ``shared`` (one view fed by all: the single router, so every replica count gives the
1-replica figures exactly; no propagation delay is modelled). ``weight sends`` counts the routers' decisions
that sent weights (as the real runs do); ``loads`` counts the pods' actual insertions.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from typing import Any

from bench import report
from bench.profiles import h100_llama3_8b_fleet
from bench.simstats import summarize
from bench.simtypes import ROUTER_VIEWS
from bench.simulate import FleetSpec, simulate
from bench.traces import TraceRequest, TraceSpec, generate

COMMAND = ".venv/bin/python -m bench --only replicas-sim --replicas {counts}"
POLICIES = ("trtfleet", "chwbl")
DEFAULT_COUNTS = (1, 2, 4, 8)
COLUMNS = (
    ("policy", "policy"),
    ("view", "view"),
    ("replicas", "router replicas"),
    ("effective_hit_rate", "effective hit rate"),
    ("of_single", "of 1 replica"),
    ("misses", "misses"),
    ("weight_sends", "weight sends"),
    ("loads", "pod loads"),
    ("ttft_p50_ms", "TTFT p50 ms"),
    ("ttft_p99_ms", "TTFT p99 ms"),
    ("errors", "errors"),
)


def replica_rows(trace: Sequence[TraceRequest], spec: FleetSpec, counts: Sequence[int],
                 policies: Sequence[str] = POLICIES, views: Sequence[str] = ROUTER_VIEWS,
                 *, seed: int = 0) -> list[dict[str, Any]]:
    """One row per (policy, view, replica count), with the share of the same policy's 1-replica figure."""
    rows: list[dict[str, Any]] = []
    for policy in policies:
        single: float | None = None
        for view in views:
            for replicas in counts:
                result = simulate(trace, policy, dataclasses.replace(spec, router_replicas=replicas, router_view=view),
                                  seed=seed)
                row: dict[str, Any] = dict(summarize(result))
                effective = float(row["effective_hit_rate"])
                if replicas == 1 and single is None:
                    single = effective
                row.update(view=view, replicas=replicas, weight_sends=result.fleet_counters["cold_loads"],
                           of_single=effective / single if single else math.nan,
                           ttft_p50_ms=float(row["ttft_p50_s"]) * 1e3, ttft_p99_ms=float(row["ttft_p99_s"]) * 1e3)
                rows.append(row)
                print(f"  {policy:<9} {view:<6} R={replicas}: effective {effective:.3f}, misses {row['misses']}, "
                      f"weight sends {row['weight_sends']}, TTFT p99 {row['ttft_p99_ms']:.0f} ms "
                      f"({row['wall_s']:.1f} s)", flush=True)
    return rows


def sim_replicas_section(counts: Sequence[int] = DEFAULT_COUNTS, duration_s: int = 60) -> str:
    spec = h100_llama3_8b_fleet(64)
    trace = generate(TraceSpec(name="scale", num_adapters=5000, zipf_alpha=1.0, rate_per_s=1000.0,
                               num_requests=1000 * duration_s, seed=11))
    print(f"router replicas (sim): 64 pods, {len(trace):,} requests, R in {list(counts)}", flush=True)
    rows = replica_rows(trace, spec, counts)
    report.save_json("sim-replicas", {"counts": list(counts), "rows": rows})
    return "\n\n".join([
        "**Simulated.** " + report.provenance(COMMAND.format(counts=",".join(str(count) for count in counts))),
        f"The fleet simulation's scale scenario: 64 pods (H100, Llama-3-8B, {spec.pod.host_pages}-page host LoRA "
        f"caches), 5,000 adapters, Zipf 1.0, Poisson 1,000 req/s, {len(trace):,} requests, each sent to a router "
        "replica drawn by a seeded RNG. `shadow`: each replica routes with its own `Fleet` (the router's code), "
        "fed only by its own requests, and scrapes every pod; the pods' caches are the simulated pods' own. "
        "`shared`: one view fed by every request (the single router; no propagation delay modelled). `of 1 "
        "replica`: effective hit rate over the same policy's 1-replica figure. `weight sends`: decisions that sent "
        "weights; `pod loads`: adapters the pods actually stored.",
        report.table(rows, COLUMNS),
    ])
