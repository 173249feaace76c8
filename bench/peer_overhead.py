"""Router overhead against a peer: trtfleet's router next to ``vllm-router`` (PyPI, Rust), same run.

``python -m bench.peer_overhead [--requests 2000] [--warmup 200] [--concurrency 32] [--duration-s 5]
[--wrk-rounds 3] [--wrk-seconds 2] [--peer-venv .cache/peer-venv] [--json PATH]``

Each router proxies to a minimal upstream on loopback and is measured as the latency it ADDS over its
own upstream called directly, in the same run:

* **trtfleet**: ``trtfleet router`` (started as :mod:`bench.router_overhead` starts it) in front of the
  echo upstream (:mod:`trtfleet_router.testing.echo`, Triton-compatible, no model). Via the router:
  OpenAI ``POST /v1/completions`` for a warm adapter; direct: the echo upstream's Triton HTTP
  ``/v2/models/tensorrt_llm_bls/generate`` with the adapter's ``lora_task_id`` (the closest equivalent).
* **vllm-router**: ``vllm-router --policy round_robin`` in front of :func:`upstream_app`, a minimal
  OpenAI-compatible aiohttp server (``POST /v1/completions`` answering a fixed small completion,
  ``GET /v1/models``, ``GET /health``, which vllm-router probes at startup). Via the router and direct:
  ``POST /v1/completions``.

Both upstreams are small Python aiohttp servers in their own processes. vllm-router is not a project
dependency: it is installed into its own virtual environment (``--peer-venv``, created on first use with
``python3 -m venv`` + ``pip install vllm-router==0.1.17``).

Latency: ``--requests`` sequential requests per target (concurrency 1, aiohttp client with keep-alive,
after ``--warmup``), the four targets interleaved request by request so background load hits them alike;
"added" is via-router minus direct at the same percentile. Throughput: a closed loop of ``--concurrency``
connections for ``--duration-s`` per target, from ``wrk`` when installed, else from the aiohttp client.
Router CPU time per request (from /proc) is printed too. With wrk, the concurrency-1 latency is also
taken from it (one connection, ``--wrk-rounds`` runs of ``--wrk-seconds`` per target, the order reversed
every other round): the Python client's own work shares the two cores with the routers (see
:mod:`bench.native_loadgen`). Every process is stopped on the way out.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import aiohttp
from aiohttp import web

from bench import native_loadgen
from bench.native_loadgen import cpu_s, free_port, percentile
from bench.overhead_calls import MAX_TOKENS, PROMPT, Call, http_call, throughput
from bench.overhead_processes import start, wait_http
from bench.router_overhead import wrk_throughput

REPO = Path(__file__).resolve().parent.parent
PEER_VERSION = "0.1.17"
PEER_MODEL = "peer-model"
COMPLETION_TEXT = "hello from the minimal upstream"


# -- the minimal OpenAI-compatible upstream -----------------------------------------------------------------


def completion_response(model: str) -> dict[str, Any]:
    """The fixed small completion the minimal upstream answers every ``/v1/completions`` with."""
    return {
        "id": "cmpl-peer-bench",
        "object": "text_completion",
        "created": 0,
        "model": model,
        "choices": [{"index": 0, "text": COMPLETION_TEXT, "logprobs": None, "finish_reason": "length"}],
        "usage": {"prompt_tokens": 6, "completion_tokens": 6, "total_tokens": 12},
    }


def models_response(model: str) -> dict[str, Any]:
    return {"object": "list", "data": [{"id": model, "object": "model", "created": 0, "owned_by": "bench"}]}


def upstream_app(model: str = PEER_MODEL) -> web.Application:
    """``POST /v1/completions`` (fixed answer), ``GET /v1/models``, ``GET /health``: what vllm-router needs."""
    completion = json.dumps(completion_response(model)).encode()
    models = json.dumps(models_response(model)).encode()

    async def completions(request: web.Request) -> web.Response:
        await request.read()  # the body is read (as a real server would) but not interpreted
        return web.Response(body=completion, content_type="application/json")

    async def list_models(request: web.Request) -> web.Response:
        return web.Response(body=models, content_type="application/json")

    async def health(request: web.Request) -> web.Response:
        return web.Response(status=200)

    app = web.Application()
    app.add_routes(
        [web.post("/v1/completions", completions), web.get("/v1/models", list_models), web.get("/health", health)]
    )
    return app


def serve_upstream(port: int) -> None:
    web.run_app(upstream_app(), host="127.0.0.1", port=port, print=None, access_log=None)


# -- the peer router --------------------------------------------------------------------------------------


def ensure_peer_venv(venv: Path) -> Path:
    """The ``vllm-router`` executable in ``venv``; the venv is created and the wheel installed if missing."""
    binary = venv / "bin" / "vllm-router"
    if binary.exists():
        return binary
    print(f"installing vllm-router=={PEER_VERSION} into {venv} (not a project dependency)", flush=True)
    subprocess.run(["python3", "-m", "venv", str(venv)], check=True)
    subprocess.run([str(venv / "bin" / "pip"), "install", "-q", f"vllm-router=={PEER_VERSION}"], check=True)
    return binary


class Children:
    """Processes this run started; ``stop()`` ends each one (SIGTERM, then SIGKILL) in reverse order."""

    def __init__(self) -> None:
        self.procs: list[subprocess.Popen[bytes]] = []

    def spawn(self, command: list[str], log: Path) -> subprocess.Popen[bytes]:
        proc = subprocess.Popen(command, cwd=REPO, stdout=subprocess.DEVNULL, stderr=log.open("wb"))
        self.procs.append(proc)
        return proc

    def stop(self) -> None:
        for proc in reversed(self.procs):
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
                try:
                    proc.wait(timeout=10)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait()


@dataclass
class Peer:
    upstream: str
    router: str
    router_pid: int


def start_peer(binary: Path, children: Children, work: Path) -> Peer:
    up_port, router_port, metrics_port = free_port(), free_port(), free_port()
    children.spawn([sys.executable, "-m", "bench.peer_overhead", "--serve-upstream", str(up_port)], work / "up.log")
    wait_http(f"http://127.0.0.1:{up_port}/health", timeout_s=30)
    router = children.spawn(
        [
            str(binary), "--worker-urls", f"http://127.0.0.1:{up_port}", "--policy", "round_robin",
            "--host", "127.0.0.1", "--port", str(router_port), "--prometheus-port", str(metrics_port),
            "--worker-startup-timeout-secs", "30", "--worker-startup-check-interval", "1", "--log-level", "warning",
        ],
        work / "vllm-router.log",
    )  # fmt: skip
    deadline = time.monotonic() + 40
    while True:  # fails fast if vllm-router exits, with its log
        try:
            if router.poll() is not None:
                raise RuntimeError(f"vllm-router exited with {router.returncode}")
            wait_http(f"http://127.0.0.1:{router_port}/readiness", timeout_s=1)
            break
        except RuntimeError as error:
            if router.poll() is None and time.monotonic() < deadline:
                continue
            log = (work / "vllm-router.log").read_text(errors="replace")[-2000:]
            raise RuntimeError(f"vllm-router not ready: {error}; its log ends:\n{log}") from error
    return Peer(f"127.0.0.1:{up_port}", f"127.0.0.1:{router_port}", router.pid)


# -- measurement ------------------------------------------------------------------------------------------


@dataclass
class Side:
    p50_ms: float
    p99_ms: float


def side(samples_s: list[float]) -> Side:
    return Side(percentile(samples_s, 0.5), percentile(samples_s, 0.99))


def added(direct: Side, routed: Side) -> Side:
    """Latency the router adds, percentile by percentile (router p99 minus direct p99, not a p99 of deltas)."""
    return Side(routed.p50_ms - direct.p50_ms, routed.p99_ms - direct.p99_ms)


def ratio(numerator: float, denominator: float) -> float | None:
    """``numerator / denominator``, or None when the denominator is not positive (no meaningful ratio)."""
    return numerator / denominator if denominator > 0 else None


async def interleaved_latency(calls: dict[str, Call], requests: int, warmup: int) -> dict[str, list[float]]:
    """Sequential requests, one per target in turn, so drifting background load hits every target alike."""
    for _ in range(warmup):
        for call in calls.values():
            await call()
    samples: dict[str, list[float]] = {name: [] for name in calls}
    for _ in range(requests):
        for name, call in calls.items():
            samples[name].append((await call())[1])
    return samples


def wrk_latency(
    wrk: str, targets: dict[str, tuple[str, dict[str, Any]]], rounds: int, seconds: float, work: Path
) -> dict[str, dict[str, float]]:
    """Concurrency-1 latency from wrk (one connection), every target ``rounds`` times for ``seconds``, the
    order reversed every other round; the median p50/p99 over rounds per target."""
    runs: dict[str, list[native_loadgen.Run]] = {name: [] for name in targets}
    names = list(targets)
    for index in range(rounds):
        for name in names if index % 2 == 0 else names[::-1]:
            url, body = targets[name]
            runs[name].append(native_loadgen.wrk_run(wrk, url, body, 1, seconds, work))
    return {
        name: {
            "p50_ms": statistics.median(run.p50_ms for run in target_runs),
            "p99_ms": statistics.median(run.p99_ms for run in target_runs),
        }
        for name, target_runs in runs.items()
    }


async def measure(args: argparse.Namespace, children: Children, work: Path) -> dict[str, Any]:
    # SIGTERM cancels this task (through the loop's wakeup fd, whichever thread the signal lands on), so the
    # finally blocks stop every process this run started.
    task = asyncio.current_task()
    assert task is not None
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, task.cancel)
    binary = await asyncio.to_thread(ensure_peer_venv, args.peer_venv)
    trt = start("echo", "auto", True)  # not in a thread: a SIGTERM meanwhile cancels at the next await
    try:
        peer = start_peer(binary, children, work)
        results: dict[str, Any] = {"cores": os.cpu_count(), "load_avg_start": os.getloadavg()[0]}
        openai_trt = {"model": trt.router_model, "prompt": PROMPT, "max_tokens": MAX_TOKENS}
        openai_peer = {"model": PEER_MODEL, "prompt": PROMPT, "max_tokens": MAX_TOKENS}
        direct_trt = {"text_input": PROMPT, "max_tokens": MAX_TOKENS, "lora_task_id": trt.upstream_task_id}
        targets: dict[str, tuple[str, dict[str, Any]]] = {
            "trtfleet direct": (f"http://{trt.upstream_http}/v2/models/{trt.upstream_model}/generate", direct_trt),
            "trtfleet router": (f"http://{trt.router_http}/v1/completions", openai_trt),
            "vllm-router direct": (f"http://{peer.upstream}/v1/completions", openai_peer),
            "vllm-router router": (f"http://{peer.router}/v1/completions", openai_peer),
        }
        async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as session:
            calls = {name: http_call(session, url, body, False) for name, (url, body) in targets.items()}
            # The first call through trtfleet's router loads the adapter onto the echo upstream.
            await calls["trtfleet router"]()
            samples = await interleaved_latency(calls, args.requests, args.warmup)
            results["latency"] = {name: asdict(side(values)) for name, values in samples.items()}
            use_wrk = shutil.which("wrk") is not None and not args.no_wrk
            results["load_generator"] = "wrk" if use_wrk else "aiohttp client"
            pids = {"trtfleet router": trt.router_pid, "vllm-router router": peer.router_pid}
            results["throughput"] = {}
            for name, (url, body) in targets.items():
                cpu_before, started = (cpu_s(pids[name]) if name in pids else 0.0), time.perf_counter()
                if use_wrk:
                    rate = await asyncio.to_thread(wrk_throughput, url, body, args.concurrency, args.duration_s, work)
                else:
                    rate = await throughput(calls[name], args.concurrency, args.duration_s)
                row: dict[str, float] = {"rps": rate}
                if name in pids:
                    row["cpu_us_per_request"] = (
                        (cpu_s(pids[name]) - cpu_before) / (rate * (time.perf_counter() - started)) * 1e6
                    )
                results["throughput"][name] = row
            if use_wrk and args.wrk_rounds > 0:
                results["wrk_latency"] = await asyncio.to_thread(
                    wrk_latency, "wrk", targets, args.wrk_rounds, args.wrk_seconds, work
                )
        results["load_avg_end"] = os.getloadavg()[0]
        return results
    finally:
        trt.stop()


def summary(results: dict[str, Any]) -> dict[str, Any]:
    """Per router: direct, via router, added (p50/p99 ms), req/s both ways; and trtfleet / vllm-router added."""
    rows: dict[str, Any] = {}
    for router in ("trtfleet", "vllm-router"):
        direct = Side(**results["latency"][f"{router} direct"])
        routed = Side(**results["latency"][f"{router} router"])
        rows[router] = {
            "direct": direct,
            "router": routed,
            "added": added(direct, routed),
            "direct_rps": results["throughput"][f"{router} direct"]["rps"],
            "router_rps": results["throughput"][f"{router} router"]["rps"],
            "router_cpu_us": results["throughput"][f"{router} router"].get("cpu_us_per_request"),
        }
    trt, peer = rows["trtfleet"]["added"], rows["vllm-router"]["added"]
    rows["ratio_p50"] = ratio(trt.p50_ms, peer.p50_ms)
    rows["ratio_p99"] = ratio(trt.p99_ms, peer.p99_ms)
    if "wrk_latency" in results:
        for router in ("trtfleet", "vllm-router"):
            direct = Side(**results["wrk_latency"][f"{router} direct"])
            routed = Side(**results["wrk_latency"][f"{router} router"])
            rows[router]["wrk_added"] = added(direct, routed)
        trt, peer = rows["trtfleet"]["wrk_added"], rows["vllm-router"]["wrk_added"]
        rows["wrk_ratio_p50"] = ratio(trt.p50_ms, peer.p50_ms)
    return rows


def _fmt_ratio(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.1f}x"


def table(results: dict[str, Any]) -> str:
    rows = summary(results)
    lines = [
        f"cores: {results['cores']}, load average {results['load_avg_start']:.1f} -> {results['load_avg_end']:.1f}, "
        f"load generator: {results['load_generator']}",
        "",
        "| router | direct p50 / p99 ms | via router p50 / p99 ms | added p50 / p99 ms "
        "| req/s direct | req/s via router | router CPU us/request |",
        "|---|---|---|---|---|---|---|",
    ]
    for router in ("trtfleet", "vllm-router"):
        row = rows[router]
        d, r, a = row["direct"], row["router"], row["added"]
        cpu = "-" if row["router_cpu_us"] is None else f"{row['router_cpu_us']:.0f}"
        lines.append(
            f"| {router} | {d.p50_ms:.2f} / {d.p99_ms:.2f} | {r.p50_ms:.2f} / {r.p99_ms:.2f} "
            f"| {a.p50_ms:+.2f} / {a.p99_ms:+.2f} | {row['direct_rps']:.0f} | {row['router_rps']:.0f} | {cpu} |"
        )
    lines += [
        "",
        f"trtfleet added / vllm-router added: p50 {_fmt_ratio(rows['ratio_p50'])}, p99 {_fmt_ratio(rows['ratio_p99'])}",
    ]
    if "wrk_ratio_p50" in rows:
        trt, peer = rows["trtfleet"]["wrk_added"], rows["vllm-router"]["wrk_added"]
        lines.append(
            f"wrk, 1 connection: trtfleet added {trt.p50_ms:+.3f} / {trt.p99_ms:+.3f} ms (p50 / p99), vllm-router "
            f"{peer.p50_ms:+.3f} / {peer.p99_ms:+.3f} ms; p50 ratio {_fmt_ratio(rows['wrk_ratio_p50'])}"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.peer_overhead", description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=2000, help="sequential requests per target")
    parser.add_argument("--warmup", type=int, default=200, help="sequential warm-up requests per target")
    parser.add_argument("--concurrency", type=int, default=32)
    parser.add_argument("--duration-s", type=float, default=5.0, help="throughput run per target")
    parser.add_argument("--no-wrk", action="store_true", help="use the aiohttp load generator even if wrk exists")
    parser.add_argument("--wrk-rounds", type=int, default=3, help="wrk concurrency-1 latency runs per target (0: none)")
    parser.add_argument("--wrk-seconds", type=float, default=2.0, help="seconds per wrk latency run")
    parser.add_argument("--peer-venv", type=Path, default=REPO / ".cache" / "peer-venv")
    parser.add_argument("--json", type=Path, help="also write the raw results here")
    parser.add_argument("--serve-upstream", type=int, metavar="PORT", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.serve_upstream is not None:
        serve_upstream(args.serve_upstream)
        return 0
    children = Children()
    work = Path(tempfile.mkdtemp(prefix="trtfleet-bench-peer-"))
    started = time.monotonic()
    try:
        results = asyncio.run(measure(args, children, work))
    except asyncio.CancelledError:
        print("stopped by SIGTERM", file=sys.stderr)
        return 143
    finally:
        children.stop()
        shutil.rmtree(work, ignore_errors=True)
    results["wall_s"] = time.monotonic() - started
    print(table(results))
    print(f"\nwall time {results['wall_s']:.0f} s")
    if args.json:
        args.json.write_text(json.dumps(results, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
