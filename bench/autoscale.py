"""``python -m bench.autoscale``: pod-seconds and TTFT-SLO attainment of autoscalers in the simulator.

The H100 Llama-3-8B fleet of :mod:`bench.profiles` (64 pods at most), 5,000 adapters Zipf 1.0, three
traces of :mod:`bench.scaletraces` (diurnal, bursty, adapter shift) whose peak needs 64 pods: a pod
serves ``POD_LOAD`` of its compute capacity within the SLO (at 75 % of capacity the simulated TTFT p99
is 1.4 s, at 90 % 4.1 s), so the peak rate is ``64 * POD_LOAD * capacity``. Every policy of
:mod:`bench.scalers` runs over the same trace with :class:`bench.simscale.ScalingSimulation`.

SLO: TTFT <= 2 s (``TTFT_SLO_S``), a request that failed counts as missed. Two seconds is an interactive
chat budget a few times the p99 of a well-sized pod (0.3 s at 60 % load), and far below a cold start
(37 s), so requests held through a scale-up or queued on an overloaded pod miss it.

``--trace-file PATH`` replays a public trace instead (:mod:`bench.tracefiles`: the Azure LLM CSV or the
Mooncake JSONL, its load, time and lengths scaled by the factors given) on the same fleet, policies and SLO.
There a pod's rate and the policies' ``targetRequestsPerPod`` come from the trace's own request mix
(:func:`calibrated_target`), and every policy is also read against the offline bound
(:mod:`bench.scalebound`), which the ``foresight`` row replays in the simulator.
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import os
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

import numpy as np

from bench import report
from bench.mooncake import reusable_blocks
from bench.profiles import h100_llama3_8b_fleet, pod_capacity_requests_per_s, with_pods
from bench.scalebound import ScaleBound, busiest_pods, offline_bound, trace_work
from bench.scalers import (
    Autoscaler,
    ForesightScaler,
    HoldWatchRule,
    KubeAiScaler,
    QueueScaler,
    StaticScaler,
    TrtfleetScaler,
)
from bench.scaletraces import ScaleTraceSpec, generate_scale_trace, mean_rate, rate_at
from bench.simscale import ColdStart, ScaleRun, ScalingSimulation, initial_pods_for
from bench.simulate import FleetSpec, simulate
from bench.tracefiles import FORMATS, ReplayScale, format_of, read_trace_file, replay_trace
from bench.traces import TraceRequest
from trtfleet.api.autoscaling import AutoscalingSpec

TTFT_SLO_S: Final = 2.0
POD_LOAD: Final = 0.7
TARGET_REQUESTS_PER_POD: Final = 32.0  # in flight per pod at POD_LOAD (Little: 8.5 req/s x ~3.8 s)
QUEUE_TARGETS: Final = (1.0, 4.0)  # waiting requests per pod (HPA-style)
SCALE_DOWN_WINDOW_S: Final = 300
BOUND_WINDOW_S: Final = 60.0
FINE_WINDOW_S: Final = 10.0  # the bound again at a window of a few SLOs, for its replay beside the goal's
GOAL_OF_BOUND: Final = 1.10  # the real-trace goal: within 10 % of the bound's pod-seconds
GOAL_ATTAINMENT: Final = 0.99


@dataclass(frozen=True, slots=True)
class Setup:
    peak_pods: int
    duration_s: float
    seed: int

    def fleet(self) -> FleetSpec:
        return h100_llama3_8b_fleet(self.peak_pods)

    def pod_rate_per_s(self, trace: ScaleTraceSpec) -> float:
        prompt = trace.prompt.median * math.exp(trace.prompt.sigma**2 / 2)
        output = trace.output.median * math.exp(trace.output.sigma**2 / 2)
        return POD_LOAD * pod_capacity_requests_per_s(self.fleet(), prompt, output)


def traces(setup: Setup, pod_rate_per_s: float) -> list[ScaleTraceSpec]:
    peak = setup.peak_pods * pod_rate_per_s
    return [
        ScaleTraceSpec("diurnal", "diurnal", peak, setup.duration_s, seed=setup.seed),
        ScaleTraceSpec("bursty", "bursty", peak, setup.duration_s, seed=setup.seed + 1),
        ScaleTraceSpec("adapter-shift", "shift", peak, setup.duration_s, seed=setup.seed + 2),
    ]


def trtfleet_spec(max_pods: int, working_set: bool, target: float = TARGET_REQUESTS_PER_POD) -> AutoscalingSpec:
    return AutoscalingSpec(
        min_replicas=0, max_replicas=max_pods, target_requests_per_pod=target,
        adapter_working_set=working_set, scale_down_stabilization_seconds=SCALE_DOWN_WINDOW_S,
        scale_to_zero_after_seconds=SCALE_DOWN_WINDOW_S,
    )


def trtfleet_fleet(target: float = TARGET_REQUESTS_PER_POD) -> dict[str, Any]:
    """What trtfleet's router and operator add to its scaler in the simulation: a new pod prewarmed with the
    hottest adapters, scale-down of the pod whose warm adapters carry the least demand, and held requests
    released at most ``targetRequestsPerPod`` in flight per ready pod while arrivals go to the pods at once."""
    return {"warm_start": True, "least_valuable": True, "release_per_pod": max(1, int(target))}


@dataclass(frozen=True, slots=True)
class Sizing:
    """What the policies of one trace are sized from."""

    start_pods: float
    """Pods the demand at the start needs (unrounded): a fleet autoscaled before the run has that many."""
    average_pods: int
    """Static average sizing."""
    target_requests_per_pod: float = TARGET_REQUESTS_PER_POD
    """trtfleet's ``targetRequestsPerPod`` and KubeAI's ``targetRequests``."""


def drawn_sizing(trace: ScaleTraceSpec, pod_rate_per_s: float) -> Sizing:
    return Sizing(rate_at(trace, 0.0) / pod_rate_per_s, max(1, math.ceil(mean_rate(trace) / pod_rate_per_s)))


def policies(setup: Setup, sizing: Sizing) -> list[tuple[str, Autoscaler, int]]:
    """(label, scaler, pods at the start) for every compared policy."""
    pages_per_pod = setup.fleet().pod.device_pages
    target = sizing.target_requests_per_pod
    average = sizing.average_pods
    rows: list[tuple[str, Autoscaler, int]] = [
        ("static peak", StaticScaler(setup.peak_pods), setup.peak_pods),
        ("static average", StaticScaler(average), average),
    ]
    for waiting in QUEUE_TARGETS:
        rows.append((f"queue-only (waiting/pod {waiting:g})",
                     QueueScaler(waiting, setup.peak_pods, scale_down_window_s=SCALE_DOWN_WINDOW_S),
                     initial_pods_for(sizing.start_pods, 1.0, 1)))
    rows.append(("kubeai (in-flight avg 10 min)", KubeAiScaler(target, setup.peak_pods),
                 initial_pods_for(sizing.start_pods, 1.0, 0)))
    for label, working_set, watch in (("trtfleet (requests, KV)", False, True),
                                      ("trtfleet (+ adapter working set)", True, True),
                                      ("trtfleet (timer only)", False, False)):
        rule = HoldWatchRule(target) if watch else None
        scaler = TrtfleetScaler(trtfleet_spec(setup.peak_pods, working_set, target), pages_per_pod, hold_watch=rule)
        rows.append((label, scaler, initial_pods_for(sizing.start_pods, 1.0, 0)))
    return rows


POLICY_KEYS: Final = {
    "static-peak": "static peak", "static-average": "static average", "queue-only": "queue-only",
    "kubeai": "kubeai", "trtfleet": "trtfleet (requests, KV)", "trtfleet-ws": "trtfleet (+ adapter working set)",
    "trtfleet-timer": "trtfleet (timer only)", "foresight": "foresight (the bound replayed)",
    **{f"queue-only-{target:g}": f"queue-only (waiting/pod {target:g})" for target in QUEUE_TARGETS},
}
"""``--policies`` names and the label prefix each selects (``queue-only-1``, ``queue-only-4``: one target of
queue-only alone, so the two can run as separate processes)."""


def summarise(label: str, run: ScaleRun, static_peak_pod_s: float) -> dict[str, Any]:
    records = run.result.records
    ttfts = sorted(r.ttft_s if r.ttft_s is not None and r.error is None else math.inf for r in records)
    count = len(ttfts)
    met = sum(1 for t in ttfts if t <= TTFT_SLO_S)
    p99 = ttfts[min(count - 1, int(0.99 * count))] if count else 0.0
    return {
        "policy": label,
        "pod_seconds": round(run.pod_seconds),
        "vs_static_peak": f"{run.pod_seconds / static_peak_pod_s - 1:+.0%}",
        "slo_attainment": f"{met / count:.2%}" if count else "-",
        "attainment": met / count if count else 1.0,
        "ttft_p99_s": f"{p99:.2f}" if math.isfinite(p99) else "failed",
        "held": run.held_requests,
        "failed": sum(1 for r in records if r.error is not None),
        "failed_kinds": dict(Counter(r.error for r in records if r.error is not None)),
        "scale_events": run.scale_events,
        "peak_pods": run.peak_pods,
        "requests": count,
    }


COLUMNS = [("policy", "policy"), ("pod_seconds", "pod-seconds"), ("vs_static_peak", "vs static peak"),
           ("slo_attainment", "TTFT <= 2 s"), ("ttft_p99_s", "TTFT p99 s"), ("held", "held"),
           ("failed", "failed"), ("scale_events", "scale events"), ("peak_pods", "peak pods")]


def queue_attainment_at(rows: Sequence[dict[str, Any]], pod_seconds: float) -> float | None:
    """The queue-only autoscaler's attainment at ``pod_seconds``, linear between its runs (None outside)."""
    points: list[tuple[float, float]] = sorted(
        (float(r["pod_seconds"]), float(r["attainment"])) for r in rows if r["policy"].startswith("queue-only")
    )
    for (x0, y0), (x1, y1) in zip(points, points[1:], strict=False):
        if x0 <= pod_seconds <= x1:
            return y0 if x1 == x0 else y0 + (y1 - y0) * (pod_seconds - x0) / (x1 - x0)
    return None


def goal_check(rows: Sequence[dict[str, Any]], static_peak_pod_s: float) -> list[str]:
    lines = []
    for row in rows:
        if not row["policy"].startswith("trtfleet"):
            continue
        saving = 1 - row["pod_seconds"] / static_peak_pod_s
        savings_ok = saving >= 0.30 and row["attainment"] >= 0.99
        queue = queue_attainment_at(rows, row["pod_seconds"])
        queues = [r for r in rows if r["policy"].startswith("queue-only")]
        if not queues:
            versus = "no queue-only run to compare"
        elif queue is None and all(r["pod_seconds"] >= row["pod_seconds"] and r["attainment"] < row["attainment"]
                                   for r in queues):
            versus = "better: every queue-only run used more pod-seconds and attained less"
        elif queue is None:
            versus = "queue-only's runs do not bracket its pod-seconds (no equal-cost comparison)"
        else:
            versus = (f"queue-only at equal pod-seconds {queue:.2%}: "
                      f"{'better' if row['attainment'] > queue else 'not better'} ({row['attainment'] - queue:+.2%})")
        lines.append(
            f"{row['policy']}: {saving:.0%} fewer pod-seconds than static peak at {row['attainment']:.2%} "
            f"attainment: {'met' if savings_ok else 'missed'}; {versus}"
        )
    return lines


def run_policies(
    setup: Setup, requests: Sequence[TraceRequest], duration_s: float, sizing: Sizing, only: Sequence[str] = ()
) -> list[dict[str, Any]]:
    """One row per compared policy (``only``: those ``POLICY_KEYS`` alone) over ``requests``."""
    rows: list[dict[str, Any]] = []
    static_peak_pod_s = setup.peak_pods * duration_s
    for label, scaler, initial in policies(setup, sizing):
        if only and not any(label.startswith(POLICY_KEYS[key]) for key in only):
            continue
        started = time.perf_counter()
        fleet_options = trtfleet_fleet(sizing.target_requests_per_pod) if isinstance(scaler, TrtfleetScaler) else {}
        sim = ScalingSimulation(requests, setup.fleet(), scaler, initial_pods=initial, duration_s=duration_s,
                                seed=setup.seed, **fleet_options)
        row = summarise(label, sim.run_scaled(), static_peak_pod_s)
        row["wall_s"] = round(time.perf_counter() - started)
        rows.append(row)
        print(f"  {label}: {row['pod_seconds']} pod-s, {row['slo_attainment']} in SLO ({row['wall_s']} s wall)",
              flush=True)
    return rows


def run_trace(
    setup: Setup, trace: ScaleTraceSpec, pod_rate_per_s: float, only: Sequence[str] = ()
) -> tuple[list[dict[str, Any]], list[str]]:
    requests = generate_scale_trace(trace)
    print(f"{trace.name}: {len(requests):,} requests over {trace.duration_s:.0f} s, peak "
          f"{trace.peak_rate_per_s:.0f} req/s", flush=True)
    sizing = drawn_sizing(trace, pod_rate_per_s)
    rows = run_policies(setup, requests, trace.duration_s, sizing, only)
    rows, bound = with_bound(setup, requests, trace.duration_s, sizing, BOUND_WINDOW_S, rows, only)
    return rows, goal_check(rows, setup.peak_pods * trace.duration_s) + bound_goal_check(rows, bound.pod_seconds)


def autoscale_section(setup: Setup, only: str | None = None, chosen: Sequence[str] = ()) -> str:
    """The markdown body of the Autoscaling section's simulated part (``only``: that trace alone;
    ``chosen``: those ``POLICY_KEYS`` alone)."""
    pod_rate = setup.pod_rate_per_s(traces(setup, 1.0)[0])
    parts = []
    for trace in traces(setup, pod_rate):
        if only is not None and trace.name != only:
            continue
        rows, goals = run_trace(setup, trace, pod_rate, chosen)
        report.save_json(f"autoscale-{trace.name}", {"rows": rows})
        parts.append(f"**{trace.name}** (peak {trace.peak_rate_per_s:.0f} req/s, mean {mean_rate(trace):.0f} req/s)"
                     f"\n\n{report.table(rows, BOUND_COLUMNS)}\n\n" + "\n".join(f"- {line}" for line in goals))
    header = (
        f"{setup.peak_pods} pods at most, {setup.duration_s:.0f} s per trace, seed {setup.seed}; a pod serves "
        f"{pod_rate:.1f} req/s within the SLO; cold start {ColdStart().seconds:.0f} s; TTFT SLO {TTFT_SLO_S:g} s."
    )
    return header + "\n\n" + "\n\n".join(parts)


@dataclass(frozen=True, slots=True)
class Replay:
    """A trace file to replay and how it is scaled (:mod:`bench.tracefiles`)."""

    path: Path
    trace_format: str
    scale: ReplayScale
    window_s: float = BOUND_WINDOW_S


def calibrated_target(
    requests: Sequence[TraceRequest], fleet: FleetSpec, pod_rate_per_s: float, seed: int, pods: int = 4,
    span_s: float = 600.0,
) -> float:
    """``targetRequestsPerPod`` for a trace's request mix: the requests in flight per pod of a static fleet of
    ``pods`` at ``pod_rate_per_s`` each (Little's law: that rate times the mean end-to-end latency, the first
    tenth of the run left out as warm-up). The requests are taken evenly from the trace and re-timed as a
    seeded Poisson stream: what a team reads off its own pods at the load it sizes them for."""
    rate = pods * pod_rate_per_s
    count = max(10, round(rate * span_s))
    times = np.cumsum(np.random.default_rng(seed).exponential(1.0 / rate, size=count))
    stride = len(requests) / count
    sample = [dataclasses.replace(requests[int(i * stride) % len(requests)], t_s=float(times[i]),
                                  request_id=f"c{i:07d}") for i in range(count)]
    records = simulate(sample, "trtfleet", with_pods(fleet, pods), seed=seed).records[count // 10:]
    latencies = [r.e2e_s for r in records if r.error is None and r.e2e_s is not None]
    return pod_rate_per_s * sum(latencies) / len(latencies)


BOUND_COLUMNS = [*COLUMNS[:3], ("vs_bound", "vs bound"), *COLUMNS[3:], ("wall_s", "wall s")]


def bound_goal_check(rows: Sequence[dict[str, Any]], bound_pod_s: float) -> list[str]:
    """The real-trace goal for each trtfleet row: within 10 % of the bound's pod-seconds at >= 99 % attainment."""
    lines = []
    for row in rows:
        if not row["policy"].startswith("trtfleet"):
            continue
        ratio = row["pod_seconds"] / bound_pod_s
        met = ratio <= GOAL_OF_BOUND and row["attainment"] >= GOAL_ATTAINMENT
        lines.append(f"{row['policy']}: {ratio - 1:+.0%} pod-seconds against the bound at {row['attainment']:.2%} "
                     f"attainment: {'met' if met else 'missed'} (goal: at most +10 % at >= 99 %)")
    return lines


def bound_row(bound: ScaleBound, static_peak_pod_s: float) -> dict[str, Any]:
    """The bound as a table row (no latency: it is not run)."""
    changes = sum(1 for a, b in zip(bound.pods, bound.pods[1:], strict=False) if a != b)
    return {
        "policy": f"offline bound ({bound.window_s:g} s windows)", "pod_seconds": round(bound.pod_seconds),
        "vs_static_peak": f"{bound.pod_seconds / static_peak_pod_s - 1:+.0%}", "slo_attainment": "-",
        "ttft_p99_s": "-", "held": "-", "failed": "-", "scale_events": changes, "peak_pods": max(bound.pods),
        "wall_s": "-",
    }


def replay_bound(
    setup: Setup, requests: Sequence[TraceRequest], bound: ScaleBound, sizing: Sizing, static_peak_pod_s: float
) -> dict[str, Any]:
    """The bound's pods run in the simulator: no cold start, each window's pods there when it starts, with what
    trtfleet's router adds (warm start, paced release): what the bound's fleet attains."""
    started = time.perf_counter()
    sim = ScalingSimulation(requests, setup.fleet(), ForesightScaler(bound),
                            initial_pods=max(bound.pods_at(0.0), bound.pods_at(1.0)), duration_s=bound.duration_s,
                            cold_start=ColdStart(0, 1.0, 0.0), seed=setup.seed,
                            **trtfleet_fleet(sizing.target_requests_per_pod))
    row = summarise(f"{POLICY_KEYS['foresight']}, {bound.window_s:g} s windows", sim.run_scaled(), static_peak_pod_s)
    row["wall_s"] = round(time.perf_counter() - started)
    print(f"  {row['policy']}: {row['pod_seconds']} pod-s, {row['slo_attainment']} in SLO", flush=True)
    return row


def with_bound(
    setup: Setup, requests: Sequence[TraceRequest], duration_s: float, sizing: Sizing, window_s: float,
    rows: list[dict[str, Any]], only: Sequence[str] = (),
) -> tuple[list[dict[str, Any]], ScaleBound]:
    """``rows`` after the offline bound at ``window_s`` and at ``FINE_WINDOW_S`` (each with its replay, unless
    ``only`` leaves out ``foresight``), every row read against the first; and that bound."""
    fleet = setup.fleet()
    work = trace_work(requests, fleet.model, fleet.pod.max_batch_size)
    bounds = [offline_bound(work, duration_s, each, POD_LOAD, setup.peak_pods) for each in (window_s, FINE_WINDOW_S)]
    static_peak_pod_s = setup.peak_pods * duration_s
    ideal: list[dict[str, Any]] = []
    for bound in bounds:
        ideal.append(bound_row(bound, static_peak_pod_s))
        if not only or "foresight" in only:
            ideal.append(replay_bound(setup, requests, bound, sizing, static_peak_pod_s))
    rows = ideal + rows
    for row in rows:
        row["vs_bound"] = f"{row['pod_seconds'] / bounds[0].pod_seconds - 1:+.0%}" if bounds[0].pod_seconds else "-"
    return rows, bounds[0]


def replay_rows(
    setup: Setup, replay: Replay, only: Sequence[str] = ()
) -> tuple[str, list[dict[str, Any]], list[str]]:
    """(what the scaled trace is, one row per policy plus the bound and its replay, the goal lines)."""
    rows_in = read_trace_file(replay.path, replay.trace_format)
    requests, cut = replay_trace(rows_in, replay.scale)
    if not requests:
        raise ValueError(f"{replay.path}: no request to replay")
    duration_s = math.floor(requests[-1].t_s) + 1.0
    fleet = setup.fleet()
    work = trace_work(requests, fleet.model, fleet.pod.max_batch_size)
    bound = offline_bound(work, duration_s, replay.window_s, POD_LOAD, setup.peak_pods)
    mean_work_s = sum(w for _t, w in work) / len(work)
    pod_rate = POD_LOAD / mean_work_s
    target = calibrated_target(requests, fleet, pod_rate, setup.seed)
    sizing = Sizing(start_pods=float(bound.pods_at(0.0)),
                    average_pods=max(1, math.ceil(mean_work_s * len(work) / duration_s / POD_LOAD)),
                    target_requests_per_pod=round(target, 1))
    busiest = {span: busiest_pods(work, span, POD_LOAD) for span in (10.0, 60.0)}
    prompts = sum(r.prompt_tokens for r in requests)
    if replay.scale.prefix_blocks:
        reusable = sum(reused * replay.scale.tokens_per_block for reused in reusable_blocks(requests))
        blocks = (f"{reusable / prompts:.0%} of prompt tokens are a prefix an earlier request had, charged in full "
                  "by the bound")
    else:
        blocks = "no prefix reuse: every prompt token is computed"
    scale = replay.scale
    description = (
        f"`{replay.path.name}` ({replay.trace_format}): {len(rows_in):,} requests in the file; load factor "
        f"{scale.load_factor:g}, time factor {scale.time_factor:g}, length factor {scale.length_factor:g} "
        f"({cut:,} prompts cut to {scale.max_input_tokens:,} tokens), {scale.num_adapters:,} adapters Zipf "
        f"{scale.zipf_alpha:g} by conversation, seed {setup.seed}: {len(requests):,} requests over {duration_s:,.0f} s "
        f"(mean {len(requests) / duration_s:.0f} req/s; prompts mean {prompts / len(requests):,.0f} tokens, outputs "
        f"{sum(r.max_tokens for r in requests) / len(requests):,.0f}; {blocks}). A pod serves {pod_rate:.1f} req/s of "
        f"this mix within the SLO ({POD_LOAD:.0%} of its compute); targetRequestsPerPod "
        f"{sizing.target_requests_per_pod:g} (trtfleet, KubeAI), calibrated on 4 static pods at that load. At "
        f"that load the mean needs {mean_work_s * len(work) / duration_s / POD_LOAD:.1f} pods, the busiest 60 s "
        f"{busiest[60.0]:.1f}, the busiest 10 s {busiest[10.0]:.1f}. Offline bound ({replay.window_s:g} s "
        f"windows): {bound.pod_seconds:,.0f} pod-seconds, {bound.capped_windows} window(s) above "
        f"{setup.peak_pods} pods."
    )
    print(description, flush=True)
    rows = run_policies(setup, requests, duration_s, sizing, only)
    rows, bound = with_bound(setup, requests, duration_s, sizing, replay.window_s, rows, only)
    report.save_json(f"autoscale-{replay.trace_format}", {"description": description, "rows": rows,
                                                          "bound_pods": list(bound.pods)})
    return description, rows, bound_goal_check(rows, bound.pod_seconds)


def replay_report(setup: Setup, replay: Replay, chosen: Sequence[str] = (), write: bool = False) -> str:
    """The markdown body of one real trace's block of the page: provenance, what was replayed, the table."""
    scale = replay.scale
    command = (f"python -m bench.autoscale --trace-file {replay.path} --load-factor {scale.load_factor:g} "
               f"--time-factor {scale.time_factor:g} --length-factor {scale.length_factor:g} "
               f"--peak-pods {setup.peak_pods} --seed {setup.seed}")
    command += f" --policies {','.join(chosen)}" if chosen else ""
    command += " --write" if write else ""
    provenance = report.provenance(command)
    load_start = os.getloadavg()
    started = time.perf_counter()
    description, rows, goals = replay_rows(setup, replay, chosen)
    load_end = os.getloadavg()
    return (f"{provenance} Load average (1 min) {load_start[0]:.1f} at the start, {load_end[0]:.1f} at the end; "
            f"{time.perf_counter() - started:.0f} s wall.\n\n{description}\n\n{report.table(rows, BOUND_COLUMNS)}"
            "\n\n" + "\n".join(f"- {line}" for line in goals))


def default_setup(quick: bool) -> Setup:
    """The documented run (64 pods, 900 s per trace); ``quick``: 16 pods."""
    return Setup(16 if quick else 64, 900.0, 7)


def autoscale_report(setup: Setup, only: str | None = None, chosen: Sequence[str] = (), write: bool = True) -> str:
    command = f"python -m bench.autoscale --peak-pods {setup.peak_pods} --duration-s {setup.duration_s:g}"
    command += f" --trace {only}" if only else ""
    command += f" --policies {','.join(chosen)}" if chosen else ""
    command += " --write" if write else ""
    provenance = report.provenance(command)  # the commit the run starts from
    load_start = os.getloadavg()
    started = time.perf_counter()
    body = autoscale_section(setup, only, chosen)
    load_end = os.getloadavg()
    return (provenance + f" Load average (1 min) {load_start[0]:.1f} at the start, "
            f"{load_end[0]:.1f} at the end; {time.perf_counter() - started:.0f} s wall.\n\n" + body)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.autoscale", description=__doc__.split("\n")[0])
    parser.add_argument("--peak-pods", type=int, default=64)
    parser.add_argument("--duration-s", type=float, help="drawn traces' length (default 900)")
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--trace", choices=("diurnal", "bursty", "adapter-shift"), help="run one drawn trace only")
    parser.add_argument("--trace-file", type=Path, help="replay this trace file instead of the drawn traces")
    parser.add_argument("--trace-format", choices=FORMATS, help="the trace file's format (default: from its name)")
    parser.add_argument("--load-factor", type=float, default=1.0, help="trace file: each request this many times")
    parser.add_argument("--time-factor", type=float, default=1.0, help="trace file: arrival times times this")
    parser.add_argument("--length-factor", type=float, default=1.0, help="trace file: token counts times this")
    parser.add_argument("--bound-window-s", type=float, default=BOUND_WINDOW_S, help="the offline bound's window")
    parser.add_argument("--policies", default="", help=f"comma-separated subset of {', '.join(POLICY_KEYS)}")
    parser.add_argument("--write", action="store_true", help="write docs/benchmarks/autoscaling.md")
    args = parser.parse_args(argv)
    chosen = [key for key in args.policies.split(",") if key]
    unknown = [key for key in chosen if key not in POLICY_KEYS]
    if unknown:
        parser.error(f"unknown policies {', '.join(unknown)}: choose from {', '.join(POLICY_KEYS)}")
    if args.write and chosen:
        parser.error("--write needs every policy (leave out --policies)")
    if args.trace_file is not None:
        if args.trace or args.duration_s is not None:
            parser.error("--trace-file replays that file: leave out --trace and --duration-s")
        if min(args.load_factor, args.time_factor, args.length_factor, args.bound_window_s) <= 0:
            parser.error("--load-factor, --time-factor, --length-factor and --bound-window-s must be positive")
        try:
            trace_format = args.trace_format or format_of(args.trace_file)
        except ValueError as exc:
            parser.error(str(exc))
        scale = ReplayScale(load_factor=args.load_factor, time_factor=args.time_factor,
                            length_factor=args.length_factor, seed=args.seed)
        replay = Replay(args.trace_file, trace_format, scale, args.bound_window_s)
        body = replay_report(Setup(args.peak_pods, 0.0, args.seed), replay, chosen, args.write)
        print(body)
        if args.write:
            report.write_section(f"autoscale-{trace_format}", body)
        return 0
    if args.write and args.trace:
        parser.error("--write needs every trace (leave out --trace)")
    duration_s = 900.0 if args.duration_s is None else args.duration_s
    body = autoscale_report(Setup(args.peak_pods, duration_s, args.seed), args.trace, chosen, args.write)
    print(body)
    if args.write:
        report.write_section("autoscale", body)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
