"""Routing quality on real processes: K reference-engine tritonservers, the router, every policy, one trace.

    .venv/bin/python -m bench --quick --only routing

For each policy a fresh fleet (:class:`bench.realfleet.RealFleet`: cold caches) replays the same trace
open-loop (each request sent at its ``t_s``, whatever the others do) against the router's OpenAI endpoint
(``/v1/completions``, streamed, greedy); the client measures TTFT (first streamed text) and end-to-end
latency; the router's own counters (``trtfleet_router_adapter_cache_hits``, ``..._misses``,
``..._adapter_loads``, ``..._weight_bytes_sent``) give hits, misses, loads and bytes. The bound for the
trace and the workers' pooled capacity is computed by ``bench.optimal`` and every policy is checked
against it. Then the simulator replays the same trace on a model of this fleet (step time measured on
these workers) and the table of simulated vs measured figures states the calibration error.

Hit counting here: a request is a hit when the router sent it id-only and the pod served it (the
router's ``adapter_cache_hits``); a load is a request that carried weights (``adapter_loads``), which
over-counts pod insertions when weights reach a pod that already held the adapter (the pod ignores
them), so the measured effective hit rate is, if anything, low.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import math
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench import optimal, report
from bench.realfleet import RealFleet, parse_counters, synthetic_adapters
from bench.simstats import percentile
from bench.traces import (
    FleetLimits,
    LengthSpec,
    TraceRequest,
    TraceSpec,
    check_fits,
    generate,
    prompt_text,
    write_jsonl,
)

COMMAND = ".venv/bin/python -m bench{quick} --only routing"
WORK = report.RESULTS / "real"
REAL_COLUMNS = (
    ("policy", "policy"),
    ("hit_rate", "hit rate"),
    ("effective_hit_rate", "effective"),
    ("of_bound", "of bound"),
    ("loads", "loads"),
    ("weight_sends", "weight sends"),
    ("misses", "misses"),
    ("cache_full", "cache full"),
    ("weights_kb", "weights KB"),
    ("ttft_p50_ms", "TTFT p50 ms"),
    ("ttft_p99_ms", "TTFT p99 ms"),
    ("e2e_p50_ms", "e2e p50 ms"),
    ("e2e_p99_ms", "e2e p99 ms"),
    ("output_tokens_per_s", "out tok/s"),
    ("errors", "errors"),
)


@dataclass(frozen=True, slots=True)
class RealScenario:
    workers: int = 3
    adapters: int = 50
    adapter_pages_per_worker: int = 4
    zipf_alpha: float = 1.0
    rate_per_s: float = 8.0
    duration_s: float = 30.0
    min_step_ms: float = 20.0
    max_batch_size: int = 8
    # trtfleet's load bound (requests a warm pod may carry beyond the least loaded one) must stay below the
    # engine's max batch: the default 12 suits batches of 64+, here it let a warm pod queue requests behind
    # a full batch of 8 for a whole service time (the p99 TTFT of 2.2 s before 2026-11-22).
    load_bound_inflight: int = 4
    seed: int = 21
    # what a cold load costs these workers beyond its bytes (bench.coldload measures it before a run), priced
    # by both trtfleet policies: ``(("loadOverheadS", s),)`` or ``(("podReadOverheadS", s),)``; () the defaults
    load_price: tuple[tuple[str, float], ...] = ()

    def policy_config(self) -> dict[str, dict[str, Any]]:
        """The router's routing config in the real runs: trtfleet's load bound and the measured load price."""
        price = dict(self.load_price)
        return {"ttft_cost": {"loadBoundInflight": self.load_bound_inflight, **price}, "adapter_affinity": price}

    @staticmethod
    def limits() -> FleetLimits:
        """The reference workers' engine limits; the byte tokenizer adds ``<bos>`` and ``<sep>`` to a prompt."""
        from trtfleet_engines.reference.repository import default_reference_spec

        engine = default_reference_spec().engine
        return FleetLimits(max_input_tokens=engine.max_input_len, max_seq_tokens=engine.max_seq_len,
                           prompt_overhead_tokens=2)

    def trace_spec(self) -> TraceSpec:
        # Prompts are capped at what the engine accepts (126 text tokens for maxInputLen 128): before
        # 2026-11-25 the cap was 200 and 16 of 240 requests were refused with 400, counted against every policy.
        return TraceSpec(
            name="real", num_adapters=self.adapters, zipf_alpha=self.zipf_alpha, rate_per_s=self.rate_per_s,
            num_requests=int(self.rate_per_s * self.duration_s), seed=self.seed, adapter_prefix="s",
            prompt=LengthSpec(median=48, sigma=0.6, min_tokens=8, max_tokens=self.limits().max_prompt_tokens),
            output=LengthSpec(median=24, sigma=0.5, min_tokens=4, max_tokens=64),
        )


@dataclass(slots=True)
class Sample:
    key: int
    status: int = 0
    ttft_s: float | None = None
    e2e_s: float | None = None
    output_tokens: int = 0  # usage.completion_tokens as the router reports it
    chunks: int = 0  # streamed chunks with text (one per engine step that produced text)
    error: str | None = None


async def _one(session: Any, url: str, key: int, request: TraceRequest, timeout_s: float,
               prompt: str | None = None) -> Sample:
    import aiohttp

    sample = Sample(key)
    body = {
        "model": request.adapter, "prompt": prompt if prompt is not None else prompt_text(request.request_id,
                                                                                          request.prompt_tokens),
        "max_tokens": request.max_tokens, "temperature": 0, "stream": True,
        "stream_options": {"include_usage": True},
    }
    began = time.perf_counter()
    try:
        async with session.post(url, json=body, timeout=aiohttp.ClientTimeout(total=timeout_s)) as response:
            sample.status = response.status
            if response.status != 200:
                sample.error = f"http {response.status}"
                await response.read()
                return sample
            async for raw in response.content:
                line = raw.decode().strip()
                if not line.startswith("data:"):
                    continue
                payload = line[5:].strip()
                if payload == "[DONE]":
                    break
                chunk = json.loads(payload)
                if "error" in chunk:
                    sample.error = "stream error"
                    break
                if any(c.get("text") for c in chunk.get("choices") or []):
                    sample.chunks += 1
                    if sample.ttft_s is None:
                        sample.ttft_s = time.perf_counter() - began
                if chunk.get("usage"):
                    sample.output_tokens = int(chunk["usage"].get("completion_tokens") or 0)
    except (TimeoutError, aiohttp.ClientError) as exc:
        sample.error = type(exc).__name__
        return sample
    if sample.error is None:
        sample.e2e_s = time.perf_counter() - began
        if sample.ttft_s is None:  # an empty answer: the first token was the end
            sample.ttft_s = sample.e2e_s
    return sample


async def replay(base_url: str, trace: Sequence[TraceRequest], timeout_s: float = 120.0,
                 prompts: Sequence[str] | None = None) -> list[Sample]:
    """Send every request at its ``t_s`` (open loop) and wait for all answers (``prompts``: their texts,
    else :func:`bench.traces.prompt_text`)."""
    return await replay_spread([base_url], [0] * len(trace), trace, timeout_s, prompts)


async def replay_spread(base_urls: Sequence[str], replica_of: Sequence[int], trace: Sequence[TraceRequest],
                        timeout_s: float = 120.0, prompts: Sequence[str] | None = None) -> list[Sample]:
    """:func:`replay`, request ``i`` sent to router ``base_urls[replica_of[i]]`` (router replicas)."""
    import aiohttp

    if len(replica_of) != len(trace):
        raise ValueError(f"{len(replica_of)} replica choices for {len(trace)} requests")
    urls = [f"{base_url}/v1/completions" for base_url in base_urls]
    connector = aiohttp.TCPConnector(limit=0)
    async with aiohttp.ClientSession(connector=connector) as session:
        loop = asyncio.get_running_loop()
        start = loop.time()
        tasks = []
        for key, request in enumerate(trace):
            delay = start + request.t_s - loop.time()
            if delay > 0:
                await asyncio.sleep(delay)
            prompt = prompts[key] if prompts is not None else None
            tasks.append(asyncio.create_task(_one(session, urls[replica_of[key]], key, request, timeout_s, prompt)))
        return list(await asyncio.gather(*tasks))


def summarize_samples(policy: str, samples: Sequence[Sample], counters: dict[str, float],
                      duration_s: float) -> dict[str, Any]:
    served = [s for s in samples if s.error is None and s.e2e_s is not None]
    ttft = [s.ttft_s for s in served if s.ttft_s is not None]
    e2e = [s.e2e_s for s in served if s.e2e_s is not None]
    requests = len(samples)
    errors = requests - len(served)
    hits = counters["hits"]
    # Pod insertions: attempts that carried weights, less those the pod refused as "cache full" (the
    # weights were not stored). An attempt whose weights reached a pod already holding the adapter still
    # counts (the pod ignores them), so this errs high and the effective hit rate errs low.
    loads = counters["cold_starts"] - counters["cache_full"]
    return {
        "policy": policy, "requests": requests,
        "hit_rate": hits / requests, "effective_hit_rate": 1.0 - (loads + errors) / requests,
        "loads": int(loads), "weight_sends": int(counters["cold_starts"]), "misses": int(counters["misses"]),
        "cache_full": int(counters["cache_full"]), "weights_kb": counters["weight_bytes"] / 1e3,
        "ttft_p50_ms": percentile(ttft, 50) * 1e3, "ttft_p99_ms": percentile(ttft, 99) * 1e3,
        "e2e_p50_ms": percentile(e2e, 50) * 1e3, "e2e_p99_ms": percentile(e2e, 99) * 1e3,
        "output_tokens_per_s": sum(s.chunks for s in served) / duration_s if duration_s else math.nan,
        "usage_tokens_per_s": sum(s.output_tokens for s in served) / duration_s if duration_s else math.nan,
        "errors": errors,
    }


def host_cache_bytes_for(pages: int) -> tuple[int, int]:
    """Host-tier bytes that hold exactly ``pages`` pages of the tiny model, and one adapter's pages."""
    from trtfleet_engines.reference.repository import default_reference_spec

    from bench.realfleet import tiny_config
    from trtfleet.api.basemodel import ModelDimensions
    from trtfleet.loracache import LoraCacheConfig, adapter_pages, lora_module_shapes, plan_lora_geometry

    config = tiny_config()
    spec = default_reference_spec()
    dims = ModelDimensions(
        hidden_size=config["hidden_size"], intermediate_size=config["intermediate_size"],
        num_layers=config["num_hidden_layers"], num_attention_heads=config["num_attention_heads"],
        num_kv_heads=config["num_key_value_heads"], head_dim=config.get("head_dim"),
        vocab_size=config["vocab_size"],
    )
    geometry = plan_lora_geometry(
        lora_module_shapes(dims, spec.lora.target_modules),
        LoraCacheConfig(optimal_adapter_size=spec.lora.cache.optimal_adapter_size,
                        max_adapter_size=spec.lora.cache.max_adapter_size, max_lora_rank=spec.lora.max_rank,
                        dtype_bytes=2, num_layers=dims.num_layers),
    )
    per_adapter = adapter_pages(geometry, spec.lora.max_rank)
    return pages * geometry.page_width * geometry.slots_per_page * geometry.dtype_bytes, per_adapter


def run_policy(policy: str, scenario: RealScenario, trace: Sequence[TraceRequest],
               adapters: list[tuple[str, int, Path]], host_bytes: int) -> tuple[dict[str, Any], list[Sample]]:
    work = WORK / policy
    fleet = RealFleet(policy, scenario.workers, adapters, host_bytes, work, max_batch_size=scenario.max_batch_size,
                      seed=scenario.seed, min_step_ms=scenario.min_step_ms,
                      policy_config=scenario.policy_config())
    with fleet:
        began = time.monotonic()
        samples = asyncio.run(replay(fleet.base_url, trace))
        duration = time.monotonic() - began
        counters = router_counters(fleet.router_metrics(), fleet.fleets_debug())
    return summarize_samples(policy, samples, counters, duration), samples


def router_counters(metrics: str, debug: Mapping[str, Any]) -> dict[str, float]:
    """One router's counters: per-pod books from ``/debug/fleets``, adapter counters from ``/metrics``."""
    pods = [pod for fleet_state in debug.values() for pod in fleet_state["pods"]]
    return {
        "warm_routes": sum(p["warm_routes_total"] for p in pods),
        "cold_starts": sum(p["cold_loads_total"] for p in pods),
        "cache_full": sum(p["cache_full_total"] for p in pods),
        "failures": sum(p["failures_total"] for p in pods),
        "hits": parse_counters(metrics, "trtfleet_router_adapter_cache_hits"),
        "misses": parse_counters(metrics, "trtfleet_router_adapter_cache_misses"),
        "loads": parse_counters(metrics, "trtfleet_router_adapter_loads"),
        "weight_bytes": parse_counters(metrics, "trtfleet_router_weight_bytes_sent"),
    }


def real_load(scenario: RealScenario, trace: Sequence[TraceRequest]) -> float:
    tokens_per_s = sum(r.max_tokens for r in trace) / max(trace[-1].t_s, 1e-9)
    return tokens_per_s / (scenario.workers * scenario.max_batch_size / (scenario.min_step_ms / 1e3))


def routing_section(quick: bool, *, loadgen: bool = True) -> tuple[str, dict[str, Any] | None]:
    from trtfleet_router.routing import policy_names

    scenario = RealScenario() if quick else RealScenario(adapters=200, duration_s=180.0)
    try:
        host_bytes, adapter_pages = host_cache_bytes_for(scenario.adapter_pages_per_worker)
        paths = synthetic_adapters(scenario.adapters, seed=scenario.seed)
    except (OSError, ImportError, ValueError) as exc:
        return f"_Not run: the reference engine or its assets are missing ({exc})._", None
    trace = generate(scenario.trace_spec())
    check_fits(trace, scenario.limits(), name=scenario.trace_spec().name)
    names = scenario.trace_spec().adapter_names()
    adapters = [(name, index + 1, path) for index, (name, path) in enumerate(zip(names, paths, strict=True))]
    from bench import coldload

    scenario, load = coldload.priced(scenario)
    WORK.mkdir(parents=True, exist_ok=True)
    write_jsonl(trace, WORK / "trace.jsonl", with_text=True)
    bound = optimal.hit_rate_bound([r.adapter for r in trace], [scenario.adapter_pages_per_worker] *
                                   scenario.workers, adapter_pages)
    rows: list[dict[str, Any]] = []
    samples_by_policy: dict[str, list[Sample]] = {}
    for policy in policy_names():
        print(f"  real run: {policy} ({len(trace)} requests over {trace[-1].t_s:.0f} s)", flush=True)
        row, samples = run_policy(policy, scenario, trace, adapters, host_bytes)
        row["of_bound"] = row["effective_hit_rate"] / bound.hit_rate if bound.hit_rate else math.nan
        if row["effective_hit_rate"] > bound.hit_rate + 1e-9:
            raise AssertionError(f"{policy}: measured effective hit rate beats the bound {bound.hit_rate}")
        print(f"    effective {row['effective_hit_rate']:.3f} ({row['of_bound']:.0%} of bound), TTFT p99 "
              f"{row['ttft_p99_ms']:.0f} ms, errors {row['errors']}", flush=True)
        rows.append(row)
        samples_by_policy[policy] = samples
    report.save_json("routing-real", {"scenario": dataclasses.asdict(scenario), "bound": bound.hit_rate,
                                      "rows": rows})
    image = report.bar_panels(
        rows, [("effective_hit_rate", "effective hit rate"), ("loads", "adapter loads"),
               ("ttft_p99_ms", "TTFT p99 (ms)"), ("e2e_p99_ms", "e2e p99 (ms)")],
        "routing-real", f"Real runs: {scenario.workers} reference workers, {scenario.adapters} adapters",
        reference={"effective_hit_rate": bound.hit_rate},
    )
    from bench import calibrate, simbench

    page_bytes = host_cache_bytes_for(1)[0]
    manifest = json.loads((paths[0] / "manifest.json").read_text(encoding="utf-8"))
    calibration = calibrate.compare(scenario, trace, samples_by_policy, rows, adapter_pages, page_bytes,
                                    int(manifest["weights_bytes"]))
    parts = [
        report.provenance(COMMAND.format(quick=" --quick" if quick else "")),
        f"{scenario.workers} real `tritonserver` workers running the CPU reference engine (tiny Llama, "
        f"max batch {scenario.max_batch_size}, every step at least {scenario.min_step_ms:.0f} ms: a pretend "
        f"GPU step), host LoRA cache {scenario.adapter_pages_per_worker} pages ({host_bytes:,} bytes) each, "
        f"{scenario.adapters} synthetic rank-8 adapters (converted by `trtfleet_engines.lora`), Zipf "
        f"{scenario.zipf_alpha} popularity, Poisson {scenario.rate_per_s} req/s for {scenario.duration_s:.0f} s "
        f"({len(trace)} requests), replayed open-loop through `trtfleet router` for each policy (fresh workers "
        f"and router each time). Bound {bound.hit_rate:.3f} (pooled K = {bound.capacity_slots}, ceiling "
        f"{bound.compulsory_ceiling:.3f}). Trace: `bench/results/real/trace.jsonl`. Cold load measured first "
        f"(`python -m bench.coldload`), {coldload.describe_price(load)}.",
        report.table(rows, REAL_COLUMNS),
        simbench.verdict(rows, "Measured") + f" Offered load: {real_load(scenario, trace):.0%} of the workers' "
        "token capacity (max batch x one token per minimum step). "
        "Real runs on 2 shared cores are noisy (other processes compete for the CPU): compare policies within "
        "one run, and read the simulator for the larger picture. `out tok/s` counts streamed chunks; the "
        "router's `usage.completion_tokens` for the reference engine is an estimate from the text.",
        f"![real runs]({image})",
    ]
    if loadgen:
        from bench import loadgen_external

        parts.append(loadgen_external.section(scenario, trace, adapters, host_bytes, rows))
    return "\n\n".join(parts), calibration
