"""Router overhead: latency the router adds, and the requests/s one router process sustains.

``python -m bench.router_overhead [--upstream echo|reference] [--requests 400] [--concurrency 32]
[--duration-s 6] [--native-rounds 3] [--native-seconds 2] [--no-native] [--json PATH]``

Side by side in one run, same client code per protocol, everything on this machine:

* **direct**: the load generator calls the upstream itself (Triton's generate extension over HTTP,
  ``ModelStreamInfer`` over gRPC, ``lora_task_id`` of a warm adapter);
* **router**: the same requests through one ``trtfleet router`` process (OpenAI ``/v1/completions``,
  Triton ``/v2/models/{adapter}/generate``, gRPC ``ModelStreamInfer`` with the adapter's served name),
  with the full path: registry, API parsing, the ``trtfleet`` routing policy, fleet bookkeeping,
  weight store lookup, the upstream call (the pod's HTTP generate endpoint for a warm adapter, gRPC
  when weights travel), metrics.

Upstreams: ``echo`` (default) is :mod:`trtfleet_router.upstream.echo`, a minimal Triton-gRPC-compatible
server with no model (it isolates the router's own cost from model compute); ``reference`` is one real
tritonserver worker with the tiny reference model (base model requests; the model's compute dominates).

Latency (Python clients): ``--requests`` sequential requests per side (concurrency 1), the direct and
router sides interleaved request by request; p50/p99 of the total time and, for streams, of the time to
the first text (TTFT); "added" is router minus direct. Throughput: a closed loop of ``--concurrency``
clients for ``--duration-s``; HTTP load comes from ``wrk`` when installed (apt package ``wrk``; the table
says which), else from the aiohttp client; gRPC load from a grpc.aio client. The router process's CPU
time per request (from /proc) is printed too: it is what one router core costs per request,
independent of the other processes competing for this machine's cores.

Native clients (:mod:`bench.native_loadgen`; ``--no-native`` skips them): a Python client spends more CPU
per request than the router and shares the two cores with it, so the same cases also run from compiled
load generators, each side ``--native-rounds`` times for ``--native-seconds``, alternating: ``wrk`` with
one connection for the HTTP unary latency, and ``ghz`` (``make bench-tools``) for gRPC latency and
throughput, next to two floors from :mod:`bench.grpc_floor`: grpc.aio with the same stubs answering at
once, and the same after one HTTP generate call to the upstream (the least a grpc.aio front end that
forwards to a pod can cost).
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Awaitable, Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import grpc
import numpy as np
from tritonclient.grpc import service_pb2_grpc
from trtfleet_router.upstream.protocol import SamplingParams, UpstreamModelInfo, build_text_request, read_text

from bench import native_loadgen
from bench.native_loadgen import percentile

PROMPT = "hello world, how are you"
MAX_TOKENS = 32
ADAPTER = "bench-a"
TASK_ID = 1
ECHO_MODEL = "tensorrt_llm_bls"
CLOCK_TICKS_PER_S = os.sysconf("SC_CLK_TCK")


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def write_adapter(directory: Path) -> None:
    """A small converted adapter (fp16 [1, 8, 64] weights) with its manifest, as the converter writes."""
    directory.mkdir(parents=True, exist_ok=True)
    np.save(directory / "model.lora_weights.npy", np.ones((1, 8, 64), np.float16))
    np.save(directory / "model.lora_config.npy", np.array([[[1, i, 8] for i in range(8)]], np.int32))
    outputs = {
        name: {"sha256": hashlib.sha256((directory / name).read_bytes()).hexdigest(), "size_bytes": 0}
        for name in ("model.lora_weights.npy", "model.lora_config.npy")
    }
    (directory / "manifest.json").write_text(json.dumps({"outputs": outputs, "rank": 8, "weights_bytes": 1024}))


def wait_http(url: str, timeout_s: float = 90.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(url, timeout=1) as response:
                if response.status == 200:
                    return
        except OSError:
            time.sleep(0.1)
    raise RuntimeError(f"{url} not ready after {timeout_s} s")


def wait_port(port: int, timeout_s: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return
        except OSError:
            time.sleep(0.1)
    raise RuntimeError(f"nothing listens on port {port} after {timeout_s} s")


def cpu_s(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLOCK_TICKS_PER_S


@dataclass
class Processes:
    work: Path
    upstream_grpc: str
    upstream_http: str
    upstream_model: str
    upstream_task_id: int | None
    router_model: str
    router_http: str
    router_grpc: str
    router_pid: int
    upstream_pid: int  # the echo process, or tritonserver (not its Python backend stubs)
    children: list[subprocess.Popen[bytes]] = field(default_factory=list)
    reference_worker: Any = None

    def stop(self) -> None:
        for child in reversed(self.children):
            if child.poll() is None:
                child.send_signal(signal.SIGTERM)
                try:
                    child.wait(timeout=15)
                except subprocess.TimeoutExpired:
                    child.kill()
                    child.wait()
        if self.reference_worker is not None:
            self.reference_worker.__exit__(None, None, None)
        shutil.rmtree(self.work, ignore_errors=True)


def start(upstream: str, upstream_calls: str, upstream_http_on: bool) -> Processes:
    work = Path(tempfile.mkdtemp(prefix="trtfleet-bench-router-"))
    children: list[subprocess.Popen[bytes]] = []
    reference_worker = None
    python = sys.executable
    if upstream == "echo":
        grpc_port, http_port = free_port(), free_port()
        children.append(
            subprocess.Popen(
                [
                    python,
                    "-m",
                    "trtfleet_router.upstream.echo",
                    "--port",
                    str(grpc_port),
                    "--http-port",
                    str(http_port),
                    "--host-pages",
                    "64",
                ],
                stdout=subprocess.DEVNULL,
                stderr=(work / "echo.log").open("wb"),
            )
        )
        upstream_grpc, upstream_http, model = f"127.0.0.1:{grpc_port}", f"127.0.0.1:{http_port}", ECHO_MODEL
        upstream_pid = children[-1].pid
        wait_http(f"http://{upstream_http}/v2/health/ready")
        write_adapter(work / "adapter")
        adapter_args = ["--adapter", f"{ADAPTER}={TASK_ID}:{work / 'adapter'}"]
        router_model, task_id, architecture = ADAPTER, TASK_ID, "reference"
    else:
        from trtfleet_engines.reference.server import running_worker

        reference_worker = running_worker()  # the context manager itself: stop() exits it
        worker = reference_worker.__enter__()
        upstream_grpc, upstream_http, model = worker.grpc_url, worker.http_url, "tensorrt_llm_bls"
        upstream_pid = worker.pid
        upstream_http = upstream_http.removeprefix("http://")
        adapter_args, router_model, task_id, architecture = [], "bench", None, "reference"
    router_http, router_grpc, metrics = free_port(), free_port(), free_port()
    backend = f"{upstream_grpc}//{upstream_http.rsplit(':', 1)[1]}" if upstream_http_on else upstream_grpc
    command = [
        str(Path(python).parent / "trtfleet"), "router", "--host", "127.0.0.1", "--backend", backend,
        "--base-model", "bench", "--architecture", architecture, "--max-input-len", "256", "--max-seq-len", "512",
        *adapter_args, "--http-port", str(router_http), "--grpc-port", str(router_grpc),
        "--metrics-port", str(metrics), "--log-level", "WARNING", "--upstream-calls", upstream_calls,
    ]  # fmt: skip
    router = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=(work / "router.log").open("wb"))
    children.append(router)
    processes = Processes(
        work,
        upstream_grpc,
        upstream_http,
        model,
        task_id,
        router_model,
        f"127.0.0.1:{router_http}",
        f"127.0.0.1:{router_grpc}",
        router.pid,
        upstream_pid,
        children,
        reference_worker,
    )
    try:
        wait_http(f"http://127.0.0.1:{router_http}/v2/health/ready")
    except RuntimeError:
        processes.stop()
        raise
    return processes


# -- one request of each kind: returns (ttft_s, total_s) --------------------------------------------------

Call = Callable[[], Awaitable[tuple[float, float]]]


def http_call(session: aiohttp.ClientSession, url: str, body: dict[str, Any], stream: bool) -> Call:
    payload = json.dumps(body).encode()
    headers = {"Content-Type": "application/json"}

    async def call() -> tuple[float, float]:
        started = time.perf_counter()
        first = 0.0
        async with session.post(url, data=payload, headers=headers) as response:
            if response.status != 200:
                raise RuntimeError(f"{url}: {response.status} {await response.text()}")
            if not stream:
                await response.read()
                total = time.perf_counter() - started
                return total, total
            async for line in response.content:
                if not first and line.startswith(b"data:") and b"[DONE]" not in line:
                    first = time.perf_counter() - started
        return first, time.perf_counter() - started

    return call


def grpc_call(stub: Any, model: str, task_id: int | None, stream: bool) -> Call:
    info = UpstreamModelInfo(name=model)

    async def call() -> tuple[float, float]:
        request = build_text_request(
            info, PROMPT, SamplingParams(max_tokens=MAX_TOKENS), stream=stream, task_id=task_id, request_id="b"
        )
        request.parameters["triton_enable_empty_final_response"].bool_param = True
        started = time.perf_counter()
        first = 0.0
        rpc = stub.ModelStreamInfer()
        await rpc.write(request)
        await rpc.done_writing()
        async for message in rpc:
            if message.error_message:
                raise RuntimeError(message.error_message)
            response = message.infer_response
            if not first and response.outputs and read_text(response).text:
                first = time.perf_counter() - started
            if response.parameters["triton_final_response"].bool_param:
                break
        return first, time.perf_counter() - started

    return call


@dataclass
class Latency:
    p50_ms: float
    p99_ms: float
    ttft_p50_ms: float
    ttft_p99_ms: float


def _summary(samples: list[tuple[float, float]]) -> Latency:
    ttfts, totals = [s[0] for s in samples], [s[1] for s in samples]
    return Latency(percentile(totals, 0.5), percentile(totals, 0.99), percentile(ttfts, 0.5), percentile(ttfts, 0.99))


async def latency_pair(direct: Call, routed: Call, requests: int) -> tuple[Latency, Latency]:
    """``requests`` sequential calls of each side, interleaved (direct, router, router, direct, ...) so
    that both sides see the same machine: a load spike on this shared box lands on both."""
    for _ in range(20):
        await direct()
        await routed()
    direct_samples, routed_samples = [], []
    for index in range(requests):
        first, second = (direct, routed) if index % 2 == 0 else (routed, direct)
        a, b = await first(), await second()
        direct_samples.append(a if first is direct else b)
        routed_samples.append(b if first is direct else a)
    return _summary(direct_samples), _summary(routed_samples)


async def throughput(call: Call, concurrency: int, duration_s: float) -> float:
    done = 0
    deadline = time.perf_counter() + duration_s

    async def worker() -> None:
        nonlocal done
        while time.perf_counter() < deadline:
            await call()
            done += 1

    started = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(concurrency)))
    return done / (time.perf_counter() - started)


def wrk_throughput(url: str, body: dict[str, Any], concurrency: int, duration_s: float, work: Path) -> float:
    return native_loadgen.wrk_run("wrk", url, body, concurrency, duration_s, work).rps


async def run(args: argparse.Namespace) -> dict[str, Any]:
    procs = start(args.upstream, args.upstream_calls, not args.no_upstream_http)
    results: dict[str, Any] = {
        "upstream_http": not args.no_upstream_http,
        "upstream": args.upstream,
        "upstream_calls": args.upstream_calls,
        "latency": {},
        "throughput": {},
        "cores": os.cpu_count(),
        "load_avg_start": os.getloadavg()[0],
    }
    try:
        connector = aiohttp.TCPConnector(limit=0)
        async with aiohttp.ClientSession(connector=connector) as session:
            direct_channel = grpc.aio.insecure_channel(procs.upstream_grpc)
            router_channel = grpc.aio.insecure_channel(procs.router_grpc)
            direct_stub = service_pb2_grpc.GRPCInferenceServiceStub(direct_channel)
            router_stub = service_pb2_grpc.GRPCInferenceServiceStub(router_channel)
            generate = {"text_input": PROMPT, "max_tokens": MAX_TOKENS}
            direct_body = {**generate, **({"lora_task_id": procs.upstream_task_id} if procs.upstream_task_id else {})}
            openai_body = {"model": procs.router_model, "prompt": PROMPT, "max_tokens": MAX_TOKENS}
            d_url = f"http://{procs.upstream_http}/v2/models/{procs.upstream_model}"
            r_url = f"http://{procs.router_http}"
            cases: dict[str, tuple[Call, Call]] = {
                "HTTP unary: generate (direct) vs OpenAI /v1/completions": (
                    http_call(session, d_url + "/generate", direct_body, False),
                    http_call(session, r_url + "/v1/completions", openai_body, False),
                ),
                "HTTP unary: generate (direct) vs Triton generate": (
                    http_call(session, d_url + "/generate", direct_body, False),
                    http_call(session, f"{r_url}/v2/models/{procs.router_model}/generate", generate, False),
                ),
                "HTTP stream: generate_stream (direct) vs OpenAI SSE": (
                    http_call(session, d_url + "/generate_stream", {**direct_body, "stream": True}, True),
                    http_call(session, r_url + "/v1/completions", {**openai_body, "stream": True}, True),
                ),
                "gRPC unary: ModelStreamInfer": (
                    grpc_call(direct_stub, procs.upstream_model, procs.upstream_task_id, False),
                    grpc_call(router_stub, procs.router_model, None, False),
                ),
                "gRPC stream: ModelStreamInfer": (
                    grpc_call(direct_stub, procs.upstream_model, procs.upstream_task_id, True),
                    grpc_call(router_stub, procs.router_model, None, True),
                ),
            }
            await http_call(session, r_url + "/v1/completions", openai_body, False)()  # loads the adapter
            for name, (direct, routed) in cases.items():
                direct_latency, routed_latency = await latency_pair(direct, routed, args.requests)
                results["latency"][name] = {"direct": asdict(direct_latency), "router": asdict(routed_latency)}
            results["native"] = await native_runs(args, procs, d_url, r_url, direct_body, openai_body, generate)
            use_wrk = shutil.which("wrk") is not None and not args.no_wrk
            results["http_load_generator"] = "wrk (apt package)" if use_wrk else "aiohttp client"
            loads: dict[str, tuple[Any, Any]] = {
                "HTTP unary (direct generate vs router OpenAI completions)": (
                    (d_url + "/generate", direct_body, http_call(session, d_url + "/generate", direct_body, False)),
                    (
                        r_url + "/v1/completions",
                        openai_body,
                        http_call(session, r_url + "/v1/completions", openai_body, False),
                    ),
                ),
                "HTTP unary (direct generate vs router Triton generate)": (
                    (d_url + "/generate", direct_body, http_call(session, d_url + "/generate", direct_body, False)),
                    (
                        f"{r_url}/v2/models/{procs.router_model}/generate",
                        generate,
                        http_call(session, f"{r_url}/v2/models/{procs.router_model}/generate", generate, False),
                    ),
                ),
                "gRPC unary (ModelStreamInfer)": (
                    (None, None, grpc_call(direct_stub, procs.upstream_model, procs.upstream_task_id, False)),
                    (None, None, grpc_call(router_stub, procs.router_model, None, False)),
                ),
            }
            for name, ((d_target, d_body, d_call), (r_target, r_body, r_call)) in loads.items():
                row: dict[str, float] = {}
                for side, target, body, call in (
                    ("direct", d_target, d_body, d_call),
                    ("router", r_target, r_body, r_call),
                ):
                    cpu_before, count_started = cpu_s(procs.router_pid), time.perf_counter()
                    if target is not None and use_wrk:
                        rate = await asyncio.to_thread(
                            wrk_throughput, target, body, args.concurrency, args.duration_s, procs.work
                        )
                    else:
                        rate = await throughput(call, args.concurrency, args.duration_s)
                    elapsed = time.perf_counter() - count_started
                    row[f"{side}_rps"] = rate
                    if side == "router":
                        row["router_cpu_us_per_request"] = (
                            (cpu_s(procs.router_pid) - cpu_before) / (rate * elapsed) * 1e6
                        )
                results["throughput"][name] = row
            await direct_channel.close()
            await router_channel.close()
    finally:
        procs.stop()
    results["load_avg_end"] = os.getloadavg()[0]
    return results


def grpc_message(model: str, task_id: int | None) -> bytes:
    """One unary text request as ghz sends it (no ``triton_enable_empty_final_response``: one response each)."""
    request = build_text_request(
        UpstreamModelInfo(name=model), PROMPT, SamplingParams(max_tokens=MAX_TOKENS), stream=False, task_id=task_id,
        request_id="b",
    )  # fmt: skip
    return bytes(request.SerializeToString())


def _median(values: list[float]) -> float:
    ordered = sorted(values)
    return ordered[len(ordered) // 2]


Side = tuple[Callable[[int, float], native_loadgen.Run], int]  # a run of one side, the pid of its server


def _alternating(sides: dict[str, Side], connections: int, duration_s: float, rounds: int) -> dict[str, dict[str, Any]]:
    """Run every side ``rounds`` times, alternating the order per round; medians per side, plus the CPU
    per request of the server process each side calls (the router, the upstream, the floor)."""
    runs: dict[str, list[tuple[native_loadgen.Run, float]]] = {side: [] for side in sides}
    for index in range(rounds):
        for side in list(sides) if index % 2 == 0 else list(reversed(sides)):
            call, pid = sides[side]
            cpu_before = cpu_s(pid)
            run = call(connections, duration_s)
            runs[side].append((run, (cpu_s(pid) - cpu_before) / max(1, run.requests) * 1e6))
    return {
        side: {
            "p50_ms": _median([run.p50_ms for run, _ in side_runs]),
            "p99_ms": _median([run.p99_ms for run, _ in side_runs]),
            "rps": _median([run.rps for run, _ in side_runs]),
            "server_cpu_us_per_request": _median([cpu for _, cpu in side_runs]),
            "runs": [asdict(run) for run, _ in side_runs],
        }
        for side, side_runs in runs.items()
    }


async def native_runs(
    args: argparse.Namespace,
    procs: Processes,
    d_url: str,
    r_url: str,
    direct_body: dict[str, Any],
    openai_body: dict[str, Any],
    generate: dict[str, Any],
) -> dict[str, Any]:
    """Concurrency-1 latency with wrk (HTTP) and latency + throughput with ghz (gRPC), each side run
    ``--native-rounds`` times for ``--native-seconds``, alternating; gRPC also against
    :mod:`bench.grpc_floor` (grpc.aio doing nothing), the floor under the router's gRPC front end."""
    wrk, ghz = native_loadgen.find_wrk(), native_loadgen.find_ghz()
    out: dict[str, Any] = {
        "wrk": wrk, "ghz": ghz, "http_latency": {}, "blocking_latency": {}, "grpc_latency": {}, "grpc_throughput": {},
    }  # fmt: skip
    if args.no_native:
        out["wrk"] = out["ghz"] = None
        return out
    direct_http = (d_url + "/generate", direct_body)
    for name, routed_http in {
        "OpenAI /v1/completions": (r_url + "/v1/completions", openai_body),
        "Triton generate": (f"{r_url}/v2/models/{procs.router_model}/generate", generate),
    }.items():
        direct_run, routed_run = await asyncio.to_thread(
            native_loadgen.blocking_latency_pair, direct_http, routed_http, args.requests * 5
        )
        out["blocking_latency"][name] = {"direct": asdict(direct_run), "router": asdict(routed_run)}
    rounds, seconds, work = args.native_rounds, args.native_seconds, procs.work
    router_pid, upstream_pid = procs.router_pid, procs.upstream_pid
    if wrk is not None:

        def wrk_side(url: str, body: dict[str, Any], pid: int) -> Side:
            return (
                lambda connections, duration: native_loadgen.wrk_run(wrk, url, body, connections, duration, work),
                pid,
            )

        direct = wrk_side(d_url + "/generate", direct_body, upstream_pid)
        http_cases = {
            "OpenAI /v1/completions": wrk_side(r_url + "/v1/completions", openai_body, router_pid),
            "Triton generate": wrk_side(f"{r_url}/v2/models/{procs.router_model}/generate", generate, router_pid),
        }
        for name, routed in http_cases.items():
            sides = {"direct": direct, "router": routed}
            out["http_latency"][name] = await asyncio.to_thread(_alternating, sides, 1, seconds, rounds)
    if ghz is None:
        return out
    floor_port, proxy_port = free_port(), free_port()
    floors = [
        subprocess.Popen(
            [sys.executable, "-m", "bench.grpc_floor", "--port", str(port), *extra],
            cwd=Path(__file__).resolve().parent.parent,
            stdout=subprocess.DEVNULL,
            stderr=(work / f"floor-{port}.log").open("wb"),
        )
        for port, extra in (
            (floor_port, []),
            (proxy_port, ["--proxy-to", f"{procs.upstream_http}/v2/models/{procs.upstream_model}/generate"]),
        )
    ]
    try:
        wait_port(floor_port)
        wait_port(proxy_port)
        direct_msg = grpc_message(procs.upstream_model, procs.upstream_task_id)
        router_msg = grpc_message(procs.router_model, None)

        def ghz_side(target: str, method: str, message: bytes, pid: int) -> Side:
            return (
                lambda concurrency, duration: native_loadgen.ghz_run(
                    ghz, target, method, message, concurrency, duration, work
                ),
                pid,
            )

        floor_target, proxy_target = f"127.0.0.1:{floor_port}", f"127.0.0.1:{proxy_port}"
        floor_pid, proxy_pid = floors[0].pid, floors[1].pid
        grpc_cases: dict[str, dict[str, Side]] = {
            "ModelStreamInfer, one request per stream": {
                "direct": ghz_side(procs.upstream_grpc, "ModelStreamInfer", direct_msg, upstream_pid),
                "router": ghz_side(procs.router_grpc, "ModelStreamInfer", router_msg, router_pid),
                "floor": ghz_side(floor_target, "ModelStreamInfer", direct_msg, floor_pid),
                "proxy floor": ghz_side(proxy_target, "ModelStreamInfer", direct_msg, proxy_pid),
            },
            "ModelInfer (direct: ModelStreamInfer, the model is decoupled)": {
                "direct": ghz_side(procs.upstream_grpc, "ModelStreamInfer", direct_msg, upstream_pid),
                "router": ghz_side(procs.router_grpc, "ModelInfer", router_msg, router_pid),
                "floor": ghz_side(floor_target, "ModelInfer", direct_msg, floor_pid),
                "proxy floor": ghz_side(proxy_target, "ModelInfer", direct_msg, proxy_pid),
            },
        }
        for name, sides in grpc_cases.items():
            out["grpc_latency"][name] = await asyncio.to_thread(_alternating, sides, 1, seconds, rounds)
            out["grpc_throughput"][name] = await asyncio.to_thread(
                _alternating, sides, args.concurrency, args.duration_s, 1
            )
    finally:
        for floor in floors:
            floor.terminate()
            floor.wait(timeout=15)
    return out


def table(results: dict[str, Any]) -> str:
    lines = [
        f"upstream: {results['upstream']}, warm requests over HTTP: {results['upstream_http']}, "
        f"upstream gRPC calls: {results['upstream_calls']}, cores: {results['cores']}, "
        f"load average {results['load_avg_start']:.1f} -> {results['load_avg_end']:.1f}",
        "",
        "| latency (concurrency 1)                                | direct p50 / p99 ms | router p50 / p99 ms "
        "| added p50 / p99 ms | TTFT added p50 ms |",
        "|---|---|---|---|---|",
    ]
    for name, row in results["latency"].items():
        d, r = row["direct"], row["router"]
        ttft = f"{r['ttft_p50_ms'] - d['ttft_p50_ms']:+.2f}" if "stream" in name else "-"
        lines.append(
            f"| {name} | {d['p50_ms']:.2f} / {d['p99_ms']:.2f} | {r['p50_ms']:.2f} / {r['p99_ms']:.2f} "
            f"| {r['p50_ms'] - d['p50_ms']:+.2f} / {r['p99_ms'] - d['p99_ms']:+.2f} | {ttft} |"
        )
    lines += [
        "",
        f"HTTP load generator: {results.get('http_load_generator')}",
        "",
        "| throughput (closed loop)                  | direct req/s | router req/s | router CPU us/request |",
        "|---|---|---|---|",
    ]
    for name, row in results["throughput"].items():
        lines.append(
            f"| {name} | {row['direct_rps']:.0f} | {row['router_rps']:.0f} | {row['router_cpu_us_per_request']:.0f} |"
        )
    return "\n".join(lines + native_table(results.get("native") or {}))


def native_table(native: dict[str, Any]) -> list[str]:
    lines: list[str] = []
    if native.get("http_latency"):
        runs = len(next(iter(native["http_latency"].values()))["direct"]["runs"])
        lines += [
            "",
            f"wrk, 1 connection (median of {runs} alternating runs per side):",
            "",
            "| HTTP unary, concurrency 1 | direct p50 / p99 ms | router p50 / p99 ms | added p50 / p99 ms "
            "| router CPU us/request |",
            "|---|---|---|---|---|",
        ]
        for name, row in native["http_latency"].items():
            d, r = row["direct"], row["router"]
            lines.append(
                f"| generate (direct) vs {name} | {d['p50_ms']:.3f} / {d['p99_ms']:.3f} "
                f"| {r['p50_ms']:.3f} / {r['p99_ms']:.3f} | {r['p50_ms'] - d['p50_ms']:+.3f} / "
                f"{r['p99_ms'] - d['p99_ms']:+.3f} | {r['server_cpu_us_per_request']:.0f} |"
            )
    if native.get("blocking_latency"):
        lines += [
            "",
            "Blocking socket client (keep-alive, no event loop), direct and router interleaved:",
            "",
            "| HTTP unary, concurrency 1 | direct p50 / p99 ms | router p50 / p99 ms | added p50 / p99 ms |",
            "|---|---|---|---|",
        ]
        for name, row in native["blocking_latency"].items():
            d, r = row["direct"], row["router"]
            lines.append(
                f"| generate (direct) vs {name} | {d['p50_ms']:.3f} / {d['p99_ms']:.3f} "
                f"| {r['p50_ms']:.3f} / {r['p99_ms']:.3f} | {r['p50_ms'] - d['p50_ms']:+.3f} / "
                f"{r['p99_ms'] - d['p99_ms']:+.3f} |"
            )
    if native.get("grpc_latency"):
        lines += [
            "",
            "ghz, gRPC unary. floor: bench.grpc_floor, grpc.aio with the same stubs answering at once; proxy "
            "floor: the same, after one HTTP generate call to the upstream with the router's client:",
            "",
            "| gRPC, concurrency 1 | direct p50 ms | router p50 / p99 ms | added p50 ms | floor p50 ms "
            "| proxy floor p50 ms | router minus proxy floor p50 ms |",
            "|---|---|---|---|---|---|---|",
        ]
        for name, row in native["grpc_latency"].items():
            d, r, f, x = row["direct"], row["router"], row["floor"], row["proxy floor"]
            lines.append(
                f"| {name} | {d['p50_ms']:.3f} | {r['p50_ms']:.3f} / {r['p99_ms']:.3f} "
                f"| {r['p50_ms'] - d['p50_ms']:+.3f} | {f['p50_ms']:.3f} | {x['p50_ms']:.3f} "
                f"| {r['p50_ms'] - x['p50_ms']:+.3f} |"
            )
        lines += [
            "",
            "| gRPC, closed loop | direct req/s | router req/s | floor req/s | proxy floor req/s "
            "| CPU us/request: router / floor / proxy floor |",
            "|---|---|---|---|---|---|",
        ]
        for name, row in native["grpc_throughput"].items():
            d, r, f, x = row["direct"], row["router"], row["floor"], row["proxy floor"]
            lines.append(
                f"| {name} | {d['rps']:.0f} | {r['rps']:.0f} | {f['rps']:.0f} | {x['rps']:.0f} "
                f"| {r['server_cpu_us_per_request']:.0f} / {f['server_cpu_us_per_request']:.0f} / "
                f"{x['server_cpu_us_per_request']:.0f} |"
            )
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.router_overhead", description=__doc__.splitlines()[0])
    parser.add_argument("--upstream", choices=["echo", "reference"], default="echo")
    parser.add_argument("--upstream-calls", choices=["auto", "per-request", "multiplexed"], default="auto")
    parser.add_argument("--no-upstream-http", action="store_true", help="router: warm requests over gRPC too")
    parser.add_argument("--requests", type=int, default=400, help="sequential requests per latency case")
    parser.add_argument("--concurrency", type=int, default=32)
    parser.add_argument("--duration-s", type=float, default=6.0)
    parser.add_argument("--no-wrk", action="store_true", help="use the aiohttp load generator even if wrk exists")
    parser.add_argument("--no-native", action="store_true", help="skip the wrk/ghz latency and gRPC runs")
    parser.add_argument("--native-rounds", type=int, default=3, help="alternating runs per side (wrk/ghz)")
    parser.add_argument("--native-seconds", type=float, default=2.0, help="seconds per wrk/ghz latency run")
    parser.add_argument("--json", type=Path, help="also write the raw results here")
    args = parser.parse_args(argv)
    results = asyncio.run(run(args))
    print(table(results))
    if args.json:
        args.json.write_text(json.dumps(results, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
