"""Tenants on one fleet: a flooding tenant beside a steady one, both backlogged under weights, and a high band beside a
saturating low band; first come first served, llm-d's flow control and trtfleet's admission side by side.

    .venv/bin/python -m bench.tenants [--quick] [--sim-only | --real-only] [--admissions vtc,vtc-reserve] [--reserved N]
                                       [--write]

**Simulator** (section ``tenants-sim``): 64 H100 pods (``bench.profiles.h100_llama3_8b_fleet``, the router's
``ttft-cost`` policy), lognormal prompts (median 1000) and outputs (median 250), open-loop Poisson arrivals, the
admissions of :mod:`bench.simtenants`. ``capacity`` is the fleet's requests/s at a full batch of mean-sized
requests; the fair share of each of two tenants of equal weight is half of it. Figures are over the requests that
arrived after the warm-up (the fleet fills; no request ends in the first seconds).

**Reference fleet** (section ``tenants-real``): reference trtllm-serve workers (``bench.realfleet_pytorch``) and one
``trtfleet router`` subprocess per admission, the tenant named by the fairness header (``tenancy.fairnessHeader``),
the client :func:`bench.replay.replay_spread`. Same scenarios at the fleet's scale.

Scenarios: **flood** (tenant A at 5x its fair share, B steady at 0.6x of its share, and B alone), **weights** (A at
5x, B at 2x its share: both backlogged; served-token shares against weights 1:1 and 1:3), **bands** (a sheddable
tenant at 2x the fleet's capacity, a critical one at 0.2x, and the critical one alone). ``vtc-reserve`` is trtfleet's
admission with ``tenancy.saturation.reservedPerPod`` (``--reserved``, 1 by default: each pod's last slot only for
requests not flooding).
"""

from __future__ import annotations

import argparse
import asyncio
import math
import tempfile
import threading
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Final

from trtfleet_router.routing.fairqueue import Priority

from bench import report
from bench.profiles import h100_llama3_8b_fleet, pod_capacity_requests_per_s
from bench.routerwindow import cumulative_buckets, window_quantile
from bench.simstats import percentile
from bench.simtenants import OUTPUT, PROMPT, Admission, TenantSimulation, Traffic, tenant_trace
from bench.simtypes import FleetSpec

PODS: Final = 64
ADMISSION_LABELS: Final = {"fcfs": "first come, first served", "llmd": "llm-d flow control", "vtc": "trtfleet (VTC)",
                           "vtc-reserve": "trtfleet (VTC), {reserved} reserved per pod"}
RESERVED: Final = 1
QUEUE_WAIT: Final = "trtfleet_router_queue_wait_seconds"
CRITICAL, INTERACTIVE, SHEDDABLE = Priority.CRITICAL, Priority.INTERACTIVE, Priority.SHEDDABLE


def _mean(spec: Any) -> float:
    return float(spec.median * math.exp(spec.sigma**2 / 2))


@dataclass(frozen=True)
class Outcome:
    """What one tenant got in one run, over the requests that arrived in the measured window."""

    tenant: str
    requests: int
    ok: int
    ttft_p50_s: float | None
    ttft_p99_s: float | None
    refused: int
    tokens_per_s: float
    """Prompt + output tokens of its requests that finished in the window, per second."""
    router_wait_p99_s: float | None = None
    """How long its requests waited in the router before they started (p99): the simulator's own figure; on the
    reference fleet, the router's histogram over the requests that started after the warm-up."""


Row = tuple[float, float | None, float | None, int, bool, float]


def outcome(tenant: str, rows: Sequence[Row], window: tuple[float, float]) -> Outcome:
    """``rows``: (arrival, TTFT, finish time, tokens, ok, router wait) of the tenant's requests."""
    start, end = window
    arrived = [row for row in rows if start <= row[0] < end]
    ok = sorted(row[1] for row in arrived if row[4] and row[1] is not None)
    waits = sorted(row[5] for row in arrived if row[4])
    finished = sum(row[3] for row in rows if row[4] and row[2] is not None and start <= row[2] < end)
    return Outcome(
        tenant, len(arrived), len(ok), percentile(ok, 50) if ok else None, percentile(ok, 99) if ok else None,
        sum(1 for row in arrived if not row[4]), finished / (end - start), percentile(waits, 99) if waits else None,
    )


# -- simulator ------------------------------------------------------------------------------------------------
def sim_capacity(spec: FleetSpec) -> float:
    return spec.pods * pod_capacity_requests_per_s(spec, _mean(PROMPT), _mean(OUTPUT))


def run_sim(spec: FleetSpec, flows: Sequence[Traffic], admission: Admission, duration_s: float, warmup_s: float,
            seed: int = 1) -> dict[str, Outcome]:
    trace, per_request = tenant_trace(flows, duration_s, seed)
    started = time.perf_counter()
    result = TenantSimulation(trace, per_request, spec, admission, seed=seed).run()
    rows: dict[str, list[Row]] = {}
    for record, request, flow in zip(result.records, trace, per_request, strict=True):
        finish = record.arrival_s + record.e2e_s if record.e2e_s is not None else None
        tokens = request.prompt_tokens + request.max_tokens
        rows.setdefault(flow.tenant, []).append((record.arrival_s, record.ttft_s, finish, tokens,
                                                 record.error is None and record.ttft_s is not None, record.waited_s))
    found = {tenant: outcome(tenant, tenant_rows, (warmup_s, duration_s)) for tenant, tenant_rows in rows.items()}
    label = admission.mode + (f" +{admission.reserved_per_pod} reserved" if admission.reserved_per_pod else "")
    print(f"  {label:<5} {len(trace)} requests, {time.perf_counter() - started:.0f} s: "
          + "; ".join(f"{o.tenant} p99 {_ms(o.ttft_p99_s)} refused {o.refused}" for o in found.values()), flush=True)
    return found


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value * 1000:.0f} ms"


def sim_section(quick: bool, modes: Sequence[str] = tuple(ADMISSION_LABELS), reserved: int = RESERVED
                ) -> tuple[str, dict[str, Any]]:
    spec = h100_llama3_8b_fleet(PODS)
    capacity = sim_capacity(spec)
    duration_s, warmup_s = (25.0, 10.0) if quick else (45.0, 15.0)
    share = capacity / 2
    per_pod = spec.pod.max_batch_size
    print(f"simulator: {PODS} pods, capacity {capacity:.0f} requests/s", flush=True)
    data: dict[str, Any] = {"capacity_rps": capacity, "duration_s": duration_s, "warmup_s": warmup_s, "quick": quick,
                            "reserved": reserved}

    def admissions(weights: tuple[tuple[str, float], ...] = ()) -> dict[str, Admission]:
        every = {"fcfs": Admission("fcfs"), "llmd": Admission("llmd"),
                 "vtc": Admission("vtc", inflight_per_pod=per_pod, weights=weights),
                 "vtc-reserve": Admission("vtc", inflight_per_pod=per_pod, weights=weights,
                                          reserved_per_pod=reserved)}
        return {mode: every[mode] for mode in modes}

    flood = [Traffic("A", INTERACTIVE, 5 * share, "adapter-a"), Traffic("B", INTERACTIVE, 0.6 * share, "adapter-b")]
    alone = run_sim(spec, flood[1:], Admission("vtc", inflight_per_pod=per_pod), duration_s, warmup_s)["B"]
    flood_runs = {mode: run_sim(spec, flood, a, duration_s, warmup_s) for mode, a in admissions().items()}
    data["flood"] = {"alone": alone, "runs": flood_runs}

    backlogged = [Traffic("A", INTERACTIVE, 5 * share, "adapter-a"), Traffic("B", INTERACTIVE, 2 * share, "adapter-b")]
    weight_runs = {mode: run_sim(spec, backlogged, a, duration_s, warmup_s) for mode, a in admissions().items()}
    weighted = run_sim(spec, backlogged, Admission("vtc", inflight_per_pod=per_pod, weights=(("B", 3.0),)),
                       duration_s, warmup_s)
    data["weights"] = {"runs": weight_runs, "vtc_1_3": weighted}

    bands = [Traffic("low", SHEDDABLE, 2 * capacity, "adapter-a"), Traffic("high", CRITICAL, 0.2 * capacity,
                                                                             "adapter-b")]
    high_alone = run_sim(spec, bands[1:], Admission("vtc", inflight_per_pod=per_pod), duration_s, warmup_s)["high"]
    band_runs = {mode: run_sim(spec, bands, a, duration_s, warmup_s) for mode, a in admissions().items()}
    data["bands"] = {"alone": high_alone, "runs": band_runs}
    return render("sim", data, capacity, f"{PODS} simulated H100 pods"), data


# -- reference fleet -----------------------------------------------------------------------------------------
REAL_WORKERS: Final = 2
REAL_BATCH: Final = 4
REAL_STEP_MS: Final = 40.0
REAL_PROMPT: Final = 48
REAL_OUTPUT: Final = 16


@dataclass(frozen=True)
class RealFlow:
    tenant: str
    band: Priority
    rate_per_s: float
    adapter: str


def real_capacity() -> float:
    """Requests/s of the reference fleet: each worker runs REAL_BATCH requests, one step per token (plus prefill)."""
    per_request_s = (REAL_OUTPUT + 1) * REAL_STEP_MS / 1000
    return REAL_WORKERS * REAL_BATCH / per_request_s


def real_policy_config(mode: str, flows: Sequence[RealFlow], weights: Mapping[str, float] | None = None,
                       reserved: int = RESERVED) -> dict[str, Any]:
    tenants: dict[str, Any] = {flow.tenant: {"priority": flow.band.value} for flow in flows}
    for tenant, weight in (weights or {}).items():
        tenants.setdefault(tenant, {})["weight"] = weight
    tenancy: dict[str, Any] = {"fairnessHeader": True, "tenants": tenants}
    if mode == "llmd":
        tenancy |= {"order": "llmd-round-robin", "saturation": {"detector": "llmd-utilization"}}
    elif mode == "vtc":
        tenancy |= {"saturation": {"inflightPerPod": REAL_BATCH}}
    elif mode == "vtc-reserve":
        tenancy |= {"saturation": {"inflightPerPod": REAL_BATCH, "reservedPerPod": reserved}}
    else:
        tenancy |= {"order": "fcfs"}
    return {"tenancy": tenancy, "metricsStaleAfterS": 5}


def run_real(flows: Sequence[RealFlow], mode: str, duration_s: float, warmup_s: float, work: Path,
             adapters: Sequence[tuple[str, int, Path]], weights: Mapping[str, float] | None = None,
             reserved: int = RESERVED) -> dict[str, Outcome]:
    from bench.realfleet_pytorch import serve_fleet
    from bench.replay import replay_spread
    from bench.traces import TraceRequest

    traffic = [Traffic(f.tenant, f.band, f.rate_per_s, f.adapter) for f in flows]
    sized = [replace(t, prompt=replace(PROMPT, median=REAL_PROMPT, sigma=0.0, min_tokens=REAL_PROMPT,
                                       max_tokens=REAL_PROMPT),
                     output=replace(OUTPUT, median=REAL_OUTPUT, sigma=0.0, min_tokens=REAL_OUTPUT,
                                    max_tokens=REAL_OUTPUT)) for t in traffic]
    trace, per_request = tenant_trace(sized, duration_s, seed=3)
    trace = [TraceRequest(r.t_s, r.request_id, r.adapter, r.prompt_tokens, r.max_tokens) for r in trace]
    fleet = serve_fleet("ttft-cost", REAL_WORKERS, adapters, work, max_batch_size=REAL_BATCH, max_queue_size=64,
                        min_step_ms=REAL_STEP_MS, max_loras=2, max_cpu_loras=2,
                        policy_config=real_policy_config(mode, flows, weights, reserved))
    fleet.start()
    try:
        headers = [{"x-llm-d-inference-fairness-id": flow.tenant} for flow in per_request]
        at_warmup: list[str] = []  # the router's metrics once the warm-up is over
        timer = threading.Timer(warmup_s, lambda: at_warmup.append(fleet.router_metrics()))
        started = time.perf_counter()
        timer.start()
        try:
            samples = asyncio.run(replay_spread([fleet.base_url], [0] * len(trace), trace, 120.0, headers=headers))
        finally:
            timer.cancel()
        elapsed = time.perf_counter() - started
        waits = router_waits(at_warmup[0] if at_warmup else "", fleet.router_metrics(), {f.tenant for f in flows})
    finally:
        fleet.stop()
    rows: dict[str, list[Row]] = {}
    for sample, request, flow in zip(samples, trace, per_request, strict=True):
        finish = request.t_s + sample.e2e_s if sample.e2e_s is not None else None
        ok = sample.error is None and sample.ttft_s is not None
        rows.setdefault(flow.tenant, []).append((request.t_s, sample.ttft_s, finish, request.prompt_tokens
                                                 + sample.output_tokens, ok, 0.0))
    found = {tenant: replace(outcome(tenant, tenant_rows, (warmup_s, duration_s)), router_wait_p99_s=waits[tenant])
             for tenant, tenant_rows in rows.items()}
    print(f"  {mode:<5} {len(trace)} requests, {elapsed:.0f} s: "
          + "; ".join(f"{o.tenant} p99 {_ms(o.ttft_p99_s)} refused {o.refused}" for o in found.values()), flush=True)
    return found


def router_waits(before: str, after: str, tenants: Iterable[str]) -> dict[str, float | None]:
    """Each tenant's p99 wait in the router over the requests that started between two scrapes of its metrics
    (``trtfleet_router_queue_wait_seconds``, interpolated in a bucket as Prometheus does)."""
    found: dict[str, float | None] = {}
    for tenant in tenants:
        match = {"tenant": tenant}
        p99 = window_quantile(cumulative_buckets(before, QUEUE_WAIT, match), cumulative_buckets(after, QUEUE_WAIT,
                                                                                               match), 0.99)
        found[tenant] = None if math.isnan(p99) else p99
    return found


def real_section(quick: bool, modes: Sequence[str] = tuple(ADMISSION_LABELS), reserved: int = RESERVED
                 ) -> tuple[str, dict[str, Any]]:
    from bench.realfleet import synthetic_peft_adapters

    paths = synthetic_peft_adapters(2, seed=40)
    adapters = [("adapter-a", 1, paths[0]), ("adapter-b", 2, paths[1])]
    capacity = real_capacity()
    share = capacity / 2
    duration_s, warmup_s = (30.0, 10.0) if quick else (60.0, 15.0)
    print(f"reference fleet: {REAL_WORKERS} workers, capacity about {capacity:.1f} requests/s", flush=True)
    data: dict[str, Any] = {"capacity_rps": capacity, "duration_s": duration_s, "warmup_s": warmup_s, "quick": quick,
                            "reserved": reserved}
    with tempfile.TemporaryDirectory(prefix="tenants-") as tmp:
        work = Path(tmp)
        flood = [RealFlow("A", INTERACTIVE, 5 * share, "adapter-a"), RealFlow("B", INTERACTIVE, 0.6 * share,
                                                                            "adapter-b")]
        data["flood"] = {
            "alone": run_real(flood[1:], "vtc", duration_s, warmup_s, work / "alone", adapters)["B"],
            "runs": {mode: run_real(flood, mode, duration_s, warmup_s, work / mode, adapters, reserved=reserved)
                     for mode in modes},
        }
        backlogged = [RealFlow("A", INTERACTIVE, 5 * share, "adapter-a"), RealFlow("B", INTERACTIVE, 2 * share,
                                                                                 "adapter-b")]
        data["weights"] = {
            "runs": {mode: run_real(backlogged, mode, duration_s, warmup_s, work / f"w-{mode}", adapters,
                                    reserved=reserved)
                     for mode in modes},
            "vtc_1_3": run_real(backlogged, "vtc", duration_s, warmup_s, work / "w13", adapters, {"B": 3.0}),
        }
        bands = [RealFlow("low", SHEDDABLE, 2 * capacity, "adapter-a"), RealFlow("high", CRITICAL, 0.2 * capacity,
                                                                                "adapter-b")]
        data["bands"] = {
            "alone": run_real(bands[1:], "vtc", duration_s, warmup_s, work / "high", adapters)["high"],
            "runs": {mode: run_real(bands, mode, duration_s, warmup_s, work / f"b-{mode}", adapters, reserved=reserved)
                     for mode in modes},
        }
    return render("real", data, capacity, f"{REAL_WORKERS} reference trtllm-serve workers"), data


# -- report ---------------------------------------------------------------------------------------------------
def _ratio(value: float | None, base: float | None) -> str:
    if value is None or base is None or base <= 0:
        return "-"
    return f"{value / base:.2f}x"


def _share(runs: Mapping[str, Outcome], tenant: str) -> float | None:
    total = sum(o.tokens_per_s for o in runs.values())
    return runs[tenant].tokens_per_s / total if total > 0 and tenant in runs else None


def render(where: str, data: Mapping[str, Any], capacity: float, fleet: str) -> str:
    def label(mode: str) -> str:
        return ADMISSION_LABELS[mode].format(reserved=data.get("reserved", RESERVED))

    options = ["--sim-only" if where == "sim" else "--real-only", *(["--quick"] if data.get("quick") else [])]
    if list(data["flood"]["runs"]) != list(ADMISSION_LABELS):
        options.append(f"--admissions {','.join(data['flood']['runs'])}")
    if data.get("reserved", RESERVED) != RESERVED:
        options.append(f"--reserved {data['reserved']}")
    command = f"python -m bench.tenants {' '.join(options)} --write"
    lines = [report.provenance(command), "",
             f"{fleet}; capacity about {capacity:.0f} requests/s of mean-sized requests; measured over arrivals from "
             f"{data['warmup_s']:.0f} s to {data['duration_s']:.0f} s. Goals: B's p99 TTFT within 1.25x of B alone; "
             "A gets what B leaves; served-token shares within 10 % of the weights while both are backlogged; the high "
             "band's p99 TTFT within 1.25x of an idle fleet."
             + ("" if where == "sim" else " Router wait: the router's `queue_wait_seconds` histogram over the requests "
                "that started after the warm-up (interpolated in a bucket: 10, 25, 50, 100, 250 ms ...)."), ""]
    flood, alone = data["flood"]["runs"], data["flood"]["alone"]
    rows = []
    for mode, runs in flood.items():
        a, b = runs["A"], runs["B"]
        rows.append({"admission": label(mode), "b_p50": _ms(b.ttft_p50_s), "b_p99": _ms(b.ttft_p99_s),
                     "b_vs_alone": _ratio(b.ttft_p99_s, alone.ttft_p99_s), "b_wait": _ms(b.router_wait_p99_s),
                     "b_refused": f"{b.refused}/{b.requests}", "a_tps": f"{a.tokens_per_s:.0f}",
                     "b_tps": f"{b.tokens_per_s:.0f}", "a_refused": f"{a.refused}/{a.requests}"})
    rows.append({"admission": "B alone", "b_p50": _ms(alone.ttft_p50_s), "b_p99": _ms(alone.ttft_p99_s),
                 "b_vs_alone": "1.00x", "b_wait": _ms(alone.router_wait_p99_s),
                 "b_refused": f"{alone.refused}/{alone.requests}", "a_tps": "-",
                 "b_tps": f"{alone.tokens_per_s:.0f}", "a_refused": "-"})
    lines += ["**Flood**: A at 5x its fair share, B steady at 0.6x of its share (equal weights).", "",
              report.table(rows, [("admission", "admission"), ("b_p50", "B TTFT p50"), ("b_p99", "B TTFT p99"),
                                  ("b_vs_alone", "B p99 / B alone"), ("b_wait", "B router wait p99"),
                                  ("b_refused", "B refused"),
                                  ("b_tps", "B tokens/s"), ("a_tps", "A tokens/s"), ("a_refused", "A refused")]), ""]
    weights = data["weights"]
    rows = []
    for name, runs, want in [*((label(m), r, 0.5) for m, r in weights["runs"].items()),
                             ("trtfleet (VTC), weights A 1 : B 3", weights["vtc_1_3"], 0.75)]:
        got = _share(runs, "B")
        rows.append({"admission": name, "want": f"{want:.0%}", "got": "-" if got is None else f"{got:.1%}",
                     "within": "-" if got is None else ("yes" if abs(got - want) <= 0.1 * want else "no"),
                     "total": f"{sum(o.tokens_per_s for o in runs.values()):.0f}"})
    lines += ["**Weights**: A at 5x, B at 2x its fair share, both backlogged: B's share of the served tokens.", "",
              report.table(rows, [("admission", "admission"), ("want", "B's weight share"), ("got", "B's share"),
                                  ("within", "within 10 %"), ("total", "tokens/s, both")]), ""]
    bands, high_alone = data["bands"]["runs"], data["bands"]["alone"]
    rows = []
    for mode, runs in bands.items():
        high, low = runs["high"], runs["low"]
        rows.append({"admission": label(mode), "p50": _ms(high.ttft_p50_s), "p99": _ms(high.ttft_p99_s),
                     "vs": _ratio(high.ttft_p99_s, high_alone.ttft_p99_s), "wait": _ms(high.router_wait_p99_s),
                     "refused": f"{high.refused}/{high.requests}", "low_tps": f"{low.tokens_per_s:.0f}"})
    rows.append({"admission": "high band alone", "p50": _ms(high_alone.ttft_p50_s), "p99": _ms(high_alone.ttft_p99_s),
                 "vs": "1.00x", "wait": _ms(high_alone.router_wait_p99_s),
                 "refused": f"{high_alone.refused}/{high_alone.requests}", "low_tps": "-"})
    lines += ["**Bands**: a sheddable tenant at 2x the fleet's capacity, a critical one at 0.2x.", "",
              report.table(rows, [("admission", "admission"), ("p50", "high TTFT p50"), ("p99", "high TTFT p99"),
                                  ("vs", "p99 / alone"), ("wait", "high router wait p99"),
                                  ("refused", "high refused"),
                                  ("low_tps", "low tokens/s")])]
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--quick", action="store_true", help="shorter runs")
    parser.add_argument("--sim-only", action="store_true")
    parser.add_argument("--real-only", action="store_true")
    parser.add_argument("--write", action="store_true", help="write docs/benchmarks/tenants.md")
    parser.add_argument("--admissions", default=",".join(ADMISSION_LABELS),
                        help=f"comma-separated, of {', '.join(ADMISSION_LABELS)} (default: all)")
    parser.add_argument("--reserved", type=int, default=RESERVED,
                        help="vtc-reserve: tenancy.saturation.reservedPerPod (default %(default)s)")
    args = parser.parse_args(argv)
    modes = [mode for mode in args.admissions.split(",") if mode]
    unknown = [mode for mode in modes if mode not in ADMISSION_LABELS]
    if unknown or not modes:
        parser.error(f"--admissions: {', '.join(unknown) or 'none given'}; choose from {', '.join(ADMISSION_LABELS)}")
    if not args.real_only:
        text, data = sim_section(args.quick, modes, args.reserved)
        print(text)
        report.save_json("tenants-sim", data)
        if args.write:
            report.write_section("tenants-sim", text)
    if not args.sim_only:
        text, data = real_section(args.quick, modes, args.reserved)
        print(text)
        report.save_json("tenants-real", data)
        if args.write:
            report.write_section("tenants-real", text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
