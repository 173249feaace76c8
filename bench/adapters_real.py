""""Adapters are free" on real processes: the reference fleet at its scale, paying an H100 pod's cold-load cost.

    .venv/bin/python -m bench.adapters_real [--quick] [--write]

Three real ``tritonserver`` workers run the CPU reference engine (tiny Llama, max batch 8, every step at least
20 ms) behind ``trtfleet router``; synthetic rank-8 adapters (``bench.realfleet``), Zipf 1.0, Poisson arrivals
replayed open-loop through the router's OpenAI endpoint (``bench.replay``). The workers pay what an H100 pod pays
for an adapter (``--network-bytes-per-s``, ``--pcie-bytes-per-s`` of the reference engine): a tiny adapter's
weights cross the pretend pod network in the time a rank-8 Llama-3-8B adapter (40 MiB) takes over 10 GbE
(33.6 ms), and its cache pages cross the pretend PCIe in the time that adapter's page (90 MiB) takes at an
H100's 50 GB/s (1.9 ms).

Rows, each on a fresh fleet (cold engines, a new router): the same fleet with one adapter; ``ttft-cost``;
``chwbl``; ``dynamo-hrw``; ``tiered-cost`` with the placement on. Every row gets the host tier the plan needs
(``routing.placement.host_pages_needed``). Timeline: the fleet is up for ``head_s`` seconds before the trace
starts (only the placement uses them); requests arriving in the first ``warm_s`` seconds of the trace are left
out of the latency figures. Bytes moved: every weight byte the router sent (prefetches included) per request.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from trtfleet_router.routing.placement import AdapterWant, PlacementConfig, host_pages_needed

from bench import report
from bench.adapters import Variant
from bench.realfleet import RealFleet, synthetic_adapters
from bench.realscenario import WORK, RealScenario, host_cache_bytes_for
from bench.replay import Sample, replay
from bench.routing import router_counters
from bench.simstats import percentile
from bench.traces import TraceRequest, check_fits, generate, zipf_weights

COMMAND = ".venv/bin/python -m bench.adapters_real{quick} --write"
H100_ADAPTER_TRANSFER_S = 40 * 2**20 / 1.25e9
"""A rank-8 Llama-3-8B adapter (7 modules, 32 layers, fp16: 40 MiB) over a 10 GbE pod network."""
H100_PAGE_COPY_S = 90 * 2**20 / 50e9
"""That adapter's cache page (90 MiB: ``bench.profiles``' geometry) over an H100's PCIe Gen5 x16 at 50 GB/s."""


VARIANTS = (
    Variant("one adapter (ttft-cost)", "ttft-cost", one_adapter=True),
    Variant("ttft-cost (today)", "ttft-cost"),
    Variant("chwbl", "chwbl"),
    Variant("dynamo-hrw", "dynamo-hrw"),
    Variant("tiered-cost + placement", "tiered-cost", placement=True),
)


def h100_costs(adapter_dir: Path, page_bytes: int) -> tuple[float, float]:
    """(network, PCIe) bytes per second that make the tiny adapter's transfer and copy last an H100 pod's."""
    weights = (adapter_dir / "model.lora_weights.npy").stat().st_size
    return weights / H100_ADAPTER_TRANSFER_S, page_bytes / H100_PAGE_COPY_S


def run_variant(variant: Variant, scenario: RealScenario, trace: Sequence[TraceRequest],
                adapters: list[tuple[str, int, Path]], host_bytes: int, costs: tuple[float, float],
                head_s: float, warm_s: float) -> dict[str, Any]:
    policy_config: dict[str, Any] = dict(scenario.policy_config())
    policy_config["tiered_cost"] = {"loadBoundInflight": scenario.load_bound_inflight}
    if variant.placement:
        policy_config["placement"] = {"enabled": True, "intervalS": 2.0}
    fleet = RealFleet(variant.policy, scenario.workers, adapters, host_bytes, WORK / "adapters" / variant.policy,
                      max_batch_size=scenario.max_batch_size, seed=scenario.seed, min_step_ms=scenario.min_step_ms,
                      policy_config=policy_config, network_bytes_per_s=costs[0], pcie_bytes_per_s=costs[1])
    with fleet:
        time.sleep(head_s)  # the fleet has been up: only the placement does anything meanwhile
        began = time.monotonic()
        samples = asyncio.run(replay(fleet.base_url, trace))
        duration = time.monotonic() - began
        counters = router_counters(fleet.router_metrics(), fleet.fleets_debug())
    measured = [s for s in samples if trace[s.key].t_s >= warm_s]
    return summarize(variant, measured, samples, counters, duration)


def summarize(variant: Variant, measured: Sequence[Sample], every: Sequence[Sample], counters: dict[str, float],
              duration_s: float) -> dict[str, Any]:
    """Latency over ``measured``; hits (requests sent id-only and served: prefetches carry weights, so they are
    never hits) and bytes over the whole run."""
    served = [s for s in measured if s.error is None and s.ttft_s is not None]
    ttft = [s.ttft_s for s in served if s.ttft_s is not None]
    requests = len(every)
    return {
        "variant": variant.label, "requests": len(measured),
        "hit_rate": counters["hits"] / max(1, requests),
        "ttft_p50_ms": percentile(ttft, 50) * 1e3, "ttft_p99_ms": percentile(ttft, 99) * 1e3,
        "moved_kb_per_request": counters["weight_bytes"] / max(1, requests) / 1e3,
        "errors": sum(s.error is not None for s in measured), "duration_s": duration_s,
    }


COLUMNS = (
    ("variant", "fleet / policy"), ("hit_rate", "hit rate"), ("ttft_p50_ms", "TTFT p50 ms"),
    ("ttft_p99_ms", "TTFT p99 ms"), ("vs_one", "p99 / one adapter"), ("moved_kb_per_request", "KB sent / request"),
    ("errors", "errors"),
)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.adapters_real", description=__doc__)
    parser.add_argument("--quick", action="store_true", help="100 adapters, 40 s of traffic")
    parser.add_argument("--write", action="store_true", help="write docs/benchmarks/adapters.md")
    args = parser.parse_args(argv)
    count = 100 if args.quick else 400
    scenario = RealScenario(adapters=count, duration_s=40.0 if args.quick else 120.0, rate_per_s=12.0)
    head_s, warm_s = 15.0, 10.0
    _one_page, adapter_pages = host_cache_bytes_for(1)
    weights = zipf_weights(count, scenario.zipf_alpha)
    names = scenario.trace_spec().adapter_names()
    wants = [AdapterWant(name, i + 1, adapter_pages, scenario.rate_per_s * float(weights[i]))
             for i, name in enumerate(names)]
    pages = host_pages_needed(wants, scenario.workers, PlacementConfig())
    host_bytes, _ = host_cache_bytes_for(pages)
    paths = synthetic_adapters(count, seed=scenario.seed)
    adapters = [(name, index + 1, path) for index, (name, path) in enumerate(zip(names, paths, strict=True))]
    costs = h100_costs(paths[0], host_cache_bytes_for(1)[0])
    trace = generate(scenario.trace_spec())
    check_fits(trace, scenario.limits(), name="adapters-real")
    one = [dataclasses.replace(r, adapter=names[0]) for r in trace]
    rows = []
    for variant in VARIANTS:
        print(f"  real: {variant.label} ({len(trace)} requests over {trace[-1].t_s:.0f} s)", flush=True)
        row = run_variant(variant, scenario, one if variant.one_adapter else trace, adapters, host_bytes, costs,
                          head_s, warm_s)
        print(f"    TTFT p50 {row['ttft_p50_ms']:.0f} ms, p99 {row['ttft_p99_ms']:.0f} ms, hit rate "
              f"{row['hit_rate']:.3f}, errors {row['errors']}", flush=True)
        rows.append(row)
    for row in rows:
        row["vs_one"] = row["ttft_p99_ms"] / rows[0]["ttft_p99_ms"]
    report.save_json("adapters-real", {"scenario": dataclasses.asdict(scenario), "host_pages": pages, "rows": rows})
    body = "\n\n".join([
        report.provenance(COMMAND.format(quick=" --quick" if args.quick else "")),
        f"{scenario.workers} reference workers (max batch {scenario.max_batch_size}, {scenario.min_step_ms:.0f} ms "
        f"minimum step), {count} synthetic rank-8 adapters, Zipf {scenario.zipf_alpha}, Poisson "
        f"{scenario.rate_per_s:g} req/s for {scenario.duration_s:.0f} s ({len(trace)} requests); the fleet idle "
        f"{head_s:.0f} s before, the first {warm_s:.0f} s of traffic left out. Host tier {pages} pages per worker "
        f"(the plan's size). Each worker pays an H100 pod's cold-load cost: {costs[0] / 1e6:.2f} MB/s of pretend "
        f"network (a 40 MiB adapter's {H100_ADAPTER_TRANSFER_S * 1e3:.1f} ms over 10 GbE) and {costs[1] / 1e9:.2f} "
        f"GB/s of pretend PCIe (a 90 MiB page's {H100_PAGE_COPY_S * 1e3:.1f} ms at 50 GB/s). Two shared cores ran "
        "three workers, the router and the client: the figures are noisy; compare rows within the run.",
        report.table(rows, COLUMNS),
    ])
    print(body)
    if args.write:
        report.write_section("adapters-real", body)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
