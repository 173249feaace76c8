"""Router replicas in the fleet simulation: the "at scale" scenario through R router replicas.

    .venv/bin/python -m bench --only replicas-sim [--replicas 1,2,4,8]

The simulator's 64-pod scenario (:mod:`bench.simbench` "at scale": H100 Llama-3-8B pods, 5,000 adapters,
Zipf 1.0, 1,000 req/s for 60 s) for ``trtfleet`` and the ``chwbl`` baseline, at each replica count, in the
views of :class:`bench.simtypes.FleetSpec`:

* ``shadow``: each replica its own view, fed by the requests the Service sends it;
* ``shared``: one view fed by all (the single router: every replica count gives the 1-replica figures);
* ``shared +1 us`` / ``+10 ms`` / ``+100 ms``: each replica its own view, the others' events replayed on it
  that much later (:mod:`bench.simpeers`); from 2 replicas up. Each replica also keeps its own weight store
  and capacity queue, so ``+1 us`` shows what that per-replica state alone changes.

``weight sends`` counts the routers' decisions that sent weights, ``pod loads`` the pods' actual insertions.
The effective hit rate is counted both ways: from the pods' insertions (the simulator's usual figure) and
from the weight sends, as the real runs count it (:mod:`bench.routing`: a send to a pod that already holds
the adapter counts as a load there). Decision wall time is left out of the latencies
(``add_decision_time=False``) so that every run is deterministic and the ``shared`` rows equal the
1-replica row exactly.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

from bench import report
from bench.profiles import h100_llama3_8b_fleet
from bench.replicas import compare_with_single
from bench.simstats import summarize
from bench.simulate import FleetSpec, simulate
from bench.traces import TraceRequest, TraceSpec, generate

COMMAND = ".venv/bin/python -m bench --only replicas-sim --replicas {counts}"
POLICIES = ("ttft-cost", "chwbl")
DEFAULT_COUNTS = (1, 2, 4, 8)
VIEWS: tuple[tuple[str, str, float], ...] = (  # (label, FleetSpec.router_view, router_view_delay_s)
    ("shared", "shared", 0.0),
    ("shared +1 us", "shared", 1e-6),  # own views kept in step at once: what per-replica state alone costs
    ("shared +10 ms", "shared", 0.01),
    ("shared +100 ms", "shared", 0.1),
    ("shadow", "shadow", 0.0),
)
COLUMNS = (
    ("policy", "policy"),
    ("view", "view"),
    ("replicas", "router replicas"),
    ("effective_hit_rate", "effective (pod loads)"),
    ("effective_by_sends", "effective (weight sends)"),
    ("of_single", "of 1 replica"),
    ("misses", "misses"),
    ("weight_sends", "weight sends"),
    ("loads", "pod loads"),
    ("ttft_p50_ms", "TTFT p50 ms"),
    ("ttft_p99_ms", "TTFT p99 ms"),
    ("errors", "errors"),
    ("goal", "issue-14 goal"),
)


def replica_rows(trace: Sequence[TraceRequest], spec: FleetSpec, counts: Sequence[int],
                 policies: Sequence[str] = POLICIES, views: Sequence[tuple[str, str, float]] = VIEWS,
                 *, seed: int = 0) -> list[dict[str, Any]]:
    """One row per (policy, view, replica count), checked against the same policy's 1-replica row with
    :func:`bench.replicas.compare_with_single` on the weight-send count of the effective hit rate, as the real
    runs count it (a delayed view at 1 replica is the single router: skipped)."""
    rows: list[dict[str, Any]] = []
    for policy in policies:
        for label, view, delay_s in views:
            for replicas in counts:
                if delay_s > 0 and replicas == 1:
                    continue
                variant = dataclasses.replace(spec, router_replicas=replicas, router_view=view,
                                              router_view_delay_s=delay_s)
                result = simulate(trace, policy, variant, seed=seed)
                row: dict[str, Any] = dict(summarize(result))
                effective = float(row["effective_hit_rate"])
                counters = result.fleet_counters
                sends = counters["cold_loads"]
                by_sends = 1.0 - (sends - counters["cache_full"] + int(row["errors"])) / len(trace)
                row.update(view=label, replicas=replicas, weight_sends=sends, effective_by_sends=by_sends,
                           ttft_p50_ms=float(row["ttft_p50_s"]) * 1e3, ttft_p99_ms=float(row["ttft_p99_s"]) * 1e3)
                rows.append(row)
                print(f"  {policy:<9} {label:<14} R={replicas}: effective {effective:.3f}, misses {row['misses']}, "
                      f"weight sends {row['weight_sends']}, TTFT p99 {row['ttft_p99_ms']:.0f} ms "
                      f"({row['wall_s']:.1f} s)", flush=True)
    compare_with_single(rows, "effective_by_sends")
    return rows


def sim_replicas_section(counts: Sequence[int] = DEFAULT_COUNTS, duration_s: int = 60) -> str:
    spec = dataclasses.replace(h100_llama3_8b_fleet(64), add_decision_time=False)
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
        "`shared`: one view fed by every request (the single router); `shared +1 us` / `+10 ms` / `+100 ms`: each "
        "replica its own view, the others' starts, admissions and ends replayed on it that much later (a peer "
        "event stream's delay); each replica also keeps its own weight store (artifact fetches) and capacity "
        "queue, so `+1 us` is what that per-replica state alone changes. `effective "
        "(pod loads)`: `1 - (pod loads + errors) / requests`; `effective (weight sends)`: `1 - (weight sends - "
        "cache full + errors) / requests`, the way the real runs count it (a send to a pod that already holds the "
        "adapter counts as a load); `of 1 replica` and the issue-14 goal (as in the real runs) use the latter. "
        "Decision time is left out of the latencies so that runs are deterministic.",
        report.table(rows, COLUMNS),
    ])
