"""The Mooncake trace on real reference workers behind the router, every policy: prefix reuse as the engines
count it, adapter hits, TTFT.

    .venv/bin/python -m bench.prefix_realfleet --trace ../shared/data/mooncake_synthetic_trace.jsonl [--repeats 3]

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
the simulator, ``bench/prefixbench.py``). Single runs on a shared 2-core machine rank the policies' tails by
noise (one policy's p99 moved by 100-270 ms between runs): ``--repeats N`` runs every policy N times, round by
round, and ends with each policy's medians.

Longer prompts and a prefill that costs time: the tiny model computes a prompt in a few milliseconds, so a
reused prefix saves almost nothing on this machine unless the workers pretend a GPU's prefill time.
``--max-input-len N`` serves prompts up to N tokens (a copy of the tiny model with more positions: same
weights), and ``--prefill-us-per-token T`` makes every engine step last T us longer per prompt position it
computes (reused KV blocks cost nothing, as on a GPU); trtfleet's router is told the same per-token price
(``prefillSPerToken``). 232 us at lengths x 1/16 is the H100's 14.5 us per token of Llama-3.1-8B FP8 (the
router's default) at the trace's own lengths: a scaled prompt's prefill lasts as long as the real one would.
With a prefill price the header also prints floors for the mean TTFT (:func:`floor_line`). ``--kv-max-tokens``
sizes the workers' paged KV cache (25,000: the simulator's H100 pod x 1/16); the router reads it from their
metrics.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import hashlib
import math
import statistics
import sys
import time
import urllib.request
from collections.abc import Sequence
from pathlib import Path

from trtfleet_engines.reference.batch_types import KV_TOKENS_PER_BLOCK

from bench import coldload
from bench.mooncake import (
    MOONCAKE_BLOCK_TOKENS,
    MooncakeRow,
    MooncakeScale,
    mooncake_trace,
    read_mooncake,
    reusable_blocks,
    ttft_floor_s,
)
from bench.realfleet import RealFleet, parse_counters, synthetic_adapters
from bench.realscenario import WORK, RealScenario, host_cache_bytes_for
from bench.replay import replay
from bench.simstats import percentile
from bench.traces import FleetLimits, TraceRequest, check_fits

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


@dataclasses.dataclass(frozen=True, slots=True)
class Engine:
    """The workers' prompt limit and pretend prefill time (None: the reference defaults), and settings of the
    ``trtfleet`` policy's section to override (``--trtfleet KEY=VALUE``: camelCase keys, as in the routing config)."""

    max_input_len: int | None = None
    prefill_us_per_token: float | None = None
    trtfleet: tuple[tuple[str, float], ...] = ()
    kv_max_tokens: int | None = None  # each worker's paged KV cache in tokens (None: the engine's default)

    def limits(self, scenario: RealScenario) -> FleetLimits:
        if self.max_input_len is None:
            return scenario.limits()
        return FleetLimits(max_input_tokens=self.max_input_len, max_seq_tokens=self.max_input_len + 128,
                           prompt_overhead_tokens=2)

    def kv_blocks(self, scenario: RealScenario) -> int:
        """KV-cache blocks per worker: ``kv_max_tokens``, else what the reference engine sizes by default (max
        batch x max sequence length), in blocks of :data:`KV_TOKENS_PER_BLOCK` (printed; the router reads the
        same size from the workers' metrics)."""
        tokens = self.kv_max_tokens or scenario.max_batch_size * self.limits(scenario).max_seq_tokens
        return tokens // KV_TOKENS_PER_BLOCK


def floor_line(trace: list[TraceRequest], block_tokens: int, scenario: RealScenario, engine: Engine) -> str:
    """Floors for this fleet: the blocks one LRU cache of all workers' KV blocks would reuse (an estimate, see
    :func:`reusable_blocks`), and the mean TTFT with no queueing (one pretend step plus the uncached prefill)
    without reuse, with that reuse, and with every possible block reused (an unbounded cache: a true floor)."""
    step_s, per_token_s = (scenario.min_step_ms or 0.0) / 1e3, (engine.prefill_us_per_token or 0.0) / 1e6
    fleet_blocks = scenario.workers * engine.kv_blocks(scenario)
    bounded = reusable_blocks(trace, fleet_blocks)
    floors = [ttft_floor_s(trace, reused, block_tokens, step_s, per_token_s) * 1e3
              for reused in ([0] * len(trace), bounded, reusable_blocks(trace))]
    return (f"the fleet's {fleet_blocks} KV blocks as one LRU would reuse {sum(bounded)} blocks; mean TTFT with no "
            f"queueing {floors[0]:.0f} ms without reuse, {floors[1]:.0f} ms with that reuse, {floors[2]:.0f} ms "
            "with an unbounded cache")


def setting(text: str) -> tuple[str, float]:
    """``KEY=VALUE`` with a numeric value, for ``--trtfleet``."""
    key, sep, value = text.partition("=")
    try:
        if not sep or not key.strip():
            raise ValueError(text)
        return key.strip(), float(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected KEY=NUMBER, got {text!r}") from None


def run_policy(policy: str, scenario: RealScenario, trace: Sequence[TraceRequest], prompts: Sequence[str],
               adapters: list[tuple[str, int, Path]], host_bytes: int,
               engine: Engine = Engine()) -> dict[str, float] | None:
    """One policy on a fresh fleet: blocks reused, adapter hit rate, TTFT figures; None without reuse counters."""
    policy_config = scenario.policy_config()
    if engine.prefill_us_per_token is not None:  # trtfleet prices prefill at what the workers charge
        policy_config["ttft_cost"]["prefillSPerToken"] = engine.prefill_us_per_token / 1e6
    policy_config["ttft_cost"].update(engine.trtfleet)
    fleet = RealFleet(policy, scenario.workers, adapters, host_bytes, WORK / f"prefix-{policy}",
                      max_batch_size=scenario.max_batch_size, seed=scenario.seed, min_step_ms=scenario.min_step_ms,
                      policy_config=policy_config, max_input_len=engine.max_input_len,
                      prefill_us_per_token=engine.prefill_us_per_token, kv_max_tokens=engine.kv_max_tokens)
    with fleet:
        before = reused_total(fleet)
        if before is None:
            return None
        began = time.monotonic()
        samples = asyncio.run(replay(fleet.base_url, trace, prompts=prompts))
        duration_s = time.monotonic() - began
        after = reused_total(fleet) or 0.0
        hits = parse_counters(fleet.router_metrics(), "trtfleet_router_adapter_cache_hits")
    ttft = [s.ttft_s for s in samples if s.error is None and s.ttft_s is not None]
    return {
        "reused": after - before, "hit_rate": hits / len(trace), "p50_ms": percentile(ttft, 50) * 1e3,
        "p99_ms": percentile(ttft, 99) * 1e3, "mean_ms": statistics.fmean(ttft) * 1e3 if ttft else math.nan,
        "errors": float(sum(s.error is not None for s in samples)), "duration_s": duration_s,
    }


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.prefix_realfleet", description=__doc__.split("\n")[0])
    parser.add_argument("--trace", type=Path, required=True)
    parser.add_argument("--policies", default="ttft-cost,adapter-affinity,dynamo-kv,llmd-default,kubeai-prefix-hash,"
                        "chwbl,round-robin")
    parser.add_argument("--requests", type=int, default=240)
    parser.add_argument("--length-factor", type=float, default=1 / 16)
    parser.add_argument("--time-factor", type=float, default=0.5)
    parser.add_argument("--adapters", type=int, default=20)
    parser.add_argument("--repeats", type=int, default=1,
                        help="rounds over every policy (interleaved, so machine noise hits each alike); with more "
                        "than one, a last table of each policy's medians over the rounds")
    parser.add_argument("--max-input-len", type=int, default=None,
                        help="the workers' maxInputLen (default: the reference spec's 128)")
    parser.add_argument("--prefill-us-per-token", type=float, default=None,
                        help="pretend prefill time per prompt position computed (default: none)")
    parser.add_argument("--kv-max-tokens", type=int, default=None,
                        help="each worker's paged KV cache in tokens (default: max batch x max sequence length); "
                        "25000 is about the simulator's H100 pod (434,257 tokens) at the length factor 1/16")
    parser.add_argument("--trtfleet", action="append", default=[], metavar="KEY=VALUE", type=setting,
                        help="a number in the trtfleet policy's routing section, e.g. inflightDelayS=0.01 (repeatable)")
    args = parser.parse_args(argv)
    scenario = RealScenario()
    engine = Engine(args.max_input_len, args.prefill_us_per_token, tuple(args.trtfleet), args.kv_max_tokens)
    limits = engine.limits(scenario)
    rows = read_mooncake(args.trace)[: args.requests]
    scale = dataclasses.replace(MooncakeScale(), length_factor=args.length_factor, time_factor=args.time_factor,
                                max_input_tokens=limits.max_prompt_tokens, max_output_tokens=32,
                                num_adapters=args.adapters)
    trace, cut = mooncake_trace(rows, scale)
    check_fits(trace, limits, name=args.trace.name)
    prompts = prompts_for(rows, trace, round(MOONCAKE_BLOCK_TOKENS * scale.length_factor))
    possible = sum(reusable_blocks(trace))
    print(f"{len(trace)} requests over {trace[-1].t_s:.0f} s, {cut} prompts cut to {limits.max_prompt_tokens}; "
          f"{possible} prefix blocks reusable; {engine.kv_blocks(scenario)} KV blocks a worker", flush=True)
    if engine.prefill_us_per_token is not None:
        print(floor_line(trace, scale.tokens_per_block, scenario, engine), flush=True)
    adapter_dirs = synthetic_adapters(args.adapters)
    adapters = [(f"a{i:04d}", i + 1, path) for i, path in enumerate(adapter_dirs)]
    host_bytes, _pages = host_cache_bytes_for(scenario.adapter_pages_per_worker)
    scenario, _load = coldload.priced(scenario)
    policies = [p.strip() for p in args.policies.split(",") if p.strip()]
    runs: dict[str, list[dict[str, float]]] = {policy: [] for policy in policies}
    for round_index in range(max(1, args.repeats)):
        if args.repeats > 1:
            print(f"round {round_index + 1} of {args.repeats}", flush=True)
        for policy in policies:
            row = run_policy(policy, scenario, trace, prompts, adapters, host_bytes, engine)
            if row is None:
                print("the reference workers export no reused-block counter (no KV block reuse on this build): "
                      "nothing to measure on the real fleet; see bench/prefixbench.py for the simulator", flush=True)
                return 0
            runs[policy].append(row)
            print(f"  {policy:<18} reused {row['reused']:.0f} / {possible} blocks, adapter hit rate "
                  f"{row['hit_rate']:.3f}, TTFT p50 {row['p50_ms']:.0f} p99 {row['p99_ms']:.0f} mean "
                  f"{row['mean_ms']:.0f} ms, errors {row['errors']:.0f} ({row['duration_s']:.0f} s)", flush=True)
    if args.repeats > 1:
        print(f"medians over {args.repeats} rounds:")
        print("| policy | prefix blocks reused / possible | adapter hit rate | TTFT p50 ms | TTFT p99 ms | mean ms | "
              "p99 ms per round | errors |")
        print("|---|---|---|---|---|---|---|---|")
        for policy, results in runs.items():
            med = {key: statistics.median(r[key] for r in results) for key in results[0]}
            per_round = " / ".join(f"{r['p99_ms']:.0f}" for r in results)
            print(f"| {policy} | {med['reused']:.0f} / {possible} | {med['hit_rate']:.3f} | {med['p50_ms']:.0f} | "
                  f"{med['p99_ms']:.0f} | {med['mean_ms']:.0f} | {per_round} | "
                  f"{sum(r['errors'] for r in results):.0f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
