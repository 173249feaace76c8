"""The Mooncake trace on real reference workers behind the router, every policy: prefix reuse as the engines
count it, adapter hits, TTFT.

    .venv/bin/python -m bench.prefix_realfleet --trace ../shared/data/mooncake_synthetic_trace.jsonl

Scaled to the reference engine (``RealScenario.limits()``: 126 text tokens a prompt): token counts x
``--length-factor`` (1/16: a 512-token Mooncake block becomes 32 bytes of text), prompts cut to the engine's
limit (``bench.traces.check_fits`` then holds), the first ``--requests`` requests, time x ``--time-factor``.
Each Mooncake block id becomes the same 32 bytes of text wherever it appears (BLAKE2b of the id, as
letters), so requests that share block ids share their leading bytes, hence their leading KV blocks under
the same adapter. Adapters per conversation as in :mod:`bench.mooncake`.

Prefix blocks *reused* come from the workers' own counters (Triton ``nv_trt_llm_kv_cache_block_metrics
{kv_cache_block_type="reused"}``, read before and after each policy); *possible* is
:func:`bench.mooncake.reusable_blocks` on the scaled trace. A worker that exports no ``reused`` counter has no
block reuse to measure: the harness says so and stops before replaying anything (then the figures come from
the simulator, ``bench/prefixbench.py``).
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import hashlib
import statistics
import sys
import time
import urllib.request
from collections.abc import Sequence
from pathlib import Path

from bench.mooncake import (
    MOONCAKE_BLOCK_TOKENS,
    MooncakeRow,
    MooncakeScale,
    mooncake_trace,
    read_mooncake,
    reusable_blocks,
)
from bench.realfleet import RealFleet, synthetic_adapters
from bench.routing import WORK, RealScenario, host_cache_bytes_for, parse_counters, replay
from bench.simstats import percentile
from bench.traces import TraceRequest, check_fits

REUSED = 'kv_cache_block_type="reused"'


def block_text(block_id: int, chars: int) -> str:
    """``chars`` letters standing for one Mooncake block id (the same text for the same id, everywhere)."""
    digest = hashlib.blake2b(block_id.to_bytes(8, "little"), digest_size=64).digest()
    return "".join(chr(ord("a") + b % 26) for b in digest)[:chars].ljust(chars, "z")


def prompts_for(rows: Sequence[MooncakeRow], trace: Sequence[TraceRequest], chars_per_block: int) -> list[str]:
    by_id = {f"m{index:06d}": row for index, row in enumerate(rows)}
    return ["".join(block_text(h, chars_per_block) for h in by_id[r.request_id].hash_ids)[: r.prompt_tokens]
            for r in trace]


def reused_total(fleet: RealFleet) -> float | None:
    """Sum of the workers' reused-block counters; None when a worker exports none."""
    total = 0.0
    for worker in fleet._workers:
        with urllib.request.urlopen(f"http://{worker.host}:{worker.metrics_port}/metrics", timeout=10) as answer:
            text = answer.read().decode()
        lines = [line for line in text.splitlines() if REUSED in line and not line.startswith("#")]
        if not lines:
            return None
        total += sum(float(line.rsplit(" ", 1)[1]) for line in lines)
    return total


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.prefix_realfleet", description=__doc__.split("\n")[0])
    parser.add_argument("--trace", type=Path, required=True)
    parser.add_argument("--policies", default="trtfleet,trtfleet-adapter,dynamo-kv,llmd-default,kubeai-prefix-hash,"
                        "chwbl,round-robin")
    parser.add_argument("--requests", type=int, default=240)
    parser.add_argument("--length-factor", type=float, default=1 / 16)
    parser.add_argument("--time-factor", type=float, default=0.5)
    parser.add_argument("--adapters", type=int, default=20)
    args = parser.parse_args(argv)
    scenario = RealScenario()
    limits = scenario.limits()
    rows = read_mooncake(args.trace)[: args.requests]
    scale = dataclasses.replace(MooncakeScale(), length_factor=args.length_factor, time_factor=args.time_factor,
                                max_input_tokens=limits.max_prompt_tokens, max_output_tokens=32,
                                num_adapters=args.adapters)
    trace, cut = mooncake_trace(rows, scale)
    check_fits(trace, limits, name=args.trace.name)
    prompts = prompts_for(rows, trace, round(MOONCAKE_BLOCK_TOKENS * scale.length_factor))
    possible = sum(reusable_blocks(trace))
    print(f"{len(trace)} requests over {trace[-1].t_s:.0f} s, {cut} prompts cut to {limits.max_prompt_tokens}; "
          f"{possible} prefix blocks reusable", flush=True)
    adapter_dirs = synthetic_adapters(args.adapters)
    adapters = [(f"a{i:04d}", i + 1, path) for i, path in enumerate(adapter_dirs)]
    host_bytes, _pages = host_cache_bytes_for(scenario.adapter_pages_per_worker)
    from bench import coldload

    scenario, _load = coldload.priced(scenario)
    for policy in [p.strip() for p in args.policies.split(",") if p.strip()]:
        fleet = RealFleet(policy, scenario.workers, adapters, host_bytes, WORK / f"prefix-{policy}",
                          max_batch_size=scenario.max_batch_size, seed=scenario.seed, min_step_ms=scenario.min_step_ms,
                          policy_config=scenario.policy_config())
        with fleet:
            before = reused_total(fleet)
            if before is None:
                print("the reference workers export no reused-block counter (no KV block reuse on this build): "
                      "nothing to measure on the real fleet; see bench/prefixbench.py for the simulator", flush=True)
                return 0
            began = time.monotonic()
            samples = asyncio.run(replay(fleet.base_url, trace, prompts=prompts))
            duration_s = time.monotonic() - began
            after = reused_total(fleet) or 0.0
            hits = parse_counters(fleet.router_metrics(), "trtfleet_router_adapter_cache_hits")
        ttft = [s.ttft_s for s in samples if s.error is None and s.ttft_s is not None]
        print(f"  {policy:<18} reused {after - before:.0f} / {possible} blocks, adapter hit rate "
              f"{hits / len(trace):.3f}, TTFT p50 {percentile(ttft, 50) * 1e3:.0f} p99 "
              f"{percentile(ttft, 99) * 1e3:.0f} mean {statistics.fmean(ttft) * 1e3 if ttft else float('nan'):.0f} ms, "
              f"errors {sum(s.error is not None for s in samples)} ({duration_s:.0f} s)", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
