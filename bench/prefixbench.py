"""The "Prefix and adapter" section: a Mooncake trace replayed in the simulator, every policy on it.

    .venv/bin/python -m bench.prefixbench --trace ../shared/data/mooncake_synthetic_trace.jsonl

64 simulated H100 pods (``bench.profiles.h100_llama3_8b_fleet``) with KV-cache block reuse keyed by adapter
(``bench/podkv.py``: prefill is charged for uncached tokens only). The trace is scaled and given adapters by
``bench/mooncake.py`` (rules and factors in its docstring and in the section). Printed per policy: prefix
blocks reused / possible (possible: leading blocks an earlier request of the trace had, what one unbounded
cache would reuse), adapter hit rate, adapter cold loads, TTFT p50 / p99 / mean.
"""

from __future__ import annotations

import argparse
import dataclasses
import statistics
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from trtfleet_router.routing import policy_names

from bench import report
from bench.mooncake import MooncakeScale, mooncake_trace, read_mooncake, reusable_blocks
from bench.profiles import h100_llama3_8b_fleet
from bench.simstats import percentile
from bench.simulate import simulate
from bench.traces import TraceRequest

DEFAULTS = MooncakeScale()
COLUMNS = (
    ("policy", "policy"),
    ("reused_share", "prefix reused / possible"),
    ("reused_blocks", "blocks reused"),
    ("hit_rate", "adapter hit rate"),
    ("cold_loads", "adapter cold loads"),
    ("ttft_p50_ms", "TTFT p50 ms"),
    ("ttft_p99_ms", "TTFT p99 ms"),
    ("ttft_mean_ms", "TTFT mean ms"),
    ("errors", "errors"),
)


def run(trace: Sequence[TraceRequest], pods: int, policies: Sequence[str], seed: int) -> list[dict[str, Any]]:
    spec = h100_llama3_8b_fleet(pods)
    possible = sum(reusable_blocks(list(trace)))
    rows = []
    for policy in policies:
        result = simulate(trace, policy, spec, seed=seed)
        records = result.records
        ttft = [r.ttft_s for r in records if r.error is None and r.ttft_s is not None]
        reused = sum(r.reused_blocks for r in records)
        row = {
            "policy": policy,
            "reused_blocks": reused,
            "possible_blocks": possible,
            "reused_share": reused / possible if possible else float("nan"),
            "hit_rate": sum(r.hit for r in records) / len(records),
            "cold_loads": sum(r.loads for r in records),
            "ttft_p50_ms": percentile(ttft, 50) * 1e3,
            "ttft_p99_ms": percentile(ttft, 99) * 1e3,
            "ttft_mean_ms": statistics.fmean(ttft) * 1e3 if ttft else float("nan"),
            "errors": sum(r.error is not None for r in records),
            "wall_s": result.wall_s,
        }
        print(f"  {policy:<18} reused {row['reused_share']:.3f} hit {row['hit_rate']:.3f} loads {row['cold_loads']} "
              f"TTFT p50 {row['ttft_p50_ms']:.1f} p99 {row['ttft_p99_ms']:.1f} mean {row['ttft_mean_ms']:.1f} ms "
              f"({row['wall_s']:.1f} s)", flush=True)
        rows.append(row)
    return rows


HOT_CASES = (("one adapter", 1, 1.0), ("Zipf 2.0 over 50", 50, 2.0), ("Zipf 1.0 over 5,000", 5000, 1.0))
HOT_POLICIES = ("ttft-cost", "adapter-affinity", "round-robin", "chwbl")


def hot_adapter_rows(duration_s: int = 60) -> list[dict[str, Any]]:
    """The issue's weakness: 64 H100 pods, 1,000 req/s for ``duration_s``, seed 11, no prefixes."""
    from bench.traces import TraceSpec, generate

    spec = h100_llama3_8b_fleet(64)
    rows = []
    for label, adapters, alpha in HOT_CASES:
        trace = generate(TraceSpec(name="hot", num_adapters=adapters, zipf_alpha=alpha, rate_per_s=1000.0,
                                   num_requests=1000 * duration_s, seed=11))
        for policy in HOT_POLICIES:
            records = simulate(trace, policy, spec).records
            ttft = [r.ttft_s for r in records if r.error is None and r.ttft_s is not None]
            row = {"case": label, "policy": policy, "ttft_p50_ms": percentile(ttft, 50) * 1e3,
                   "ttft_p99_ms": percentile(ttft, 99) * 1e3, "cold_loads": sum(r.loads for r in records),
                   "errors": sum(r.error is not None for r in records)}
            print(f"  {label:<20} {policy:<18} p99 {row['ttft_p99_ms']:.1f} ms loads {row['cold_loads']}", flush=True)
            rows.append(row)
    return rows


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.prefixbench", description=__doc__.split("\n")[0])
    parser.add_argument("--trace", type=Path, required=True, help="Mooncake-format JSONL")
    parser.add_argument("--pods", type=int, default=64)
    parser.add_argument("--policies", default=",".join(policy_names()))
    parser.add_argument("--adapters", type=int, default=DEFAULTS.num_adapters)
    parser.add_argument("--zipf", type=float, default=DEFAULTS.zipf_alpha)
    parser.add_argument("--length-factor", type=float, default=DEFAULTS.length_factor)
    parser.add_argument("--time-factor", type=float, default=DEFAULTS.time_factor)
    parser.add_argument("--seed", type=int, default=DEFAULTS.seed)
    parser.add_argument("--write", action="store_true", help="write the section of docs/benchmarks/prefix.md")
    parser.add_argument("--hot", action="store_true", help="also the hot-adapter cases (1,000 req/s, 60 s)")
    args = parser.parse_args(argv)
    scale = dataclasses.replace(MooncakeScale(), num_adapters=args.adapters, zipf_alpha=args.zipf,
                                length_factor=args.length_factor, time_factor=args.time_factor, seed=args.seed)
    rows_in = read_mooncake(args.trace)
    trace, cut = mooncake_trace(rows_in, scale)
    duration_s = trace[-1].t_s if trace else 0.0
    print(f"{args.trace.name}: {len(trace):,} requests over {duration_s:.1f} s, {cut} prompts cut to "
          f"{scale.max_input_tokens} tokens; {args.pods} pods", flush=True)
    rows = run(trace, args.pods, [p.strip() for p in args.policies.split(",") if p.strip()], args.seed)
    hot = hot_adapter_rows() if args.hot else []
    if args.write:
        command = "python -m bench.prefixbench " + " ".join(argv if argv is not None else sys.argv[1:])
        mean_prompt = statistics.fmean(r.prompt_tokens for r in trace)
        in_use = len({r.adapter for r in trace})
        text = "\n\n".join([
            report.provenance(command),
            f"Trace `{args.trace.name}` (Mooncake format; {len(trace):,} requests, {in_use} "
            f"adapters in use) scaled by `bench/mooncake.py`: token counts x {scale.length_factor} (a 512-token "
            f"block becomes {round(512 * scale.length_factor)} tokens = {scale.router_blocks_per_id} KV blocks of "
            f"{scale.tokens_per_block}), prompts cut at {scale.max_input_tokens} tokens ({cut} cut), time x "
            f"{scale.time_factor} ({duration_s:.1f} s, {len(trace) / max(duration_s, 1e-9):.0f} req/s), mean prompt "
            f"{mean_prompt:.0f} tokens. Adapters per conversation (same first block id), Zipf {scale.zipf_alpha} "
            f"over {scale.num_adapters}, seed {scale.seed}. {args.pods} simulated H100 pods, Llama-3-8B profile, "
            "KV reuse keyed by adapter (`bench/podkv.py`), prefill charged for uncached tokens only.",
            report.table(rows, COLUMNS),
        ] + ([
            "**Hot adapters** (no prefixes; the weakness issue 21 names): 64 simulated H100 pods, Poisson 1,000 "
            "req/s for 60 s, seed 11, `bench/traces.py` lengths.",
            report.table(hot, [("case", "case"), ("policy", "policy"), ("ttft_p50_ms", "TTFT p50 ms"),
                               ("ttft_p99_ms", "TTFT p99 ms"), ("cold_loads", "adapter cold loads"),
                               ("errors", "errors")]),
        ] if hot else []))
        report.write_section("prefix", text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
