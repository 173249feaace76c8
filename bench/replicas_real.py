"""Router replicas on real processes: the routing benchmark's real scenario through N ``trtfleet router``s.

    .venv/bin/python -m bench --only replicas [--replicas 1,2,4] [--view shadow|peers]

For each policy (``trtfleet`` and the ``chwbl`` baseline) and each replica count N, a fresh
:class:`bench.realfleet.RealFleet` (the :class:`bench.realscenario.RealScenario` workers: cold caches) runs N
router processes on the same fleet file; the trace is replayed open-loop with each request sent to a
replica drawn by a seeded RNG (:func:`bench.replicas.assign_replicas`, one draw per request, the same
draws for every policy), as a Kubernetes Service spreads requests. Each replica counts only what it
routed, so hits, misses, weight sends and bytes are the sum over replicas (:func:`bench.replicas.sum_counters`
of :func:`bench.routing.router_counters`). ``--view shadow``: each replica keeps its own view of the
pods' caches (today's router); ``--view peers``: each replica also gets ``--peer-port`` and a ``--peer``
per other replica (:func:`bench.replicas.peer_flags`), and a router without those flags stops the run
with :class:`bench.realfleet.PeerViewUnsupported`.

Each view writes its own block of the "Router replicas" section, so a ``peers`` run leaves the
``shadow`` table in place. The issue-14 goals are checked against the same view's 1-replica row:
effective hit rate >= 97 %, misses <= its misses + 1 % of requests, weight sends within 5 %.
"""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Mapping, Sequence
from typing import Any

from bench import coldload, report
from bench.realfleet import RealFleet, synthetic_adapters
from bench.realscenario import WORK, RealScenario, host_cache_bytes_for
from bench.replay import replay_spread, summarize_samples
from bench.replicas import (
    EFFECTIVE_SHARE_MIN,
    EXTRA_MISSES_MAX_SHARE,
    WEIGHT_SENDS_TOLERANCE,
    assign_replicas,
    compare_with_single,
    sum_counters,
)
from bench.routing import router_counters
from bench.traces import TraceRequest, check_fits, generate

COMMAND = ".venv/bin/python -m bench --only replicas --replicas {counts} --view {view}"
POLICIES = ("ttft-cost", "chwbl")
COLUMNS = (
    ("policy", "policy"),
    ("replicas", "router replicas"),
    ("effective_hit_rate", "effective hit rate"),
    ("of_single", "of 1 replica"),
    ("misses", "misses"),
    ("weight_sends", "weight sends"),
    ("ttft_p50_ms", "TTFT p50 ms"),
    ("ttft_p99_ms", "TTFT p99 ms"),
    ("errors", "errors"),
    ("goal", "issue-14 goal"),
)


def run_replicas(policy: str, replicas: int, view: str, scenario: RealScenario, trace: Sequence[TraceRequest],
                 adapters: list[tuple[str, int, Any]], host_bytes: int) -> dict[str, Any]:
    """One real run: fresh workers, ``replicas`` routers, the trace spread over them."""
    replica_of = assign_replicas(len(trace), replicas, random.Random(f"{scenario.seed}/replicas"))
    fleet = RealFleet(policy, scenario.workers, adapters, host_bytes, WORK / f"replicas-{view}-{policy}-r{replicas}",
                      max_batch_size=scenario.max_batch_size, seed=scenario.seed, min_step_ms=scenario.min_step_ms,
                      policy_config=scenario.policy_config(),
                      replicas=replicas, peer_view=view == "peers")
    with fleet:
        began = time.monotonic()
        samples = asyncio.run(replay_spread(fleet.base_urls, replica_of, trace))
        duration = time.monotonic() - began
        counters = sum_counters([router_counters(fleet.router_metrics(index), fleet.fleets_debug(index))
                                 for index in range(replicas)])
    row = summarize_samples(policy, samples, counters, duration)
    row.update(replicas=replicas, view=view,
               requests_per_replica=[replica_of.count(index) for index in range(replicas)])
    return row


def replicas_section(counts: Sequence[int], view: str,
                     policies: Sequence[str] = POLICIES) -> tuple[str, list[dict[str, Any]]]:
    """The ``view`` block of the "Router replicas" section and its rows."""
    scenario = RealScenario()
    try:
        host_bytes, _adapter_pages = host_cache_bytes_for(scenario.adapter_pages_per_worker)
        paths = synthetic_adapters(scenario.adapters, seed=scenario.seed)
    except (OSError, ImportError, ValueError) as exc:
        return f"_Not run: the reference engine or its assets are missing ({exc})._", []
    trace = generate(scenario.trace_spec())
    check_fits(trace, scenario.limits(), name=scenario.trace_spec().name)
    names = scenario.trace_spec().adapter_names()
    adapters = [(name, index + 1, path) for index, (name, path) in enumerate(zip(names, paths, strict=True))]
    scenario, _load = coldload.priced(scenario)
    rows: list[dict[str, Any]] = []
    for policy in policies:
        for replicas in counts:
            print(f"  real run: {policy}, {replicas} router replica(s), view {view} ({len(trace)} requests)",
                  flush=True)
            row = run_replicas(policy, replicas, view, scenario, trace, adapters, host_bytes)
            print(f"    effective {row['effective_hit_rate']:.3f}, misses {row['misses']}, weight sends "
                  f"{row['weight_sends']}, TTFT p99 {row['ttft_p99_ms']:.0f} ms, errors {row['errors']}", flush=True)
            rows.append(row)
    compare_with_single(rows)
    report.save_json(f"replicas-real-{view}", {"counts": list(counts), "view": view, "rows": rows})
    text = "\n\n".join([
        f"**Real runs, view `{view}`.** " + report.provenance(
            COMMAND.format(counts=",".join(str(count) for count in counts), view=view)),
        f"The routing benchmark's real scenario ({scenario.workers} reference workers with "
        f"{scenario.adapter_pages_per_worker}-page host LoRA caches, {scenario.adapters} adapters, Zipf "
        f"{scenario.zipf_alpha}, {scenario.rate_per_s:g} req/s for {scenario.duration_s:.0f} s, {len(trace)} "
        f"requests) through N `trtfleet router` processes on one fleet file, each request sent to a replica "
        f"drawn by a seeded RNG; fresh workers and routers for every row. Counters summed over the replicas. "
        f"{_VIEW_TEXT[view]} Goal (issue 14, against the same policy's 1-replica row): effective hit rate >= "
        f"{EFFECTIVE_SHARE_MIN:.0%}, misses <= its misses + {EXTRA_MISSES_MAX_SHARE:.0%} of requests, weight sends "
        f"within {WEIGHT_SENDS_TOLERANCE:.0%}.",
        report.table(rows, COLUMNS),
    ])
    return text, rows


_VIEW_TEXT: Mapping[str, str] = {
    "shadow": "Each replica keeps its own shadow of the pods' caches, fed only by the requests it routed.",
    "peers": "Replicas share cache events over peer streams (`--peer-port`, one `--peer` per other replica).",
}
