"""Speculative decoding: the reference engine with n-gram drafting off / on, and the step model in the simulator.

    .venv/bin/python -m bench.speculative [--quick] [--write]

**Reference engine** (section ``spec-reference``): the real batcher and tiny Llama of the reference fleet, in
process (one pod's engine; no HTTP in the measurement), every request greedy. Two traces:

* *repetitive*: summaries and code edits whose text repeats itself (:data:`REPETITIVE`);
* *non-repetitive*: phrases of distinct words, no n-gram twice.

Per adapter (the base model echoes its prompt, ``json`` wraps it, ``upper`` and ``reverse`` transform it), with
speculation off and with ``NGram`` (``maxDraftLen`` 4, n-grams up to 3): tokens per engine step of a request,
decode steps per output token (every step a request takes, its prefill included, over its tokens), the engine's
CPU time to decode the whole trace, and whether every output is the same both ways.

**Simulator** (section ``spec-sim``): 64 H100 pods (``bench.profiles.h100_llama3_8b_fleet``) running the
router's own ``trtfleet`` policy, with the pod step model of :mod:`bench.podsim` and acceptance rates derived from
TensorRT-LLM's published speed-up (docs/benchmarks/speculative.md says how): TPOT and TTFT at a fixed offered
rate, and the pods each setting needs to hold a TPOT p99 SLO.
"""

from __future__ import annotations

import argparse
import dataclasses
import random
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from trtfleet_engines.lora.convert import ConversionOptions, convert_adapter
from trtfleet_engines.lora.peft import parse_peft_adapter, read_peft_dir
from trtfleet_engines.reference.engine import build_batcher, model_dimensions
from trtfleet_engines.reference.numpy_llama import (
    SAMPLE_ADAPTER_NAMES,
    SAMPLE_ADAPTERS_DIR,
    TINY_LLAMA_DIR,
    LlamaConfig,
)
from trtfleet_engines.reference.repository import (
    build_reference_repository,
    default_reference_spec,
    lora_cache_bytes_for,
)
from trtfleet_engines.reference.scheduler import GenerationRequest, InflightBatcher, LoraInputs
from trtfleet_engines.reference.settings import EngineSettings, settings_from_model_config
from trtfleet_engines.reference.speculation import SpeculationSettings
from trtfleet_engines.reference.tokenizer import EOS_ID, prompt_ids
from trtfleet_engines.speculation import tokens_per_step

from bench import report
from bench.podsim import SpeculationModel
from bench.profiles import h100_llama3_8b_fleet, pod_capacity_requests_per_s, with_pods
from bench.simstats import percentile
from bench.simulate import simulate
from bench.traces import LengthSpec, TraceSpec, generate, offered_load

COMMAND = ".venv/bin/python -m bench.speculative{quick} --write"
NGRAM = SpeculationSettings(mode="NGram", max_draft_len=4, max_matching_ngram_size=3)
ADAPTERS = ("base", "json", "upper", "reverse")
MAX_NEW_TOKENS = 96

REPETITIVE = (
    "the cat sat on the mat the cat sat on the mat",
    "hello world hello world hello world",
    "total plus price total plus tax total plus fee",
    "kubernetes operator kubernetes router kubernetes pod",
    "lora adapters on triton lora adapters on pytorch",
    "return width times height return width times height",
    "the fleet scales out the fleet scales in",
    "get pods get pods wide get pods all",
)
"""Summaries that quote themselves and code edits that repeat a line, in the words the tiny model was trained on
(it echoes lowercase phrases; longer text with digits and punctuation is beyond it)."""
WORDS = ("quick", "brown", "fox", "jumps", "over", "lazy", "dog", "lora", "adapters", "triton", "kubernetes",
         "operator", "router", "fleet", "scales", "model", "engine", "cache", "token", "prompt", "world", "hello",
         "green", "river", "stone", "paper", "light")


def _non_repetitive(count: int, seed: int) -> tuple[str, ...]:
    """Phrases of distinct words: no n-gram of the prompt occurs twice."""
    rng = random.Random(seed)
    return tuple(" ".join(rng.sample(WORDS, rng.randint(5, 8))) for _ in range(count))


# -- the reference engine ----------------------------------------------------------------------------------


def _settings(tmp: Path) -> EngineSettings:
    """The reference repository's engine settings, read from its config as Triton hands them to the model."""
    from google.protobuf import json_format, text_format
    from tritonclient.grpc import model_config_pb2

    repo = build_reference_repository(tmp, lora_cache_host_bytes=lora_cache_bytes_for(4))
    text = (Path(repo) / "tensorrt_llm" / "config.pbtxt").read_text()
    message = text_format.Parse(text, model_config_pb2.ModelConfig())
    return settings_from_model_config(json_format.MessageToDict(message, preserving_proto_field_name=True))


def _adapter_inputs() -> dict[str, LoraInputs]:
    """The sample adapters as TRT-LLM tensors (what ``trtfleet lora convert`` writes), task ids 1.."""
    spec = default_reference_spec()
    dims = model_dimensions(LlamaConfig.from_hf_config(TINY_LLAMA_DIR))
    options = ConversionOptions(dims=dims, max_rank=spec.lora.max_rank, target_modules=tuple(spec.lora.target_modules))
    out = {}
    for task_id, name in enumerate(sorted(SAMPLE_ADAPTER_NAMES), start=1):
        converted = convert_adapter(parse_peft_adapter(*read_peft_dir(SAMPLE_ADAPTERS_DIR / name)), options)
        out[name] = LoraInputs(task_id, converted.weights, converted.config)
    return out


def _run_reference(settings: EngineSettings, prompts: Sequence[str], lora: LoraInputs | None) -> dict[str, Any]:
    batcher: InflightBatcher[int] = build_batcher(settings)
    for index, text in enumerate(prompts):
        batcher.submit(GenerationRequest(tuple(prompt_ids(text)), MAX_NEW_TOKENS, end_id=EOS_ID,
                                         exclude_input_in_output=True, lora=lora), index)
    outputs: dict[int, tuple[int, ...]] = {}
    started = time.process_time()
    while batcher.has_work():
        for response in batcher.step():
            if response.final:
                outputs[response.handle] = response.output_ids
    cpu_s = time.process_time() - started
    stats = batcher.stats()
    return {"outputs": outputs, "cpu_s": cpu_s, "steps": stats.request_steps, "tokens": stats.output_tokens,
            "iterations": stats.iterations, "drafted": stats.spec_draft_tokens, "accepted": stats.spec_accepted_tokens}


def reference_rows(quick: bool, tmp: Path) -> list[dict[str, Any]]:
    settings = _settings(tmp)
    adapters = _adapter_inputs()
    traces = {"repetitive": REPETITIVE, "non-repetitive": _non_repetitive(len(REPETITIVE), seed=41)}
    repeats = 3 if quick else 5
    rows = []
    for trace, prompts in traces.items():
        for name in ADAPTERS:
            lora = None if name == "base" else adapters[name]
            runs = {}
            for label, speculation in (("off", None), ("on", NGRAM)):
                measured = [_run_reference(dataclasses.replace(settings, speculation=speculation), prompts, lora)
                            for _ in range(repeats)]
                best = min(measured, key=lambda m: m["cpu_s"])
                runs[label] = best
            off, on = runs["off"], runs["on"]
            row = {
                "trace": trace, "adapter": name, "tokens": on["tokens"],
                "tokens_per_step_off": off["tokens"] / off["steps"], "tokens_per_step_on": on["tokens"] / on["steps"],
                "steps_per_token_off": off["steps"] / off["tokens"], "steps_per_token_on": on["steps"] / on["tokens"],
                "acceptance": on["accepted"] / on["drafted"] if on["drafted"] else float("nan"),
                "iterations_off": off["iterations"], "iterations_on": on["iterations"],
                "cpu_ms_off": off["cpu_s"] * 1e3, "cpu_ms_on": on["cpu_s"] * 1e3,
                "identical": "yes" if on["outputs"] == off["outputs"] else "NO",
            }
            rows.append(row)
            print(f"  {trace:<15} {name:<8} steps/token {row['steps_per_token_off']:.2f} -> "
                  f"{row['steps_per_token_on']:.2f}, acceptance {row['acceptance']:.2f}, CPU "
                  f"{row['cpu_ms_off']:.0f} -> {row['cpu_ms_on']:.0f} ms, identical {row['identical']}", flush=True)
        steps_off = sum(r["steps_per_token_off"] * r["tokens"] for r in rows if r["trace"] == trace)
        steps_on = sum(r["steps_per_token_on"] * r["tokens"] for r in rows if r["trace"] == trace)
        total = sum(r["tokens"] for r in rows if r["trace"] == trace)
        rows.append({"trace": trace, "adapter": "all", "tokens": total, "steps_per_token_off": steps_off / total,
                     "steps_per_token_on": steps_on / total, "tokens_per_step_off": total / steps_off,
                     "tokens_per_step_on": total / steps_on,
                     "cpu_ms_off": sum(r["cpu_ms_off"] for r in rows if r["trace"] == trace and r["adapter"] != "all"),
                     "cpu_ms_on": sum(r["cpu_ms_on"] for r in rows if r["trace"] == trace and r["adapter"] != "all"),
                     "identical": "yes" if all(r["identical"] == "yes" for r in rows if r["trace"] == trace)
                     else "NO"})
    return rows


# -- the simulator ---------------------------------------------------------------------------------------

PUBLISHED_SPEEDUP = 2.16
"""DeepSeek-R1-FP4 on 8 B200, batch size 1, MTP next-n 3 against none (TensorRT-LLM tech blog 2)."""
DRAFT_LEN = 3


def acceptance_for_speedup(speedup: float, draft_len: int) -> float:
    """The acceptance rate whose expected tokens per step equal ``speedup`` (a lower bound on the rate behind a
    measured speed-up: the drafts' own cost only lowers the speed-up a given rate gives)."""
    low, high = 0.0, 1.0
    for _ in range(60):
        mid = (low + high) / 2
        if tokens_per_step(mid, draft_len) < speedup:
            low = mid
        else:
            high = mid
    return (low + high) / 2


def _tpot(records: Sequence[Any]) -> list[float]:
    return [(r.e2e_s - r.ttft_s) / (r.output_tokens - 1) for r in records
            if r.error is None and r.ttft_s is not None and r.e2e_s is not None and r.output_tokens > 1]


def _scenarios(num_adapters: int) -> dict[str, SpeculationModel | None]:
    rate = acceptance_for_speedup(PUBLISHED_SPEEDUP, DRAFT_LEN)
    # One adapter in five moves the output far from the base model's (an assumption, not a measurement).
    low = tuple((task, 0.3) for task in range(1, num_adapters + 1) if task % 5 == 0)
    return {
        "off": None,
        f"on, a={rate:.2f} every adapter": SpeculationModel(DRAFT_LEN, rate),
        f"on, a={rate:.2f}, 1 adapter in 5 at 0.30": SpeculationModel(DRAFT_LEN, rate, low),
    }


def sim_rows(quick: bool) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    base = h100_llama3_8b_fleet(64)
    trace_spec = TraceSpec(name="spec", num_adapters=500, zipf_alpha=1.0, num_requests=20_000 if quick else 60_000,
                           prompt=LengthSpec(median=600, sigma=0.6, min_tokens=16, max_tokens=2048),
                           output=LengthSpec(median=300, sigma=0.6, min_tokens=8, max_tokens=1024), seed=23)
    probe = offered_load(generate(dataclasses.replace(trace_spec, num_requests=2000)))
    per_pod = pod_capacity_requests_per_s(base, probe["mean_prompt_tokens"], probe["mean_max_tokens"])
    rate = 0.7 * 64 * per_pod
    trace = generate(dataclasses.replace(trace_spec, rate_per_s=rate))
    rows = []
    for label, model in _scenarios(trace_spec.num_adapters).items():
        fleet = dataclasses.replace(base, pod=dataclasses.replace(base.pod, speculation=model))
        row: dict[str, Any] = {"scenario": label,
                               "tokens_per_step": tokens_per_step(model.acceptance, DRAFT_LEN) if model else 1.0}
        row |= _latencies(simulate(trace, "ttft-cost", fleet, seed=1).records)
        row["pods_for_slo"] = _pods_for_slo(trace, fleet)
        rows.append(row)
        print(f"  {label:<40} TPOT p50 {row['tpot_p50_ms']:.1f} p99 {row['tpot_p99_ms']:.1f} ms, TTFT p99 "
              f"{row['ttft_p99_ms']:.0f} ms, pods for the SLO: {row['pods_for_slo']}", flush=True)
    meta = {"requests": len(trace), "rate_per_s": rate, "slo_tpot_ms": SLO_TPOT_S * 1e3,
            "slo_ttft_ms": SLO_TTFT_S * 1e3, "acceptance": acceptance_for_speedup(PUBLISHED_SPEEDUP, DRAFT_LEN),
            "duration_s": trace[-1].t_s}
    return rows, meta


SLO_TPOT_S = 0.010
SLO_TTFT_S = 1.0


def _latencies(records: Sequence[Any]) -> dict[str, float]:
    tpot = _tpot(records)
    ttft = [r.ttft_s for r in records if r.ttft_s is not None and r.error is None]
    errors = sum(1 for r in records if r.error is not None)
    return {"tpot_p50_ms": percentile(tpot, 0.5) * 1e3, "tpot_p99_ms": percentile(tpot, 0.99) * 1e3,
            "ttft_p99_ms": percentile(ttft, 0.99) * 1e3, "errors": errors}


def _meets_slo(records: Sequence[Any]) -> bool:
    found = _latencies(records)
    return not found["errors"] and found["tpot_p99_ms"] <= SLO_TPOT_S * 1e3 and found["ttft_p99_ms"] <= SLO_TTFT_S * 1e3


def _pods_for_slo(trace: Sequence[Any], fleet: Any) -> int | str:
    """The fewest pods (bisection over 16..64, assuming more pods never hurt) that hold the SLO on ``trace``."""
    low, high = 16, 64
    if not _meets_slo(simulate(trace, "ttft-cost", with_pods(fleet, high), seed=1).records):
        return ">64"
    while low < high:
        mid = (low + high) // 2
        if _meets_slo(simulate(trace, "ttft-cost", with_pods(fleet, mid), seed=1).records):
            high = mid
        else:
            low = mid + 1
    return high


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.speculative", description=__doc__)
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--write", action="store_true", help="write the tables into docs/benchmarks/speculative.md")
    parser.add_argument("--only", choices=("reference", "sim"), default=None)
    args = parser.parse_args(argv)
    import tempfile

    provenance = report.provenance(COMMAND.format(quick=" --quick" if args.quick else ""))
    if args.only in (None, "reference"):
        print("reference engine, n-gram speculation off / on", flush=True)
        with tempfile.TemporaryDirectory() as tmp:
            rows = reference_rows(args.quick, Path(tmp))
        report.save_json("spec-reference", rows)
        body = "\n\n".join([provenance, report.table(rows, [
            ("trace", "trace"), ("adapter", "adapter"), ("tokens", "output tokens"),
            ("tokens_per_step_off", "tokens/step off"), ("tokens_per_step_on", "tokens/step on"),
            ("steps_per_token_off", "steps/token off"), ("steps_per_token_on", "steps/token on"),
            ("acceptance", "acceptance"), ("cpu_ms_off", "decode CPU ms off"), ("cpu_ms_on", "decode CPU ms on"),
            ("identical", "outputs identical")])])
        print(body)
        if args.write:
            report.write_section("spec-reference", body)
    if args.only in (None, "sim"):
        print("simulator, 64 H100 pods", flush=True)
        rows_sim, meta = sim_rows(args.quick)
        report.save_json("spec-sim", {"meta": meta, "rows": rows_sim})
        body = "\n\n".join([provenance, (
            f"{meta['requests']:,} requests over {meta['duration_s']:.0f} s at {meta['rate_per_s']:.0f} req/s (70 % of "
            "the 64 pods' compute "
            f"without speculation), 500 adapters, Zipf 1.0; draft length {DRAFT_LEN}; acceptance "
            f"{meta['acceptance']:.2f} derived from the published {PUBLISHED_SPEEDUP}x; SLO: TPOT p99 <= "
            f"{meta['slo_tpot_ms']:.0f} ms and TTFT p99 <= {meta['slo_ttft_ms']:.0f} ms with no error, pods found "
            "by bisection over 16 to 64."),
            report.table(rows_sim, [("scenario", "scenario"), ("tokens_per_step", "tokens/step (base)"),
                                    ("tpot_p50_ms", "TPOT p50 ms"), ("tpot_p99_ms", "TPOT p99 ms"),
                                    ("ttft_p99_ms", "TTFT p99 ms"), ("pods_for_slo", "pods for the SLO")])])
        print(body)
        if args.write:
            report.write_section("spec-sim", body)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
