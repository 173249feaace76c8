"""Routing quality on real processes: K reference-engine tritonservers, the router, every policy, one trace.

    .venv/bin/python -m bench --quick --only routing

For each policy a fresh fleet (:class:`bench.realfleet.RealFleet`: cold caches) replays the same trace
open-loop (each request sent at its ``t_s``, whatever the others do) against the router's OpenAI endpoint
(``/v1/completions``, streamed, greedy); the client measures TTFT (first streamed text) and end-to-end
latency; the router's own counters (``trtfleet_router_adapter_cache_hits``, ``..._misses``,
``..._adapter_loads``, ``..._weight_bytes_sent``) give hits, misses, loads and bytes. The bound for the
trace and the workers' pooled capacity is computed by ``bench.optimal`` and every policy is checked
against it. Then the simulator replays the same trace on a model of this fleet (step time measured on
these workers) and the table of simulated vs measured figures states the calibration error.

Hit counting here: a request is a hit when the router sent it id-only and the pod served it (the
router's ``adapter_cache_hits``); a load is a request that carried weights (``adapter_loads``), which
over-counts pod insertions when weights reach a pod that already held the adapter (the pod ignores
them), so the measured effective hit rate is, if anything, low.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import math
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from bench import coldload, optimal, report
from bench.realfleet import RealFleet, parse_counters, synthetic_adapters
from bench.realscenario import WORK, RealScenario, host_cache_bytes_for
from bench.replay import Sample, replay, summarize_samples
from bench.traces import TraceRequest, check_fits, generate, write_jsonl

COMMAND = ".venv/bin/python -m bench{quick} --only routing"
REAL_COLUMNS = (
    ("policy", "policy"),
    ("hit_rate", "hit rate"),
    ("effective_hit_rate", "effective"),
    ("of_bound", "of bound"),
    ("loads", "loads"),
    ("weight_sends", "weight sends"),
    ("misses", "misses"),
    ("cache_full", "cache full"),
    ("weights_kb", "weights KB"),
    ("ttft_p50_ms", "TTFT p50 ms"),
    ("ttft_p99_ms", "TTFT p99 ms"),
    ("e2e_p50_ms", "e2e p50 ms"),
    ("e2e_p99_ms", "e2e p99 ms"),
    ("output_tokens_per_s", "out tok/s"),
    ("errors", "errors"),
)


def run_policy(policy: str, scenario: RealScenario, trace: Sequence[TraceRequest],
               adapters: list[tuple[str, int, Path]], host_bytes: int) -> tuple[dict[str, Any], list[Sample]]:
    work = WORK / policy
    fleet = RealFleet(policy, scenario.workers, adapters, host_bytes, work, max_batch_size=scenario.max_batch_size,
                      seed=scenario.seed, min_step_ms=scenario.min_step_ms,
                      policy_config=scenario.policy_config())
    with fleet:
        began = time.monotonic()
        samples = asyncio.run(replay(fleet.base_url, trace))
        duration = time.monotonic() - began
        counters = router_counters(fleet.router_metrics(), fleet.fleets_debug())
    return summarize_samples(policy, samples, counters, duration), samples


def router_counters(metrics: str, debug: Mapping[str, Any]) -> dict[str, float]:
    """One router's counters: per-pod books from ``/debug/fleets``, adapter counters from ``/metrics``."""
    pods = [pod for fleet_state in debug.values() for pod in fleet_state["pods"]]
    return {
        "warm_routes": sum(p["warm_routes_total"] for p in pods),
        "cold_starts": sum(p["cold_loads_total"] for p in pods),
        "cache_full": sum(p["cache_full_total"] for p in pods),
        "failures": sum(p["failures_total"] for p in pods),
        "hits": parse_counters(metrics, "trtfleet_router_adapter_cache_hits"),
        "misses": parse_counters(metrics, "trtfleet_router_adapter_cache_misses"),
        "loads": parse_counters(metrics, "trtfleet_router_adapter_loads"),
        "weight_bytes": parse_counters(metrics, "trtfleet_router_weight_bytes_sent"),
    }


def real_load(scenario: RealScenario, trace: Sequence[TraceRequest]) -> float:
    tokens_per_s = sum(r.max_tokens for r in trace) / max(trace[-1].t_s, 1e-9)
    return tokens_per_s / (scenario.workers * scenario.max_batch_size / (scenario.min_step_ms / 1e3))


def routing_section(quick: bool, *, loadgen: bool = True) -> tuple[str, dict[str, Any] | None]:
    from trtfleet_router.routing import policy_names

    scenario = RealScenario() if quick else RealScenario(adapters=200, duration_s=180.0)
    try:
        host_bytes, adapter_pages = host_cache_bytes_for(scenario.adapter_pages_per_worker)
        paths = synthetic_adapters(scenario.adapters, seed=scenario.seed)
    except (OSError, ImportError, ValueError) as exc:
        return f"_Not run: the reference engine or its assets are missing ({exc})._", None
    trace = generate(scenario.trace_spec())
    check_fits(trace, scenario.limits(), name=scenario.trace_spec().name)
    names = scenario.trace_spec().adapter_names()
    adapters = [(name, index + 1, path) for index, (name, path) in enumerate(zip(names, paths, strict=True))]
    scenario, load = coldload.priced(scenario)
    WORK.mkdir(parents=True, exist_ok=True)
    write_jsonl(trace, WORK / "trace.jsonl", with_text=True)
    bound = optimal.hit_rate_bound([r.adapter for r in trace], [scenario.adapter_pages_per_worker] *
                                   scenario.workers, adapter_pages)
    rows: list[dict[str, Any]] = []
    samples_by_policy: dict[str, list[Sample]] = {}
    for policy in policy_names():
        print(f"  real run: {policy} ({len(trace)} requests over {trace[-1].t_s:.0f} s)", flush=True)
        row, samples = run_policy(policy, scenario, trace, adapters, host_bytes)
        row["of_bound"] = row["effective_hit_rate"] / bound.hit_rate if bound.hit_rate else math.nan
        if row["effective_hit_rate"] > bound.hit_rate + 1e-9:
            raise AssertionError(f"{policy}: measured effective hit rate beats the bound {bound.hit_rate}")
        print(f"    effective {row['effective_hit_rate']:.3f} ({row['of_bound']:.0%} of bound), TTFT p99 "
              f"{row['ttft_p99_ms']:.0f} ms, errors {row['errors']}", flush=True)
        rows.append(row)
        samples_by_policy[policy] = samples
    report.save_json("routing-real", {"scenario": dataclasses.asdict(scenario), "bound": bound.hit_rate,
                                      "rows": rows})
    image = report.bar_panels(
        rows, [("effective_hit_rate", "effective hit rate"), ("loads", "adapter loads"),
               ("ttft_p99_ms", "TTFT p99 (ms)"), ("e2e_p99_ms", "e2e p99 (ms)")],
        "routing-real", f"Real runs: {scenario.workers} reference workers, {scenario.adapters} adapters",
        reference={"effective_hit_rate": bound.hit_rate},
    )
    from bench import calibrate, simbench

    page_bytes = host_cache_bytes_for(1)[0]
    manifest = json.loads((paths[0] / "manifest.json").read_text(encoding="utf-8"))
    calibration = calibrate.compare(scenario, trace, samples_by_policy, rows, adapter_pages, page_bytes,
                                    int(manifest["weights_bytes"]))
    parts = [
        report.provenance(COMMAND.format(quick=" --quick" if quick else "")),
        f"{scenario.workers} real `tritonserver` workers running the CPU reference engine (tiny Llama, "
        f"max batch {scenario.max_batch_size}, every step at least {scenario.min_step_ms:.0f} ms: a pretend "
        f"GPU step), host LoRA cache {scenario.adapter_pages_per_worker} pages ({host_bytes:,} bytes) each, "
        f"{scenario.adapters} synthetic rank-8 adapters (converted by `trtfleet_engines.lora`), Zipf "
        f"{scenario.zipf_alpha} popularity, Poisson {scenario.rate_per_s} req/s for {scenario.duration_s:.0f} s "
        f"({len(trace)} requests), replayed open-loop through `trtfleet router` for each policy (fresh workers "
        f"and router each time). Bound {bound.hit_rate:.3f} (pooled K = {bound.capacity_slots}, ceiling "
        f"{bound.compulsory_ceiling:.3f}). Trace: `bench/results/real/trace.jsonl`. Cold load measured first "
        f"(`python -m bench.coldload`), {coldload.describe_price(load)}.",
        report.table(rows, REAL_COLUMNS),
        simbench.verdict(rows, "Measured") + f" Offered load: {real_load(scenario, trace):.0%} of the workers' "
        "token capacity (max batch x one token per minimum step). "
        "Real runs on 2 shared cores are noisy (other processes compete for the CPU): compare policies within "
        "one run, and read the simulator for the larger picture. `out tok/s` counts streamed chunks; the "
        "router's `usage.completion_tokens` for the reference engine is an estimate from the text.",
        f"![real runs]({image})",
    ]
    if loadgen:
        from bench import loadgen_external

        parts.append(loadgen_external.section(scenario, trace, adapters, host_bytes, rows))
    return "\n\n".join(parts), calibration
