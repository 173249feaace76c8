"""``python -m bench.autoscale``: pod-seconds and TTFT-SLO attainment of autoscalers in the simulator.

The H100 Llama-3-8B fleet of :mod:`bench.profiles` (64 pods at most), 5,000 adapters Zipf 1.0, three
traces of :mod:`bench.scaletraces` (diurnal, bursty, adapter shift) whose peak needs 64 pods: a pod
serves ``POD_LOAD`` of its compute capacity within the SLO (at 75 % of capacity the simulated TTFT p99
is 1.4 s, at 90 % 4.1 s), so the peak rate is ``64 * POD_LOAD * capacity``. Every policy of
:mod:`bench.scalers` runs over the same trace with :class:`bench.simscale.ScalingSimulation`.

SLO: TTFT <= 2 s (``TTFT_SLO_S``), a request that failed counts as missed. Two seconds is an interactive
chat budget a few times the p99 of a well-sized pod (0.3 s at 60 % load), and far below a cold start
(37 s), so requests held through a scale-up or queued on an overloaded pod miss it.
"""

from __future__ import annotations

import argparse
import math
import os
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Final

from bench import report
from bench.profiles import h100_llama3_8b_fleet, pod_capacity_requests_per_s
from bench.scalers import Autoscaler, HoldWatchRule, KubeAiScaler, QueueScaler, StaticScaler, TrtfleetScaler
from bench.scaletraces import ScaleTraceSpec, generate_scale_trace, mean_rate, rate_at
from bench.simscale import ColdStart, ScaleRun, ScalingSimulation, initial_pods_for
from bench.simulate import FleetSpec
from trtfleet.api.autoscaling import AutoscalingSpec

TTFT_SLO_S: Final = 2.0
POD_LOAD: Final = 0.7
TARGET_REQUESTS_PER_POD: Final = 32.0  # in flight per pod at POD_LOAD (Little: 8.5 req/s x ~3.8 s)
QUEUE_TARGETS: Final = (1.0, 4.0)  # waiting requests per pod (HPA-style)
SCALE_DOWN_WINDOW_S: Final = 300


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


def trtfleet_spec(max_pods: int, working_set: bool) -> AutoscalingSpec:
    return AutoscalingSpec(
        min_replicas=0, max_replicas=max_pods, target_requests_per_pod=TARGET_REQUESTS_PER_POD,
        adapter_working_set=working_set, scale_down_stabilization_seconds=SCALE_DOWN_WINDOW_S,
        scale_to_zero_after_seconds=SCALE_DOWN_WINDOW_S,
    )


TRTFLEET_FLEET: Final[dict[str, Any]] = {
    "warm_start": True, "least_valuable": True, "release_per_pod": int(TARGET_REQUESTS_PER_POD),
}
"""What trtfleet's router and operator add to its scaler in the simulation: a new pod prewarmed with the
hottest adapters, scale-down of the pod whose warm adapters carry the least demand, and held requests
released at most ``targetRequestsPerPod`` in flight per ready pod while arrivals go to the pods at once
(on bursty at 8 pods: 75 % attainment and nothing failed, against 53 % and 1,713 failed with the whole
backlog released onto new pods, and 0 % with arrivals queued behind the backlog)."""


def policies(setup: Setup, trace: ScaleTraceSpec, pod_rate_per_s: float) -> list[tuple[str, Autoscaler, int]]:
    """(label, scaler, pods at the start) for every compared policy."""
    pages_per_pod = setup.fleet().pod.device_pages
    average = max(1, math.ceil(mean_rate(trace) / pod_rate_per_s))
    start = rate_at(trace, 0.0)
    rows: list[tuple[str, Autoscaler, int]] = [
        ("static peak", StaticScaler(setup.peak_pods), setup.peak_pods),
        ("static average", StaticScaler(average), average),
    ]
    for target in QUEUE_TARGETS:
        rows.append((f"queue-only (waiting/pod {target:g})",
                     QueueScaler(target, setup.peak_pods, scale_down_window_s=SCALE_DOWN_WINDOW_S),
                     initial_pods_for(start, pod_rate_per_s, 1)))
    rows.append(("kubeai (in-flight avg 10 min)", KubeAiScaler(TARGET_REQUESTS_PER_POD, setup.peak_pods),
                 initial_pods_for(start, pod_rate_per_s, 0)))
    for label, working_set, watch in (("trtfleet (requests, KV)", False, True),
                                      ("trtfleet (+ adapter working set)", True, True),
                                      ("trtfleet (timer only)", False, False)):
        rule = HoldWatchRule(TARGET_REQUESTS_PER_POD) if watch else None
        scaler = TrtfleetScaler(trtfleet_spec(setup.peak_pods, working_set), pages_per_pod, hold_watch=rule)
        rows.append((label, scaler, initial_pods_for(start, pod_rate_per_s, 0)))
    return rows


POLICY_KEYS: Final = {
    "static-peak": "static peak", "static-average": "static average", "queue-only": "queue-only",
    "kubeai": "kubeai", "trtfleet": "trtfleet (requests, KV)", "trtfleet-ws": "trtfleet (+ adapter working set)",
    "trtfleet-timer": "trtfleet (timer only)",
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


def run_trace(
    setup: Setup, trace: ScaleTraceSpec, pod_rate_per_s: float, only: Sequence[str] = ()
) -> tuple[list[dict[str, Any]], list[str]]:
    requests = generate_scale_trace(trace)
    print(f"{trace.name}: {len(requests):,} requests over {trace.duration_s:.0f} s, peak "
          f"{trace.peak_rate_per_s:.0f} req/s", flush=True)
    rows: list[dict[str, Any]] = []
    static_peak_pod_s = setup.peak_pods * trace.duration_s
    for label, scaler, initial in policies(setup, trace, pod_rate_per_s):
        if only and not any(label.startswith(POLICY_KEYS[key]) for key in only):
            continue
        started = time.perf_counter()
        fleet_options = TRTFLEET_FLEET if isinstance(scaler, TrtfleetScaler) else {}
        sim = ScalingSimulation(requests, setup.fleet(), scaler, initial_pods=initial, duration_s=trace.duration_s,
                                seed=setup.seed, **fleet_options)
        row = summarise(label, sim.run_scaled(), static_peak_pod_s)
        rows.append(row)
        print(f"  {label}: {row['pod_seconds']} pod-s, {row['slo_attainment']} in SLO "
              f"({time.perf_counter() - started:.0f} s wall)", flush=True)
    return rows, goal_check(rows, static_peak_pod_s)


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
                     f"\n\n{report.table(rows, COLUMNS)}\n\n" + "\n".join(f"- {line}" for line in goals))
    header = (
        f"{setup.peak_pods} pods at most, {setup.duration_s:.0f} s per trace, seed {setup.seed}; a pod serves "
        f"{pod_rate:.1f} req/s within the SLO; cold start {ColdStart().seconds:.0f} s; TTFT SLO {TTFT_SLO_S:g} s."
    )
    return header + "\n\n" + "\n\n".join(parts)


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
    parser.add_argument("--duration-s", type=float, default=900.0)
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--trace", choices=("diurnal", "bursty", "adapter-shift"), help="run one trace only")
    parser.add_argument("--policies", default="", help=f"comma-separated subset of {', '.join(POLICY_KEYS)}")
    parser.add_argument("--write", action="store_true", help="write docs/benchmarks/autoscaling.md")
    args = parser.parse_args(argv)
    chosen = [key for key in args.policies.split(",") if key]
    unknown = [key for key in chosen if key not in POLICY_KEYS]
    if unknown:
        parser.error(f"unknown policies {', '.join(unknown)}: choose from {', '.join(POLICY_KEYS)}")
    if args.write and (args.trace or chosen):
        parser.error("--write needs every trace and policy (leave out --trace and --policies)")
    body = autoscale_report(Setup(args.peak_pods, args.duration_s, args.seed), args.trace, chosen, args.write)
    print(body)
    if args.write:
        report.write_section("autoscale", body)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
