""""Adapters are free": a fleet of thousands of adapters against a fleet of one, in the simulator.

    .venv/bin/python -m bench.adapters [--quick] [--only steady,diurnal,shift] [--adapters 5000,20000] [--write]

64 simulated H100 pods (Llama-3-8B, ``bench.profiles``), Zipf 1.0 over 5,000 (and 20,000) rank-8 adapters,
1,000 requests/s. Every run has the same timeline: ``head_s`` seconds with no traffic (a fleet that has been up:
only the placement uses them, to prefetch; 30 s, 120 s for 20,000 adapters), then traffic; the first ``warm_s``
seconds of traffic warm every policy's caches and are left out; the figures cover the ``measure_s`` seconds
after. One run more per scenario starts the placement cold (no head start) to show how long it takes to catch
up.

Rows: the same fleet with one adapter (the reference the issue measures against); today's default
(``ttft-cost``, no placement); ``chwbl`` (KubeAI); ``dynamo-hrw`` (Dynamo's LoRA placement controller);
``ttft-cost`` with the placement on; ``tiered-cost`` with the placement on (trtfleet's answer). Every row gets the
same host tier per pod, sized from the plan (``routing.placement.host_pages_needed`` over the expected demand),
and today's example (4 GiB) is shown for the default as well.

Traces: ``steady`` (Poisson); ``diurnal`` (``bench.scaletraces``: one compressed day, 10 % to 100 % of 1,000
requests/s and back); ``shift`` (``bench.scaletraces``: 1,000 requests/s, popularity ranks redrawn half-way).
Bytes moved per request: the weights requests carried plus the placement's prefetches, over the clients'
requests, in the measured window.
"""

from __future__ import annotations

import argparse
import dataclasses
from collections.abc import Sequence
from typing import Any

from trtfleet_router.routing.placement import AdapterWant, PlacementConfig, host_pages_needed

from bench import report
from bench.profiles import GIB, h100_llama3_8b_fleet
from bench.scaletraces import ScaleTraceSpec, generate_scale_trace
from bench.simstats import summarize
from bench.simulate import FleetSpec, sim_routing_config, simulate
from bench.traces import TraceRequest, TraceSpec, generate, zipf_weights

DEFAULT_ADAPTERS = "5000,20000"
COMMAND = ".venv/bin/python -m bench.adapters{options} --write"
PODS = 64
RATE_PER_S = 1000.0
SHAPES = ("steady", "diurnal", "shift")
HEAD_S_PER_ADAPTER = 0.006


@dataclasses.dataclass(frozen=True)
class Timeline:
    head_s: float
    warm_s: float
    measure_s: float

    @property
    def traffic_s(self) -> float:
        return self.warm_s + self.measure_s


@dataclasses.dataclass(frozen=True)
class Variant:
    label: str
    policy: str
    placement: bool = False
    one_adapter: bool = False
    host_bytes: int | None = None  # None: sized from the plan
    head_start: bool = True


VARIANTS = (
    Variant("one adapter (ttft-cost)", "ttft-cost", one_adapter=True),
    Variant("ttft-cost (today)", "ttft-cost"),
    Variant("chwbl", "chwbl"),
    Variant("dynamo-hrw", "dynamo-hrw"),
    Variant("ttft-cost + placement", "ttft-cost", placement=True),
    Variant("tiered-cost + placement", "tiered-cost", placement=True),
    Variant("tiered-cost + placement, cold start", "tiered-cost", placement=True, head_start=False),
)
TODAY_4GIB = Variant("ttft-cost (today, 4 GiB host tier)", "ttft-cost", host_bytes=4 * GIB)


def trace_for(shape: str, adapters: int, timeline: Timeline, seed: int = 11) -> list[TraceRequest]:
    """The shape's trace over the traffic window, shifted by the head start."""
    lengths = TraceSpec(name="lengths")
    if shape == "steady":
        trace = generate(TraceSpec(name="steady", num_adapters=adapters, zipf_alpha=1.0, rate_per_s=RATE_PER_S,
                                   num_requests=int(RATE_PER_S * timeline.traffic_s), seed=seed))
    else:
        spec = ScaleTraceSpec(name=shape, shape=shape, peak_rate_per_s=RATE_PER_S, duration_s=timeline.traffic_s,
                              num_adapters=adapters, zipf_alpha=1.0, shift_rate_fraction=1.0,
                              prompt=lengths.prompt, output=lengths.output, seed=seed)
        trace = generate_scale_trace(spec)
    return [dataclasses.replace(r, t_s=r.t_s + timeline.head_s) for r in trace]


def names(adapters: int) -> list[str]:
    return TraceSpec(name="names", num_adapters=adapters).adapter_names()


def planned_host_pages(base: FleetSpec, adapters: int, config: PlacementConfig) -> int:
    """Host pages per pod the plan needs for ``adapters`` Zipf 1.0 adapters at 1,000 requests/s."""
    weights = zipf_weights(adapters, 1.0)
    wants = [AdapterWant(name, index + 1, base.adapter_pages, RATE_PER_S * float(weights[index]))
             for index, name in enumerate(names(adapters))]
    return host_pages_needed(wants, PODS, config)


def head_start_s(adapters: int, timeline: Timeline) -> float:
    """The idle head start: ``timeline.head_s``, longer for more adapters (6 ms of it per adapter: two copies of
    each over 64 pods at one prefetch per pod at a time, each an artifact fetch of 134 ms and a transfer of 34 ms
    in the simulator's model)."""
    return max(timeline.head_s, HEAD_S_PER_ADAPTER * adapters)


def run_variant(variant: Variant, shape: str, adapters: int, timeline: Timeline, host_pages: int) -> dict[str, Any]:
    base = h100_llama3_8b_fleet(PODS)
    timeline = dataclasses.replace(timeline, head_s=head_start_s(adapters, timeline))
    pages = host_pages if variant.host_bytes is None else variant.host_bytes // base.pod.page_bytes
    spec = dataclasses.replace(base, pod=dataclasses.replace(base.pod, host_pages=pages))
    run = timeline if variant.head_start else dataclasses.replace(timeline, head_s=0.0)
    count = 1 if variant.one_adapter else adapters
    trace = trace_for(shape, count, run)
    data: dict[str, Any] = {"policy": variant.policy}
    if variant.placement:
        data["placement"] = {"enabled": True}
    result = simulate(trace, variant.policy, spec, config=sim_routing_config(data, spec), registered=names(count))
    since_s = run.head_s + run.warm_s
    row: dict[str, Any] = dict(summarize(result, since_s=since_s))
    warmup = summarize(result)
    requests = max(1, int(row["requests"]))
    moved = int(row["weights_bytes"]) + int(row["background_bytes"])
    row.update(
        variant=variant.label, shape=shape, adapters=adapters,
        host_gib=pages * base.pod.page_bytes / GIB,
        ttft_p50_ms=float(row["ttft_p50_s"]) * 1e3, ttft_p99_ms=float(row["ttft_p99_s"]) * 1e3,
        all_ttft_p99_ms=float(warmup["ttft_p99_s"]) * 1e3,
        moved_mb_per_request=moved / requests / 1e6,
        background_gb=int(row["background_bytes"]) / 1e9,
        device_copies=result.fleet_counters.get("device_copies", 0),
    )
    print(f"  {shape} {adapters} {variant.label:<38} hit {row['hit_rate']:.4f} TTFT p50 {row['ttft_p50_ms']:.1f} "
          f"p99 {row['ttft_p99_ms']:.1f} ms (whole run {row['all_ttft_p99_ms']:.0f}) moved "
          f"{row['moved_mb_per_request']:.2f} MB/req ({row['wall_s']:.0f} s)", flush=True)
    return row


COLUMNS = (
    ("variant", "fleet / policy"), ("host_gib", "host tier GiB/pod"), ("hit_rate", "warm"),
    ("ttft_p50_ms", "TTFT p50 ms"), ("ttft_p99_ms", "TTFT p99 ms"), ("vs_one", "p99 / one adapter"),
    ("moved_mb_per_request", "MB moved / request"), ("background_gb", "prefetched GB"),
    ("all_ttft_p99_ms", "p99 incl. warm-up ms"), ("errors", "errors"),
)


def scenario(shape: str, adapters: int, timeline: Timeline, quick: bool) -> tuple[str, list[dict[str, Any]]]:
    config = PlacementConfig()
    base = h100_llama3_8b_fleet(PODS)
    pages = planned_host_pages(base, adapters, config)
    print(f"{shape}: {adapters:,} adapters, host tier {pages} pages = {pages * base.pod.page_bytes / GIB:.1f} GiB/pod",
          flush=True)
    variants = list(VARIANTS)
    if shape == "steady" and adapters == 5000:
        variants.insert(2, TODAY_4GIB)
    rows = [run_variant(variant, shape, adapters, timeline, pages) for variant in variants]
    one = next(row for row in rows if row["variant"].startswith("one adapter"))
    for row in rows:
        row["vs_one"] = row["ttft_p99_ms"] / one["ttft_p99_ms"]
    text = (
        f"**{shape}, {adapters:,} adapters**: host tier {pages} pages = "
        f"{pages * base.pod.page_bytes / GIB:.1f} GiB per pod (the plan's {config.min_host_copies} copies of every "
        f"adapter, one per {config.copy_rate_per_s:g} req/s of demand, {config.host_fill:.0%} full).\n\n"
        + report.table(rows, COLUMNS)
    )
    return text, rows


def _options(args: argparse.Namespace) -> str:
    """The run's options as typed, those left at their defaults omitted."""
    options = " --quick" if args.quick else ""
    if args.only != ",".join(SHAPES):
        options += f" --only {args.only}"
    if args.adapters != DEFAULT_ADAPTERS:
        options += f" --adapters {args.adapters}"
    return options


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.adapters", description=__doc__)
    parser.add_argument("--quick", action="store_true", help="shorter windows (10 s warm-up, 20 s measured)")
    parser.add_argument("--only", default=",".join(SHAPES), help="trace shapes to run")
    parser.add_argument("--adapters", default=DEFAULT_ADAPTERS, help="adapter counts")
    parser.add_argument("--write", action="store_true", help="write docs/benchmarks/adapters.md")
    args = parser.parse_args(argv)
    timeline = Timeline(30.0, 10.0, 20.0) if args.quick else Timeline(30.0, 20.0, 60.0)
    texts: list[str] = []
    everything: list[dict[str, Any]] = []
    for adapters in (int(a) for a in args.adapters.split(",")):
        for shape in args.only.split(","):
            text, rows = scenario(shape, adapters, timeline, args.quick)
            texts.append(text)
            everything += rows
    report.save_json("adapters", everything)
    body = "\n\n".join([
        report.provenance(COMMAND.format(options=_options(args))),
        f"64 simulated H100 pods, {RATE_PER_S:,.0f} requests/s, Zipf 1.0; {timeline.head_s:.0f} s without traffic "
        f"({HEAD_S_PER_ADAPTER * 1e3:.0f} ms per adapter when that is longer), "
        f"{timeline.warm_s:.0f} s of traffic left out, {timeline.measure_s:.0f} s measured.",
        *texts,
    ])
    print(body)
    if args.write:
        report.write_section("adapters-sim", body)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
