"""Calibrate the simulator against the real runs: same trace, same fleet shape, compare per policy.

The simulated fleet mirrors the real one: K pods, the workers' host-cache pages and the adapters' pages
(from ``trtfleet.loracache``), max batch 8, queue 64, adapters' real weight bytes over loopback. The
CPU-observable timing is measured, not assumed, on the least-load run only (then held fixed for the
other policies, which are the validation): the decode step is the median of ``(e2e - TTFT) / (tokens - 1)``,
the per-request overhead (client + router + Triton, both ways) comes from the TTFT median. Output lengths
are the ones the greedy tiny model actually produced (it may stop at its end token), counted as streamed
chunks, per request.
"""

from __future__ import annotations

import dataclasses
import math
import statistics
from collections.abc import Mapping, Sequence
from typing import Any

from bench import report
from bench.podsim import PodSpec, StepTimeModel
from bench.simstats import summarize
from bench.simulate import FleetSpec, sim_routing_config, simulate
from bench.traces import TraceRequest

CALIBRATION_POLICY = "least-load"
METRICS = (
    ("hit_rate", "hit rate"),
    ("loads", "loads"),
    ("ttft_p50_ms", "TTFT p50 ms"),
    ("ttft_p99_ms", "TTFT p99 ms"),
    ("e2e_p50_ms", "e2e p50 ms"),
    ("e2e_p99_ms", "e2e p99 ms"),
)


def measured_step_s(samples: Sequence[Any]) -> float:
    gaps = [(s.e2e_s - s.ttft_s) / (s.chunks - 1) for s in samples
            if s.error is None and s.e2e_s is not None and s.ttft_s is not None and s.chunks >= 2]
    return statistics.median(gaps) if gaps else 0.02


def fleet_like(
    scenario: Any, adapter_pages: int, page_bytes: int, weights_bytes: int, step_s: float, one_way_s: float
) -> FleetSpec:
    pod = PodSpec(
        host_pages=scenario.adapter_pages_per_worker, device_pages=scenario.adapter_pages_per_worker,
        page_bytes=page_bytes, max_batch_size=scenario.max_batch_size, max_num_tokens=2048,
        kv_capacity_tokens=scenario.max_batch_size * 512, max_queue_size=64,
    )
    model = StepTimeModel("reference-cpu", fixed_s=step_s, per_seq_s=0.0, per_context_token_s=0.0,
                          per_prefill_token_s=0.0, source="measured on a real run")
    return FleetSpec(
        pods=scenario.workers, pod=pod, model=model, adapter_pages=adapter_pages,
        adapter_weights_bytes=weights_bytes, link_bytes_per_s=1e9, one_way_latency_s=one_way_s,
        artifact_fetch_latency_s=0.002, artifact_bytes_per_s=1e9, scrape_interval_s=2.0,
    )


def compare(
    scenario: Any,
    trace: Sequence[TraceRequest],
    samples_by_policy: Mapping[str, Sequence[Any]],
    real_rows: Sequence[Mapping[str, Any]],
    adapter_pages: int,
    page_bytes: int,
    weights_bytes: int,
) -> dict[str, Any]:
    reference = samples_by_policy.get(CALIBRATION_POLICY) or next(iter(samples_by_policy.values()))
    step_s = measured_step_s(reference)
    ttfts = [s.ttft_s for s in reference if s.error is None and s.ttft_s is not None]
    one_way_s = max(0.0005, (statistics.median(ttfts) - 1.5 * step_s) / 2) if ttfts else 0.001
    produced = {s.key: s.chunks for s in reference if s.error is None and s.chunks > 0}
    sim_trace = [dataclasses.replace(r, max_tokens=produced.get(i, r.max_tokens)) for i, r in enumerate(trace)]
    spec = fleet_like(scenario, adapter_pages, page_bytes, weights_bytes, step_s, one_way_s)
    rows = []
    errors: dict[str, list[float]] = {"routing": [], "latency": []}
    for real in real_rows:
        policy = str(real["policy"])
        config = sim_routing_config(
            {"policy": policy, "ttft_cost": {"loadBoundInflight": getattr(scenario, "load_bound_inflight", 12)}}
        )  # the router's configuration in the real run
        simulated = summarize(simulate(sim_trace, policy, spec, seed=scenario.seed, config=config))
        sim = {
            "hit_rate": simulated["hit_rate"], "loads": simulated["loads"],
            "ttft_p50_ms": float(simulated["ttft_p50_s"]) * 1e3, "ttft_p99_ms": float(simulated["ttft_p99_s"]) * 1e3,
            "e2e_p50_ms": float(simulated["e2e_p50_s"]) * 1e3, "e2e_p99_ms": float(simulated["e2e_p99_s"]) * 1e3,
        }
        row: dict[str, Any] = {"policy": real["policy"]}
        for key, _label in METRICS:
            measured, predicted = float(real[key]), float(sim[key])
            error = (predicted - measured) / measured if measured else math.nan
            row[key] = f"{measured:.3g} / {predicted:.3g} ({error:+.0%})"
            if not math.isnan(error) and real["policy"] != CALIBRATION_POLICY:
                errors["routing" if key in ("hit_rate", "loads") else "latency"].append(abs(error))
        rows.append(row)
    columns = [("policy", "policy"), *((key, f"{label}: real / sim") for key, label in METRICS)]
    routing_error = statistics.mean(errors["routing"]) if errors["routing"] else math.nan
    latency_error = statistics.mean(errors["latency"]) if errors["latency"] else math.nan
    text = (
        f"**Calibration against the real runs** (`bench/calibrate.py`): the simulator on a model of the real "
        f"fleet ({scenario.workers} pods, {scenario.adapter_pages_per_worker} host pages each, step "
        f"{step_s * 1e3:.1f} ms and one-way overhead {one_way_s * 1e3:.1f} ms measured on the {CALIBRATION_POLICY} "
        f"run, the outputs the model produced). Mean absolute relative error over the other policies: "
        f"{routing_error:.0%} on hit rate and loads (what routing decides), {latency_error:.0%} on the latency "
        "percentiles (the simulator gives every pod its own processor; here 3 workers, the router and the "
        "client share 2 cores with whatever else runs, which the tails show).\n\n" + report.table(rows, columns)
    )
    result = {"step_s": step_s, "one_way_s": one_way_s, "routing_error": routing_error,
              "latency_error": latency_error, "rows": rows, "text": text}
    report.save_json("calibration", result)
    return result
