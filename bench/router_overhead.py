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

Upstreams: ``echo`` (default) is :mod:`trtfleet_router.testing.echo`, a minimal Triton-gRPC-compatible
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
import json
import os
import shutil
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

import aiohttp
import grpc
from tritonclient.grpc import service_pb2_grpc

from bench import native_loadgen, overhead_native
from bench.native_loadgen import cpu_s
from bench.overhead_calls import MAX_TOKENS, PROMPT, Call, grpc_call, http_call, latency_pair, throughput
from bench.overhead_processes import start


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
            results["native"] = await overhead_native.native_runs(
                args, procs, d_url, r_url, direct_body, openai_body, generate
            )
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
    return "\n".join(lines + overhead_native.native_table(results.get("native") or {}))


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
