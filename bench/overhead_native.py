"""The compiled-client half of :mod:`bench.router_overhead`: concurrency-1 latency from wrk and from a
blocking socket client (HTTP), latency and throughput from ghz (gRPC), each side run a few times in
alternating order, and the gRPC floors of :mod:`bench.grpc_floor` measured beside the router. See
:mod:`bench.native_loadgen` for the clients and why they are here.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import subprocess
import sys
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path
from typing import Any

from trtfleet_router.upstream.protocol import SamplingParams, UpstreamModelInfo, build_text_request

from bench import native_loadgen
from bench.native_loadgen import cpu_s, free_port, wait_port
from bench.overhead_processes import Processes


def grpc_message(model: str, task_id: int | None, prompt: str, max_tokens: int) -> bytes:
    """One unary text request as ghz sends it (no ``triton_enable_empty_final_response``: one response each)."""
    request = build_text_request(
        UpstreamModelInfo(name=model), prompt, SamplingParams(max_tokens=max_tokens), stream=False, task_id=task_id,
        request_id="b",
    )  # fmt: skip
    return bytes(request.SerializeToString())


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
            "p50_ms": statistics.median([run.p50_ms for run, _ in side_runs]),
            "p99_ms": statistics.median([run.p99_ms for run, _ in side_runs]),
            "rps": statistics.median([run.rps for run, _ in side_runs]),
            "server_cpu_us_per_request": statistics.median([cpu for _, cpu in side_runs]),
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
    """Concurrency-1 HTTP latency from the blocking socket client (``5 * --requests`` per side,
    interleaved) and from wrk, and gRPC latency + throughput from ghz, the wrk/ghz sides run
    ``--native-rounds`` times for ``--native-seconds`` in alternating order; gRPC also against the two
    floors of :mod:`bench.grpc_floor`. A missing wrk or ghz skips its rows."""
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
        prompt, max_tokens = generate["text_input"], generate["max_tokens"]
        direct_msg = grpc_message(procs.upstream_model, procs.upstream_task_id, prompt, max_tokens)
        router_msg = grpc_message(procs.router_model, None, prompt, max_tokens)

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


def native_table(native: dict[str, Any]) -> list[str]:
    lines: list[str] = []
    http = [("wrk", native.get("http_latency") or {}), ("blocking socket", native.get("blocking_latency") or {})]
    if any(rows for _, rows in http):
        lines += [
            "",
            "HTTP unary at concurrency 1: wrk with one connection (median of alternating runs per side) and a "
            "blocking socket client (keep-alive, no event loop; direct and router interleaved):",
            "",
            "| HTTP unary, concurrency 1 | client | direct p50 / p99 ms | router p50 / p99 ms | added p50 / p99 ms "
            "| router CPU us/request |",
            "|---|---|---|---|---|---|",
        ]
        for client, rows in http:
            for name, row in rows.items():
                d, r = row["direct"], row["router"]
                cpu = f"{r['server_cpu_us_per_request']:.0f}" if "server_cpu_us_per_request" in r else "-"
                lines.append(
                    f"| generate (direct) vs {name} | {client} | {d['p50_ms']:.3f} / {d['p99_ms']:.3f} "
                    f"| {r['p50_ms']:.3f} / {r['p99_ms']:.3f} | {r['p50_ms'] - d['p50_ms']:+.3f} / "
                    f"{r['p99_ms'] - d['p99_ms']:+.3f} | {cpu} |"
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
