"""The "Offline bound" and "Fleet simulation" sections: scenarios, tables, plots.

    .venv/bin/python -m bench --quick --only bound,sim

Scenarios (quick sizes in brackets):

* **bound**: every standard trace, 100,000 [20,000] requests: compulsory ceiling, Belady bound and pooled
  LRU at several pooled capacities.
* **scale**: 64 pods x 5,000 adapters x 1,000 req/s, Zipf 1.0, H100 Llama-3-8B profile, 60 s [20 s].
* **load sweep**: 16 pods x 1,000 adapters, offered load 30-85 % of compute capacity.
* **shapes**: 16 pods at 60 % load: Zipf 0.8 / 1.2 (1,000 adapters), on/off bursts, popularity shift, and
  the GIE regression shape (15 adapters; host caches cut to 4 adapters per pod so that it needs routing).
* **small caches**: 16 pods with 1 GiB host caches (12 pages) at 60 % load, 20,000 [6,000] requests: trtfleet
  answering 503 at once when every cache is full of busy adapters vs waiting for capacity (the default).
* **growth**: decision time and router memory vs pods and adapters (``bench/routing_decision.py``).
"""

from __future__ import annotations

import argparse
import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any

from trtfleet_router.routing import policy_names

from bench import optimal, report
from bench.podsim import fit_report
from bench.profiles import GIB, h100_llama3_8b_fleet, pod_capacity_requests_per_s
from bench.simstats import summarize
from bench.simulate import FleetSpec, sim_routing_config, simulate
from bench.traces import TraceRequest, TraceSpec, generate, offered_load, standard_specs

COMMAND = ".venv/bin/python -m bench{quick} --only bound,sim"
SIM_COLUMNS = (
    ("policy", "policy"),
    ("hit_rate", "hit rate"),
    ("effective_hit_rate", "effective"),
    ("of_bound", "of bound"),
    ("loads", "loads"),
    ("weights_gb", "weights GB"),
    ("ttft_p50_ms", "TTFT p50 ms"),
    ("ttft_p99_ms", "TTFT p99 ms"),
    ("e2e_p50_s", "e2e p50 s"),
    ("e2e_p99_s", "e2e p99 s"),
    ("output_tokens_per_s", "out tok/s"),
    ("errors", "errors"),
    ("decision_p50_us", "decision p50 us"),
)


def run_policies(
    trace: Sequence[TraceRequest], spec: FleetSpec, *, seed: int = 0
) -> tuple[list[dict[str, Any]], optimal.BoundResult]:
    """Every policy on ``trace``; rows carry the share of the bound. Asserts no policy beats it."""
    adapters = [r.adapter for r in trace]
    bound = optimal.hit_rate_bound(adapters, [spec.pod.host_pages] * spec.pods, spec.adapter_pages)
    rows = []
    for policy in policy_names():
        result = simulate(trace, policy, spec, seed=seed)
        row: dict[str, Any] = dict(summarize(result))
        admitted_bound = optimal.belady_hits(result.admitted_adapters, bound.capacity_slots) / len(trace)
        effective = float(row["effective_hit_rate"])
        if effective > admitted_bound + 1e-9:
            raise AssertionError(f"{policy}: effective hit rate {effective} beats its bound {admitted_bound}")
        row.update(
            of_bound=effective / bound.hit_rate if bound.hit_rate else float("nan"),
            above_trace_order_bound=effective > bound.hit_rate + 1e-9,
            weights_gb=int(row["weights_bytes"]) / 1e9,
            ttft_p50_ms=float(row["ttft_p50_s"]) * 1e3,
            ttft_p99_ms=float(row["ttft_p99_s"]) * 1e3,
            pod_loads=result.pod_loads,
            fleet_counters=result.fleet_counters,
        )
        rows.append(row)
        print(f"  {policy:<18} effective {effective:.3f} ({row['of_bound']:.0%} of bound) "
              f"TTFT p99 {row['ttft_p99_ms']:.0f} ms errors {row['errors']} ({row['wall_s']:.1f} s)", flush=True)
    return rows, bound


def fleet_load(trace: Sequence[TraceRequest], spec: FleetSpec) -> float:
    summary = offered_load(trace)
    per_pod = pod_capacity_requests_per_s(spec, summary["mean_prompt_tokens"], summary["mean_max_tokens"])
    return summary["rate_per_s"] / (spec.pods * per_pod)


def trace_at_load(spec: FleetSpec, load: float, base: TraceSpec) -> list[TraceRequest]:
    probe = generate(dataclasses.replace(base, num_requests=2000))
    summary = offered_load(probe)
    rate = load * spec.pods * pod_capacity_requests_per_s(spec, summary["mean_prompt_tokens"],
                                                          summary["mean_max_tokens"])
    return generate(dataclasses.replace(base, rate_per_s=rate))


# -- bound ----------------------------------------------------------------------------------------------
def bound_section(quick: bool) -> str:
    requests = 20_000 if quick else 100_000
    capacities = (8, 32, 128, 512)
    rows = []
    curves: dict[str, list[tuple[int, float, float]]] = {}
    for spec in standard_specs(num_requests=requests):
        adapters = [r.adapter for r in generate(spec)]
        row: dict[str, Any] = {"trace": spec.name, "distinct": len(set(adapters))}
        row["ceiling"] = 1 - len(set(adapters)) / len(adapters)
        for slots in capacities:
            row[f"bound_{slots}"] = optimal.belady_hits(adapters, slots) / len(adapters)
        row["lru_128"] = optimal.lru_hits(adapters, 128) / len(adapters)
        rows.append(row)
        if spec.name in ("zipf-n1000-a0.8", "zipf-n1000-a1.2", "shift-n200-a1.0", "gie-regression"):
            curves[spec.name] = [
                (k, optimal.belady_hits(adapters, k) / len(adapters), optimal.lru_hits(adapters, k) / len(adapters))
                for k in (1, 2, 4, 8, 16, 32, 64, 128, 256, 512)
            ]
    report.save_json("bound", rows)
    plt = report.pyplot()
    fig, axis = plt.subplots(figsize=(6.4, 3.8))
    for (name, points), colour in zip(curves.items(), ["C0", "C1", "C2", "C3"], strict=False):
        axis.plot([p[0] for p in points], [p[1] for p in points], color=colour, label=f"{name} Belady")
        axis.plot([p[0] for p in points], [p[2] for p in points], color=colour, linestyle=":",
                  label=f"{name} LRU")
    axis.set_xscale("log", base=2)
    axis.set_xlabel("pooled cache capacity K (adapters, all pods)")
    axis.set_ylabel("hit rate")
    axis.legend(fontsize=7)
    image = report.save_figure(fig, "bound-vs-capacity")
    columns = [("trace", "trace"), ("distinct", "adapters seen"), ("ceiling", "ceiling 1-distinct/n")]
    columns += [(f"bound_{k}", f"bound K={k}") for k in capacities]
    columns += [("lru_128", "pooled LRU K=128")]
    return "\n\n".join([
        report.provenance(COMMAND.format(quick=" --quick" if quick else "")),
        f"Belady with bypass on one pooled cache of K uniform slots, `K = sum_p floor(C_p / s_min)` "
        f"(`bench/optimal.py` has the argument why no policy, prewarming included, can do better on the "
        f"same order of admissions). {requests:,} requests per trace; rate does not matter to the bound. "
        "Pooled LRU is a reference point, not a bound: the gap between the two is what eviction "
        "foresight is worth; the gap between the bound and a policy is what routing loses.",
        report.table(rows, columns),
        f"![bound vs capacity]({image})",
    ])


# -- simulation ------------------------------------------------------------------------------------------
def _scale(quick: bool) -> tuple[str, list[dict[str, Any]], dict[str, Any]]:
    spec = h100_llama3_8b_fleet(64)
    duration_s = 10 if quick else 60
    trace = generate(TraceSpec(name="scale", num_adapters=5000, zipf_alpha=1.0, rate_per_s=1000.0,
                               num_requests=1000 * duration_s, seed=11))
    print(f"scale: 64 pods x 5,000 adapters x 1,000 req/s, {len(trace):,} requests", flush=True)
    rows, bound = run_policies(trace, spec)
    meta = {"load": fleet_load(trace, spec), "bound": bound.hit_rate, "ceiling": bound.compulsory_ceiling,
            "slots": bound.capacity_slots, "spec": dataclasses.asdict(spec)}
    report.save_json("sim-scale", {"meta": meta, "rows": rows})
    image = report.bar_panels(
        rows, [("effective_hit_rate", "effective hit rate"), ("weights_gb", "weights sent (GB)"),
               ("ttft_p99_ms", "TTFT p99 (ms)"), ("e2e_p99_s", "e2e p99 (s)")],
        "sim-scale", "Simulated: 64 H100 pods, 5,000 adapters, 1,000 req/s", reference={"effective_hit_rate":
                                                                                      bound.hit_rate},
    )
    text = verdict(rows, "At scale") + "\n\n" + (
        f"**At scale**: 64 pods (H100, Llama-3-8B, 4 GiB host LoRA cache = {spec.pod.host_pages} pages, rank-8 "
        f"adapters of {spec.adapter_weights_bytes / 2**20:.0f} MiB = {spec.adapter_pages} page), 5,000 adapters, "
        f"Zipf 1.0, Poisson 1,000 req/s, {len(trace):,} requests; fleet load {meta['load']:.0%} of compute "
        f"capacity. Bound {bound.hit_rate:.3f} (K = {bound.capacity_slots:,}; ceiling "
        f"{bound.compulsory_ceiling:.3f}).\n\n" + report.table(rows, SIM_COLUMNS) + f"\n\n![scale]({image})"
    )
    return text, rows, meta


def _load_sweep(quick: bool) -> tuple[str, list[dict[str, Any]]]:
    spec = h100_llama3_8b_fleet(16)
    base = TraceSpec(name="sweep", num_adapters=1000, zipf_alpha=1.0, num_requests=6000 if quick else 30_000,
                     seed=12)
    loads = (0.3, 0.5, 0.7, 0.85)
    sweep: list[dict[str, Any]] = []
    for load in loads:
        trace = trace_at_load(spec, load, base)
        print(f"load sweep: {load:.0%} ({offered_load(trace)['rate_per_s']:.0f} req/s)", flush=True)
        rows, bound = run_policies(trace, spec)
        for row in rows:
            sweep.append({"load": load, "bound": bound.hit_rate, **row})
    report.save_json("sim-load-sweep", sweep)
    plt = report.pyplot()
    fig, axes = plt.subplots(1, 3, figsize=(11, 3.4))
    for policy in policy_names():
        points = [row for row in sweep if row["policy"] == policy]
        xs = [row["load"] * 100 for row in points]
        axes[0].plot(xs, [row["of_bound"] for row in points], marker="o", label=policy)
        axes[1].plot(xs, [row["ttft_p99_ms"] for row in points], marker="o", label=policy)
        axes[2].plot(xs, [row["weights_gb"] for row in points], marker="o", label=policy)
    axes[0].set_ylabel("effective hit rate / bound")
    axes[1].set_ylabel("TTFT p99 (ms)")
    axes[1].set_yscale("log")
    axes[2].set_ylabel("weights sent (GB)")
    for axis in axes:
        axis.set_xlabel("fleet load (% of compute capacity)")
    axes[0].legend(fontsize=7)
    image = report.save_figure(fig, "sim-load-sweep")
    columns = [("load", "load"), ("policy", "policy"), ("effective_hit_rate", "effective"),
               ("bound", "bound"), ("of_bound", "of bound"), ("ttft_p50_ms", "TTFT p50 ms"),
               ("ttft_p99_ms", "TTFT p99 ms"), ("e2e_p99_s", "e2e p99 s"), ("weights_gb", "weights GB"),
               ("errors", "errors")]
    lines = [verdict([r for r in sweep if r["load"] == load], f"At {load:.0%} load") for load in loads]
    text = (
        f"**Load sweep**: 16 pods, 1,000 adapters, Zipf 1.0, {base.num_requests:,} requests per point.\n\n"
        + "\n".join(f"* {line}" for line in lines) + "\n\n"
        + report.table(sweep, columns) + f"\n\n![load sweep]({image})"
    )
    return text, sweep


def _small_caches(quick: bool) -> str:
    """Caches too small for the busy adapters (1 GiB host cache = 12 pages per pod, batch 64): trtfleet answering
    503 at once on ``CachesBusy`` (``capacityWaitS: 0``, the behaviour before 2026-11-22) against waiting in the
    router for a request to end (the default), with chwbl as the baseline that lets the engines say "cache full".
    """
    spec = h100_llama3_8b_fleet(16, host_bytes=GIB)
    base = TraceSpec(name="small-caches", num_adapters=1000, zipf_alpha=1.0, num_requests=6000 if quick else 20_000,
                     seed=13)
    trace = trace_at_load(spec, 0.6, base)
    bound = optimal.hit_rate_bound([r.adapter for r in trace], [spec.pod.host_pages] * spec.pods, spec.adapter_pages)
    print(f"small caches: 16 pods x {spec.pod.host_pages} pages, {len(trace):,} requests", flush=True)
    rows: list[dict[str, Any]] = []
    cases = (("ttft-cost, 503 at once", "ttft-cost", 0.0), ("ttft-cost, wait (default)", "ttft-cost", None),
             ("chwbl", "chwbl", None))
    for label, policy, wait_s in cases:
        config = sim_routing_config({"policy": policy, **({} if wait_s is None else {"capacityWaitS": wait_s})})
        row: dict[str, Any] = dict(summarize(simulate(trace, policy, spec, config=config)))
        row.update(variant=label, of_bound=float(row["effective_hit_rate"]) / bound.hit_rate,
                   ttft_p50_ms=float(row["ttft_p50_s"]) * 1e3, ttft_p99_ms=float(row["ttft_p99_s"]) * 1e3)
        rows.append(row)
    report.save_json("sim-small-caches", {"bound": bound.hit_rate, "rows": rows})
    columns = [("variant", "variant"), ("effective_hit_rate", "effective"), ("of_bound", "of bound"),
               ("loads", "loads"), ("ttft_p50_ms", "TTFT p50 ms"), ("ttft_p99_ms", "TTFT p99 ms"),
               ("e2e_p99_s", "e2e p99 s"), ("errors", "errors"), ("error_kinds", "error kinds")]
    return (
        f"**Small caches**: 16 pods with a 1 GiB host LoRA cache ({spec.pod.host_pages} pages) and max batch "
        f"{spec.pod.max_batch_size}, 1,000 adapters, Zipf 1.0, 60 % load, {len(trace):,} requests; bound "
        f"{bound.hit_rate:.3f}. More adapters are busy at once than the caches hold, so a cold request often finds "
        "every cache full of busy adapters. trtfleet used to answer 503 then; it now waits in the router "
        "(`capacityWaitS`, default 10 s, FIFO per base model, re-routed when a request ends) and answers 503 only "
        "after that. `no_capacity`: 503 from the router; `cache_full`: the engines' back-pressure after "
        "`max_attempts`.\n\n" + report.table(rows, columns)
    )


def verdict(rows: Sequence[Mapping[str, Any]], label: str, default: str = "ttft-cost") -> str:
    """One sentence: the default policy's share of the bound and its p99 TTFT against the baselines'."""
    mine = next((row for row in rows if row["policy"] == default), None)
    others = [row for row in rows if row["policy"] != default]
    if mine is None or not others:
        return ""
    best = min(others, key=lambda row: float(row["ttft_p99_ms"]))
    ratio = float(mine["ttft_p99_ms"]) / float(best["ttft_p99_ms"])
    goal = "meets" if float(mine["of_bound"]) >= 0.9 else "misses"
    lower = "lower than" if ratio < 1 else "higher than"
    return (f"{label}: {default} reaches {float(mine['of_bound']):.0%} of the bound ({goal} the 90 % goal); its "
            f"p99 TTFT is {ratio:.2f}x the best baseline's ({best['policy']}), i.e. {lower} every baseline's.")


def _shapes(quick: bool) -> tuple[str, list[dict[str, Any]]]:
    spec = h100_llama3_8b_fleet(16)
    requests = 6000 if quick else 30_000
    cases = [
        TraceSpec(name="zipf-n1000-a0.8", num_adapters=1000, zipf_alpha=0.8, num_requests=requests, seed=13),
        TraceSpec(name="zipf-n1000-a1.2", num_adapters=1000, zipf_alpha=1.2, num_requests=requests, seed=13),
        TraceSpec(name="onoff-n1000-a1.0", num_adapters=1000, arrivals="onoff", num_requests=requests, seed=13),
        TraceSpec(name="shift-n1000-a1.0", num_adapters=1000, shift_at_fraction=0.5, num_requests=requests,
                  seed=13),
        TraceSpec(name="gie-regression", num_adapters=15, popularity="gie-regression", num_requests=requests,
                  seed=13),
    ]
    rows_out: list[dict[str, Any]] = []
    for case in cases:
        case_spec = spec
        if case.popularity == "gie-regression":  # 15 adapters fit everywhere: shrink caches to 4 each
            case_spec = dataclasses.replace(spec, pod=dataclasses.replace(spec.pod, host_pages=4))
        trace = trace_at_load(case_spec, 0.6, case)
        print(f"shape {case.name}", flush=True)
        rows, bound = run_policies(trace, case_spec)
        for row in rows:
            rows_out.append({"trace": case.name, "bound": bound.hit_rate, **row})
    report.save_json("sim-shapes", rows_out)
    columns = [("trace", "trace"), ("policy", "policy"), ("effective_hit_rate", "effective"),
               ("bound", "bound"), ("of_bound", "of bound"), ("ttft_p99_ms", "TTFT p99 ms"),
               ("e2e_p99_s", "e2e p99 s"), ("weights_gb", "weights GB"), ("errors", "errors")]
    text = (
        f"**Trace shapes** at 60 % load on 16 pods ({requests:,} requests each). The GIE regression shape "
        "(15 adapters, 5 x 12 % / 5 x 6 % / 5 x 2 %) runs with host caches cut to 4 pages per pod, since "
        "15 adapters fit every 46-page cache and any policy would hit 100 %.\n\n" + report.table(rows_out, columns)
    )
    return text, rows_out


def _growth(quick: bool) -> str:
    from bench import routing_decision

    grid = [(8, 1000), (16, 1000), (32, 1000), (64, 1000), (128, 1000),
            (64, 500), (64, 5000), (64, 20000)]
    if quick:
        grid = [(8, 1000), (32, 1000), (64, 1000), (128, 1000), (64, 5000), (64, 20000)]
    args = argparse.Namespace(requests=5000 if quick else 20_000, warmup=5000 if quick else 20_000,
                              concurrency=256, zipf_s=1.0, seed=7)
    rows: list[dict[str, Any]] = []
    for pods, adapters in grid:
        row = routing_decision.run_case("ttft-cost", pods, adapters, args)
        print(f"growth: {pods} pods x {adapters} adapters: route p50 {row['route_p50_us']} us", flush=True)
        rows.append(row)
    report.save_json("sim-growth", rows)
    plt = report.pyplot()
    fig, axes = plt.subplots(1, 2, figsize=(9, 3.4))
    by_pods = sorted((r for r in rows if r["adapters"] == 1000), key=lambda r: r["pods"])
    by_adapters = sorted((r for r in rows if r["pods"] == 64), key=lambda r: r["adapters"])
    for axis, series, key, label in ((axes[0], by_pods, "pods", "pods (1,000 adapters)"),
                                     (axes[1], by_adapters, "adapters", "adapters (64 pods)")):
        xs = [r[key] for r in series]
        axis.plot(xs, [r["route_p50_us"] for r in series], marker="o", label="route p50 (us)")
        axis.plot(xs, [r["route_p99_us"] for r in series], marker="o", label="route p99 (us)")
        twin = axis.twinx()
        twin.plot(xs, [r["fleet_memory_mib"] for r in series], marker="s", color="grey", label="memory (MiB)")
        twin.set_ylabel("router memory (MiB)")
        axis.set_xscale("log", base=2)
        axis.set_xlabel(label)
        axis.set_ylabel("decision time (us)")
        axis.legend(fontsize=7, loc="upper left")
    image = report.save_figure(fig, "sim-growth")
    columns = [("pods", "pods"), ("adapters", "adapters"), ("route_p50_us", "route p50 us"),
               ("route_p99_us", "route p99 us"), ("start_finish_p50_us", "start+finish p50 us"),
               ("fleet_memory_mib", "memory MiB")]
    target = next((r for r in rows if r["pods"] == 64 and r["adapters"] == 5000), None)
    verdict = ""
    if target is not None:
        verdict = (f" At 64 pods x 5,000 adapters the median decision takes {target['route_p50_us']} us "
                   f"({'under' if target['route_p50_us'] < 100 else 'OVER'} the 100 us target).")
    return (
        "**Growth** of the trtfleet decision (`Fleet.route`) and of the fleet's memory (tracemalloc) with pods "
        "and adapters, measured with `bench/routing_decision.py`'s harness (Zipf 1.0 stream, 256 in flight)."
        + verdict + "\n\n" + report.table(rows, columns) + f"\n\n![growth]({image})"
    )


def fit_table() -> str:
    rows = [{"isl": isl, "osl": osl, "published": pub, "model": mod, "error": f"{err:+.1%}"}
            for isl, osl, pub, mod, err in fit_report()]
    return report.table(rows, [("isl", "ISL"), ("osl", "OSL"), ("published", "published tok/s"),
                               ("model", "model tok/s"), ("error", "error")])


def sim_section(quick: bool, calibration: Mapping[str, Any] | None = None) -> str:
    scale_text, _rows, _meta = _scale(quick)
    sweep_text, _sweep = _load_sweep(quick)
    shapes_text, _shapes_rows = _shapes(quick)
    growth_text = _growth(quick)
    small_text = _small_caches(quick)
    model_text = (
        "The simulator (`bench/simulate.py`) drives the router's own `Fleet` and policies (no second "
        "implementation) against simulated pods whose LoRA cache is `trtfleet.loracache.LoraPageCache` "
        "(`bench/podsim.py`): in-flight batching steps, KV reservation, a bounded queue, host and device "
        "tiers, TRT-LLM's miss / cache-full errors answered as the router does (re-send, retry elsewhere, "
        "503 on no capacity), weights over a 10 GbE pod link, artifact fetches for adapters not in the "
        "router's 2 GiB weight store (50 ms + 0.5 GB/s), and each decision's measured wall time. GPU step "
        "time `fixed + a*running + b*context + c*prefill` is fitted to NVIDIA's published TensorRT-LLM "
        "figures (Llama-3.1-8B FP8, one H100; `docs/source/performance/perf-overview.md`) and the batch-1 "
        "first-token latency of the v0.5 performance page (7 ms at 128 tokens): 5.2 ms + 14 us/sequence + "
        "0.025 us/context token + 14.5 us/prefill token. Fit against the published throughputs:\n\n"
        + fit_table()
    )
    parts = [report.provenance(COMMAND.format(quick=" --quick" if quick else "")), model_text, scale_text,
             sweep_text, shapes_text, small_text, growth_text]
    if calibration:
        parts.append(str(calibration.get("text", "")))
    return "\n\n".join(parts)
