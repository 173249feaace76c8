"""The routing benchmark's real runs on the ``pytorch`` runtime (``python -m bench --only routing --runtime pytorch``).

The same scenario and trace as :mod:`bench.routing`, replayed through the router against reference
trtllm-serve workers (:class:`bench.realfleet_pytorch.ServeFleet`): nothing travels with a cold request
(the pod reads the PEFT directory), so ``loads`` are the router's cold routes and ``weights KB`` is 0.
Each worker's device tier holds ``max_loras`` adapters and its host tier ``adapter_pages_per_worker``
(``max_cpu_loras``); the bound is computed on the host tier's pages as the first worker reports them.
No simulator calibration (the simulator models the Triton path) and no external load generator.
"""

from __future__ import annotations

import asyncio
import dataclasses
import math
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from bench import coldload, optimal, report
from bench.realfleet import parse_counters, synthetic_peft_adapters
from bench.realfleet_pytorch import ServeFleet, serve_fleet
from bench.realscenario import WORK, RealScenario
from bench.replay import Sample, replay, summarize_samples
from bench.routing import REAL_COLUMNS
from bench.traces import TraceRequest, check_fits, generate

COMMAND = ".venv/bin/python -m bench{quick} --only routing --runtime pytorch"
MAX_LORAS = 2


def run_policy(policy: str, scenario: RealScenario, trace: Sequence[TraceRequest],
               adapters: list[tuple[str, int, Path]]) -> tuple[dict[str, Any], ServeFleet]:
    fleet = serve_fleet(policy, scenario.workers, adapters, WORK / "pytorch" / policy,
                        max_batch_size=scenario.max_batch_size, seed=scenario.seed, min_step_ms=scenario.min_step_ms,
                        max_loras=MAX_LORAS, max_cpu_loras=scenario.adapter_pages_per_worker,
                        policy_config=scenario.policy_config())
    samples: list[Sample]
    with fleet:
        began = time.monotonic()
        samples = asyncio.run(replay(fleet.base_url, trace))
        duration = time.monotonic() - began
        metrics = fleet.router_metrics()
        debug = fleet.fleets_debug()
    pods = [pod for fleet_state in debug.values() for pod in fleet_state["pods"]]
    counters = {
        "cold_starts": sum(p["cold_loads_total"] for p in pods),
        "cache_full": sum(p["cache_full_total"] for p in pods),
        "hits": parse_counters(metrics, "trtfleet_router_adapter_cache_hits"),
        "misses": parse_counters(metrics, "trtfleet_router_adapter_cache_misses"),
        "weight_bytes": parse_counters(metrics, "trtfleet_router_weight_bytes_sent"),
    }
    return summarize_samples(policy, samples, counters, duration), fleet


def pytorch_routing_section(quick: bool) -> str:
    from trtfleet_router.routing import policy_names

    scenario = RealScenario() if quick else RealScenario(adapters=200, duration_s=180.0)
    try:
        paths = synthetic_peft_adapters(scenario.adapters, seed=scenario.seed)
    except (OSError, ImportError, ValueError) as exc:
        return f"_Not run: the reference engine or its assets are missing ({exc})._"
    trace = generate(scenario.trace_spec())
    check_fits(trace, scenario.limits(), name=scenario.trace_spec().name)
    names = scenario.trace_spec().adapter_names()
    adapters = [(name, index + 1, path) for index, (name, path) in enumerate(zip(names, paths, strict=True))]
    scenario, load = coldload.priced(scenario, "pytorch")
    rows: list[dict[str, Any]] = []
    bound: optimal.BoundResult | None = None
    tiers: dict[str, Any] = {}
    for policy in policy_names():
        print(f"  real run (pytorch): {policy} ({len(trace)} requests over {trace[-1].t_s:.0f} s)", flush=True)
        row, fleet = run_policy(policy, scenario, trace, adapters)
        if bound is None:
            tiers = dict(fleet.tiers)
            bound = optimal.hit_rate_bound([r.adapter for r in trace], [int(tiers["hostPages"])] * scenario.workers,
                                           fleet.pages_per_adapter)
        row["of_bound"] = row["effective_hit_rate"] / bound.hit_rate if bound.hit_rate else math.nan
        print(f"    effective {row['effective_hit_rate']:.3f} ({row['of_bound']:.0%} of bound), TTFT p99 "
              f"{row['ttft_p99_ms']:.0f} ms, errors {row['errors']}", flush=True)
        rows.append(row)
    assert bound is not None
    report.save_json("routing-real-pytorch", {"scenario": dataclasses.asdict(scenario), "bound": bound.hit_rate,
                                              "tiers": tiers, "rows": rows})
    return "\n\n".join([
        report.provenance(COMMAND.format(quick=" --quick" if quick else "")),
        f"{scenario.workers} reference trtllm-serve workers (`python -m trtfleet_engines.reference.serve`, max batch "
        f"{scenario.max_batch_size}, every step at least {scenario.min_step_ms:.0f} ms), LoRA tiers max_loras "
        f"{MAX_LORAS} (device, {tiers['devicePages']} pages) and max_cpu_loras {scenario.adapter_pages_per_worker} "
        f"(host, {tiers['hostPages']} pages), {scenario.adapters} synthetic rank-8 PEFT adapters read by the "
        f"workers from `lora_path`, the trace of the Triton real runs. Bound {bound.hit_rate:.3f} on the host "
        "tier. Nothing travels with a cold request: `loads` are cold routes (the pod reads the adapter). Cold load "
        f"measured first (`python -m bench.coldload --runtime pytorch`), {coldload.describe_price(load)}.",
        report.table(rows, REAL_COLUMNS),
    ])
