"""Soak the CPU reference engine: crashes of its Python backend stubs, mid-run and at stop, and leaks.

``python -m bench.soak_reference [--runs N] [--requests R] [--streams C] [--adapters A] [--abandon F]``

Each run starts 3 reference workers (host LoRA cache of 2 adapters each, 2 ms pretend steps), sends R
streamed ``tensorrt_llm_bls`` requests over gRPC, C at a time, spread over the workers and A synthetic
adapters (``bench.realfleet.synthetic_adapters``): a request carries only its task id, and is sent again
with the weights after a cache miss, as the router does. A fraction F of the streams is abandoned after
the first chunk (the client cancels the gRPC stream). The workers are then stopped with SIGTERM.

Counted from each stub's wait status (the recorder of ``trtfleet_engines.reference.stubs``): stubs that
ended by a signal (SIGSEGV, SIGABRT...) or with a non-zero status, mid-run (before the stop) or at the
stop; tritonserver exit statuses (1: a model did not unload within the exit timeout); stubs left behind;
watchdog restarts; request errors other than cache misses; BLS stub RSS before and after the traffic.
This talks to the workers directly, not through the router: the router's own failure handling is
measured elsewhere. The issue's full size is 10 runs of 2,000 requests at 20 streams.
"""

from __future__ import annotations

import argparse
import json
import random
import re
import signal
import sys
import threading
import time
from collections import Counter
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

WORKERS = 3
CACHE_ADAPTERS = 8
"""Host LoRA cache per worker, in adapters: each worker serves a third of the adapters (as the router's
affinity would), so with 50 adapters it misses and evicts, and ~7 concurrent streams fit it."""
STEP_MS = 2.0
MAX_TOKENS = (8, 48)
ABANDONED_MIN_TOKENS = 32
"""An abandoned request is at least this long, so that the client's cancellation (after the first chunk) does
not meet the request's own end. Triton 2.51's gRPC frontend races a cancellation against the final response
(fixed in triton-inference-server/server@42811e0cd3edd2522cbc9de795bc335606460fc3); the loser holds the model
past the exit timeout. The BLS model's own final response after a cancellation can still meet it: see the
"stops past the exit timeout" figure."""
PROMPTS = ("hello world", "kubernetes operator", "abc", "lora adapters on a fleet", "the quick brown fox")


@dataclass
class RunFigures:
    requests: int = 0
    abandoned: int = 0
    misses: int = 0
    errors: Counter[str] = field(default_factory=Counter)
    stubs: int = 0
    crashed_mid_run: list[str] = field(default_factory=list)
    crashed_at_stop: list[str] = field(default_factory=list)
    no_exit_recorded: list[str] = field(default_factory=list)
    server_exit_codes: list[int] = field(default_factory=list)
    stubs_reaped: int = 0
    restarts: int = 0
    bls_rss_mb: list[tuple[float, float]] = field(default_factory=list)
    seconds: float = 0.0


def _rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def _bls_pids(workers: Sequence[Any]) -> list[int]:
    from trtfleet_engines.reference.stubs import stub_pids

    return [
        pid for w in workers for pid, name in stub_pids(w.backends_dir).items() if name.startswith("tensorrt_llm_bls")
    ]


class Client:
    """One streamed BLS request over its own gRPC stream; ``abandon`` cancels it after the first chunk."""

    def __init__(self, url: str) -> None:
        import tritonclient.grpc as grpcclient

        self.client = grpcclient.InferenceServerClient(url)
        self.first = threading.Event()
        self.done = threading.Event()
        self.error: str | None = None
        self.client.start_stream(callback=self._on_response)

    def _on_response(self, result: Any, error: Any) -> None:
        if self.done.is_set():
            return
        if error is not None:
            self.error = error.message()
            self.done.set()
            self.first.set()
            return
        self.first.set()
        if result.get_response().parameters["triton_final_response"].bool_param:
            self.done.set()

    def run(self, inputs: list[Any], *, abandon: bool, timeout_s: float = 120.0) -> str | None:
        self.client.async_stream_infer("tensorrt_llm_bls", inputs, enable_empty_final_response=True)
        event = self.first if abandon else self.done
        if not event.wait(timeout_s):
            self.error = f"no {'first chunk' if abandon else 'final response'} within {timeout_s:.0f} s"
        error = self.error  # before the stop: cancelling reports "Locally cancelled by application!"
        self.client.stop_stream(cancel_requests=not self.done.is_set())
        self.client.close()
        return error


def _inputs(prompt: str, max_tokens: int, task_id: int, adapter: tuple[Any, Any] | None) -> list[Any]:
    import tritonclient.grpc as grpcclient

    def tensor(name: str, value: Any, datatype: str) -> Any:
        t = grpcclient.InferInput(name, list(value.shape), datatype)
        t.set_data_from_numpy(value)
        return t

    inputs = [
        tensor("text_input", np.array([[prompt.encode()]], dtype=object), "BYTES"),
        tensor("max_tokens", np.array([[max_tokens]], np.int32), "INT32"),
        tensor("stream", np.array([[True]], bool), "BOOL"),
        tensor("lora_task_id", np.array([[task_id]], np.uint64), "UINT64"),
    ]
    if adapter is not None:
        inputs += [tensor("lora_weights", adapter[0], "FP16"), tensor("lora_config", adapter[1], "INT32")]
    return inputs


def one_run(args: argparse.Namespace, adapters: list[tuple[Any, Any]], seed: int) -> RunFigures:
    from trtfleet_engines.reference.repository import lora_cache_bytes_for
    from trtfleet_engines.reference.workers import launch_reference_worker

    figures = RunFigures()
    rng = random.Random(seed)
    plan = [
        (index % WORKERS, index, rng.choice(PROMPTS), max(tokens, ABANDONED_MIN_TOKENS) if abandon else tokens, abandon)
        for index, tokens, abandon in (
            (rng.randrange(len(adapters)), rng.randint(*MAX_TOKENS), rng.random() < args.abandon)
            for _ in range(args.requests)
        )
    ]
    lock = threading.Lock()
    started = time.monotonic()
    cache_bytes = lora_cache_bytes_for(CACHE_ADAPTERS)
    ws: list[Any] = []
    try:
        for index in range(WORKERS):
            log_dir = None if args.logs is None else args.logs / f"seed{seed}-w{index}"
            options = {
                "lora_cache_host_bytes": cache_bytes,
                "min_step_ms": STEP_MS,
                "log_dir": log_dir,
                "log_verbose": args.log_verbose,
            }
            ws.append(launch_reference_worker(wait=False, **options))
        for w in ws:
            w.wait_ready()
        rss_before = [_rss_mb(pid) for pid in _bls_pids(ws)]

        def send(job: tuple[int, int, str, int, bool]) -> None:
            worker, index, prompt, max_tokens, abandon = job
            url = ws[worker].grpc_url
            timeout_s = args.request_timeout
            inputs = _inputs(prompt, max_tokens, 5000 + index, None)
            error = Client(url).run(inputs, abandon=abandon, timeout_s=timeout_s)
            missed = error is not None and "not found in cache" in error
            if missed:
                inputs = _inputs(prompt, max_tokens, 5000 + index, adapters[index])
                error = Client(url).run(inputs, abandon=abandon, timeout_s=timeout_s)
            with lock:
                figures.requests += 1
                figures.abandoned += abandon
                figures.misses += missed
                if error is not None:
                    figures.errors[re.sub(r"requestId \d+", "requestId N", error)[:100]] += 1

        with ThreadPoolExecutor(args.streams) as pool:
            list(pool.map(send, plan))
        rss_after = [_rss_mb(pid) for pid in _bls_pids(ws)]
        figures.bls_rss_mb = list(zip(rss_before, rss_after, strict=False))
        time.sleep(args.settle_s)
    finally:
        stop_began_s = time.time()
        for w in ws:
            w.terminate()
        for w in ws:
            w.stop()
    for w in ws:
        figures.server_exit_codes.append(int(w.process.returncode))
        figures.stubs_reaped += w.stubs_reaped
        figures.restarts += w.restarts
        for stub in w.stubs_at_stop:
            figures.stubs += 1
            if stub.wait_status is None:
                figures.no_exit_recorded.append(stub.describe())
            elif not stub.clean:
                ended = stub.ended_at_s or 0.0
                (figures.crashed_mid_run if ended < stop_began_s else figures.crashed_at_stop).append(stub.describe())
    figures.seconds = time.monotonic() - started
    return figures


def load_adapters(count: int) -> list[tuple[Any, Any]]:
    from bench.realfleet import synthetic_adapters

    out = []
    for path in synthetic_adapters(count):
        out.append((np.load(path / "model.lora_weights.npy"), np.load(path / "model.lora_config.npy")))
    return out


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.soak_reference", description=__doc__.split("\n")[0])
    parser.add_argument("--runs", type=int, default=10)
    parser.add_argument("--requests", type=int, default=2000, help="requests per run")
    parser.add_argument("--streams", type=int, default=20, help="concurrent streams")
    parser.add_argument("--adapters", type=int, default=50)
    parser.add_argument("--abandon", type=float, default=0.25, help="fraction of streams abandoned after 1 chunk")
    parser.add_argument("--request-timeout", type=float, default=60.0, help="seconds before a stream counts as hung")
    parser.add_argument("--logs", type=Path, default=None, help="keep each worker's tritonserver log here")
    parser.add_argument("--log-verbose", type=int, default=0, help="tritonserver --log-verbose (with --logs)")
    parser.add_argument("--settle-s", type=float, default=0.0, help="pause between the traffic and the stop")
    parser.add_argument("--json", type=Path, default=None, help="also write the figures here")
    args = parser.parse_args(argv)
    # SIGTERM unwinds like Ctrl-C, so the workers of the current run are stopped on the way out.
    signal.signal(signal.SIGTERM, lambda _signum, _frame: sys.exit(143))
    adapters = load_adapters(args.adapters)
    runs = []
    for index in range(args.runs):
        figures = one_run(args, adapters, seed=index)
        runs.append(figures)
        rss = ", ".join(f"{a:.0f}->{b:.0f}" for a, b in figures.bls_rss_mb)
        print(
            f"run {index + 1}/{args.runs}: {figures.requests} requests ({figures.abandoned} abandoned, "
            f"{figures.misses} cache misses), errors {dict(figures.errors) or 0}; stubs {figures.stubs}: "
            f"crashed mid-run {len(figures.crashed_mid_run)}, at stop {len(figures.crashed_at_stop)}, "
            f"no exit recorded {len(figures.no_exit_recorded)}; tritonserver exit {figures.server_exit_codes}; "
            f"reaped {figures.stubs_reaped}; restarts {figures.restarts}; BLS RSS MB {rss}; "
            f"{figures.seconds:.0f} s",
            flush=True,
        )
        for line in figures.crashed_mid_run + figures.crashed_at_stop + figures.no_exit_recorded:
            print(f"    {line}", flush=True)
    total_requests = sum(f.requests for f in runs)
    crashes = sum(len(f.crashed_mid_run) + len(f.crashed_at_stop) for f in runs)
    unclean_stops = sum(code != 0 for f in runs for code in f.server_exit_codes)
    print(
        f"total: {args.runs} runs, {total_requests} requests at {args.streams} streams: {crashes} stub crashes, "
        f"{unclean_stops} tritonserver stops past the exit timeout, "
        f"{sum(f.stubs_reaped for f in runs)} stubs left behind, {sum(sum(f.errors.values()) for f in runs)} errors"
    )
    if args.json is not None:
        args.json.write_text(json.dumps([f.__dict__ for f in runs], indent=1, default=list))
    return 1 if crashes or unclean_stops else 0


if __name__ == "__main__":
    sys.exit(main())
