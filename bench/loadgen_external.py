"""The real-run trace through a public load generator: kubernetes-sigs' ``inference-perf`` (PyPI, 0.7.0).

Why this one: ``genai-perf`` needs the ``perf_analyzer`` binary (not on PyPI), ``guidellm`` 0.8 pulls a
CUDA build of torch (gigabytes); ``inference-perf`` installs cleanly (no torch) and replays a timing
trace offline. It needs Python >= 3.12, so it lives in its own venv, ``.cache/loadgen-ip-venv`` (never
the project venv), made by :func:`ensure_venv` with pyenv's 3.12 (or any ``python3.12``)::

    python3.12 -m venv .cache/loadgen-ip-venv
    .cache/loadgen-ip-venv/bin/pip install inference-perf==0.7.0
    .cache/loadgen-ip-venv/bin/inference-perf --config_file bench/results/loadgen/config.yaml

What it replays: our trace's arrival times and prompt/output lengths, as its ``trace_replay`` load type
reads them (Azure public dataset CSV: ``TIMESTAMP,ContextTokens,GeneratedTokens``), with prompts of
exactly those lengths from its ``random`` data generator and a local tokenizer of one token per
printable ASCII byte (what the reference model's byte tokenizer counts; made once with
``tokenizers``, offline). Adapters: inference-perf draws one per request from ``lora_traffic_split``,
so it gets our Zipf popularity but not our exact adapter sequence. ``ignore_eos`` is off (the router's
OpenAI front end has no such knob). It runs against the default policy's fleet, built exactly as for
our own client, and we compare its TTFT / e2e percentiles with ours.
"""

from __future__ import annotations

import datetime as dt
import json
import shutil
import subprocess
import time
from collections.abc import Mapping, Sequence
from fractions import Fraction
from pathlib import Path
from typing import Any

import numpy as np
import yaml

from bench import report
from bench.realfleet import RealFleet, parse_counters
from bench.traces import TraceRequest, zipf_weights

ROOT = report.ROOT
VENV = ROOT / ".cache" / "loadgen-ip-venv"
VERSION = "0.7.0"
WORK = report.RESULTS / "loadgen"
POLICY = "trtfleet"
_TOKENIZER_SCRIPT = """
import sys
from tokenizers import Tokenizer, decoders, models, pre_tokenizers
from transformers import PreTrainedTokenizerFast
vocab = {chr(c): i for i, c in enumerate(range(32, 127))}
vocab["<unk>"] = len(vocab)
tokenizer = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
tokenizer.pre_tokenizer = pre_tokenizers.Split(pattern="", behavior="isolated")
tokenizer.decoder = decoders.Fuse()
PreTrainedTokenizerFast(tokenizer_object=tokenizer, unk_token="<unk>").save_pretrained(sys.argv[1])
"""


def _python312() -> str | None:
    for candidate in (shutil.which("python3.12"), str(Path.home() / ".pyenv/versions/3.12.1/bin/python")):
        if candidate and Path(candidate).exists():
            try:
                subprocess.run([candidate, "-c", "import venv"], check=True, capture_output=True)
            except (OSError, subprocess.CalledProcessError):
                continue
            return candidate
    return None


def ensure_venv() -> Path:
    """The inference-perf venv's bin directory (created and installed on first use)."""
    binary = VENV / "bin" / "inference-perf"
    if binary.exists():
        return binary.parent
    python = _python312()
    if python is None:
        raise RuntimeError("inference-perf needs Python >= 3.12 and none was found (pyenv install 3.12)")
    subprocess.run([python, "-m", "venv", str(VENV)], check=True)
    subprocess.run([str(VENV / "bin" / "pip"), "install", "-q", f"inference-perf=={VERSION}"], check=True)
    return binary.parent


def azure_csv(trace: Sequence[TraceRequest], path: Path) -> None:
    start = dt.datetime(2026, 1, 1)
    lines = ["TIMESTAMP,ContextTokens,GeneratedTokens"]
    for request in trace:
        stamp = start + dt.timedelta(seconds=request.t_s)
        lines.append(f"{stamp.strftime('%Y-%m-%d %H:%M:%S.%f')},{request.prompt_tokens},{request.max_tokens}")
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")


def dyadic_split(names: Sequence[str], weights: np.ndarray, denominator: int = 4096) -> list[dict[str, Any]]:
    """Weights as multiples of 1/denominator that sum to exactly 1.0 (inference-perf checks ``== 1.0``)."""
    counts = np.maximum(1, np.floor(weights * denominator)).astype(int)
    counts[0] += denominator - counts.sum()
    return [{"name": name, "split": float(Fraction(int(c), denominator))} for name, c in zip(names, counts,
                                                                                            strict=True)]


def config(base_url: str, trace_csv: Path, tokenizer: Path, out: Path, split: list[dict[str, Any]],
           duration_s: float) -> dict[str, Any]:
    return {
        "api": {"type": "completion", "streaming": True},
        "data": {"type": "random", "trace": {"file": str(trace_csv), "format": "AzurePublicDataset"}},
        "load": {
            "type": "trace_replay", "trace": {"file": str(trace_csv), "format": "AzurePublicDataset"},
            "stages": [{"rate": 1, "duration": int(duration_s) + 1}], "num_workers": 1,
            "worker_max_concurrency": 256, "lora_traffic_split": split, "base_seed": 0,
            "stage_teardown_grace_seconds": 60,
        },
        "server": {"type": "vllm", "model_name": "tiny", "base_url": base_url, "ignore_eos": False},
        "tokenizer": {"pretrained_model_name_or_path": str(tokenizer)},
        "report": {"request_lifecycle": {"summary": True, "per_stage": False, "per_request": False,
                                         "per_adapter": False}, "prometheus": None},
        "storage": {"local_storage": {"path": str(out)}},
    }


def _metric(summary: Mapping[str, Any], *path: str) -> float:
    node: Any = summary
    for key in path:
        if not isinstance(node, Mapping) or key not in node:
            return float("nan")
        node = node[key]
    return float(node) if isinstance(node, int | float) else float("nan")


def run(scenario: Any, trace: Sequence[TraceRequest], adapters: list[tuple[str, int, Path]],
        host_bytes: int) -> dict[str, Any]:
    bin_dir = ensure_venv()
    shutil.rmtree(WORK, ignore_errors=True)
    WORK.mkdir(parents=True, exist_ok=True)
    tokenizer = WORK / "byte-tokenizer"
    subprocess.run([str(bin_dir / "python"), "-c", _TOKENIZER_SCRIPT, str(tokenizer)], check=True,
                   capture_output=True)
    trace_csv = WORK / "trace.csv"
    azure_csv(trace, trace_csv)
    names = [name for name, _task, _path in adapters]
    split = dyadic_split(names, zipf_weights(len(names), scenario.zipf_alpha))
    fleet = RealFleet(POLICY, scenario.workers, adapters, host_bytes, WORK / "fleet",
                      max_batch_size=scenario.max_batch_size, seed=scenario.seed, min_step_ms=scenario.min_step_ms,
                      policy_config=scenario.policy_config())
    with fleet:
        cfg = config(fleet.base_url, trace_csv, tokenizer, WORK / "out", split, trace[-1].t_s)
        config_path = WORK / "config.yaml"
        config_path.write_text(yaml.safe_dump(cfg, sort_keys=False), encoding="utf-8")
        began = time.monotonic()
        with (WORK / "inference-perf.log").open("wb") as log:
            subprocess.run([str(bin_dir / "inference-perf"), "--config_file", str(config_path)], cwd=WORK,
                           stdout=log, stderr=subprocess.STDOUT, check=True, timeout=trace[-1].t_s + 240)
        wall_s = time.monotonic() - began
        metrics = fleet.router_metrics()
    summary_path = next((WORK / "out").rglob("summary_lifecycle_metrics.json"))
    summary = json.loads(summary_path.read_text(encoding="utf-8"))
    requests = len(trace)
    return {
        "summary_file": str(summary_path.relative_to(ROOT)),
        "wall_s": wall_s,
        "hit_rate": parse_counters(metrics, "trtfleet_router_adapter_cache_hits") / requests,
        "loads": parse_counters(metrics, "trtfleet_router_adapter_loads"),
        "ttft_p50_ms": _metric(summary, "successes", "latency", "time_to_first_token", "median") * 1e3,
        "ttft_p99_ms": _metric(summary, "successes", "latency", "time_to_first_token", "p99") * 1e3,
        "e2e_p50_ms": _metric(summary, "successes", "latency", "request_latency", "median") * 1e3,
        "e2e_p99_ms": _metric(summary, "successes", "latency", "request_latency", "p99") * 1e3,
        "successes": _metric(summary, "successes", "count"),
        "failures": _metric(summary, "failures", "count"),
    }


def section(scenario: Any, trace: Sequence[TraceRequest], adapters: list[tuple[str, int, Path]],
            host_bytes: int, our_rows: Sequence[Mapping[str, Any]]) -> str:
    print(f"  external load generator: inference-perf {VERSION} against {POLICY}", flush=True)
    try:
        theirs = run(scenario, trace, adapters, host_bytes)
    except (OSError, RuntimeError, subprocess.SubprocessError, StopIteration, ValueError) as exc:
        return f"**External load generator**: not run ({type(exc).__name__}: {exc})."
    report.save_json("loadgen-external", theirs)
    ours = next((row for row in our_rows if row["policy"] == POLICY), {})
    keys = ("hit_rate", "loads", "ttft_p50_ms", "ttft_p99_ms", "e2e_p50_ms", "e2e_p99_ms")
    rows = [{"client": "bench/replay.py (ours)", **{k: ours.get(k, float("nan")) for k in keys},
             "errors": ours.get("errors", "-")},
            {"client": f"inference-perf {VERSION}", **{k: theirs[k] for k in keys},
             "errors": theirs["failures"]}]
    columns = [("client", "client"), ("hit_rate", "hit rate"), ("loads", "loads"), ("ttft_p50_ms", "TTFT p50 ms"),
               ("ttft_p99_ms", "TTFT p99 ms"), ("e2e_p50_ms", "e2e p50 ms"), ("e2e_p99_ms", "e2e p99 ms"),
               ("errors", "errors")]
    return (
        f"**External load generator** (`bench/loadgen_external.py`): the same arrival times and lengths replayed "
        f"by kubernetes-sigs `inference-perf` {VERSION} (its own venv, `.cache/loadgen-ip-venv`, Python 3.12; "
        f"`inference-perf --config_file bench/results/loadgen/config.yaml`, `trace_replay` load, `random` "
        f"data, a local byte tokenizer) against a fresh `{POLICY}` fleet. It draws adapters from the same Zipf "
        f"split per request instead of replaying our sequence. Its percentiles next to ours:\n\n"
        + report.table(rows, columns)
    )
