"""The parts of the overhead benchmarks' native-client runs that need no wrk or ghz binary: their output
parsers (on output captured from real runs on this machine), the protoset ghz reads, the alternating
runner, the interleaved Python-client latency, and the grpc.aio floor server."""

from __future__ import annotations

import asyncio
import itertools
from pathlib import Path

import grpc
import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer
from google.protobuf import descriptor_pb2, descriptor_pool
from tritonclient.grpc import service_pb2, service_pb2_grpc
from trtfleet_router.upstream.protocol import FINAL_RESPONSE_PARAM, read_text

from bench import grpc_floor, native_loadgen, overhead_calls, overhead_native

WRK_OUTPUT = """\
Running 2s test @ http://127.0.0.1:40139/v2/models/tensorrt_llm_bls/generate
  1 threads and 1 connections
  Thread Stats   Avg      Stdev     Max   +/- Stdev
    Latency   183.71us   76.11us   2.17ms   94.43%
    Req/Sec     5.36k   285.00     5.66k    81.82%
  Latency Distribution
     50%  166.00us
     75%  180.00us
     90%  206.00us
     99%    1.21ms
  10870 requests in 2.10s, 1.04MB read
Requests/sec:   5176.14
Transfer/sec:    507.95KB
"""

GHZ_REPORT = {
    "options": {"call": "inference.GRPCInferenceService/ModelInfer", "concurrency": 32},
    "count": 11449,
    "rps": 1907.64,
    "statusCodeDistribution": {"OK": 11417, "Canceled": 32},
    "errorDistribution": {"rpc error: code = Canceled desc = grpc: the client connection is closing": 32},
    "latencyDistribution": [
        {"percentage": 10, "latency": 12000000},
        {"percentage": 50, "latency": 16510000},
        {"percentage": 99, "latency": 31690000},
    ],
}


def test_parse_wrk_reads_percentiles_in_any_unit_and_the_rate() -> None:
    run = native_loadgen.parse_wrk(WRK_OUTPUT)
    assert run == native_loadgen.Run(p50_ms=0.166, p99_ms=1.21, rps=5176.14, requests=10870)


@pytest.mark.parametrize("error", ["  Non-2xx or 3xx responses: 12\n", "  Socket errors: connect 0, read 1\n"])
def test_parse_wrk_refuses_runs_with_errors(error: str) -> None:
    with pytest.raises(RuntimeError, match="wrk saw errors"):
        native_loadgen.parse_wrk(WRK_OUTPUT + error)


def test_parse_ghz_converts_nanoseconds_and_tolerates_streams_cut_at_the_end() -> None:
    run = native_loadgen.parse_ghz(GHZ_REPORT)
    assert run == native_loadgen.Run(p50_ms=16.51, p99_ms=31.69, rps=1907.64, requests=11449)


def test_parse_ghz_refuses_real_errors() -> None:
    report = {**GHZ_REPORT, "statusCodeDistribution": {"OK": 10, "Unimplemented": 500}}
    with pytest.raises(RuntimeError, match="Unimplemented"):
        native_loadgen.parse_ghz(report)


def test_protoset_describes_the_triton_service_ghz_calls(tmp_path: Path) -> None:
    path = native_loadgen.write_protoset(tmp_path / "triton.protoset")
    files = descriptor_pb2.FileDescriptorSet.FromString(path.read_bytes())
    pool = descriptor_pool.DescriptorPool()
    for proto in files.file:  # dependencies first, as a protoset must list them
        pool.Add(proto)
    service = pool.FindServiceByName(native_loadgen.GRPC_SERVICE)
    methods = {method.name: method for method in service.methods}
    assert methods["ModelInfer"].input_type.full_name == "inference.ModelInferRequest"
    assert methods["ModelStreamInfer"].output_type.full_name == "inference.ModelStreamInferResponse"


def test_alternating_runs_flip_the_order_every_round_and_keep_medians() -> None:
    order: list[str] = []
    rates = {"direct": itertools.count(100, 100), "router": itertools.count(10, 10)}

    def side(name: str) -> overhead_native.Side:
        def run(connections: int, duration_s: float) -> native_loadgen.Run:
            order.append(name)
            rate = float(next(rates[name]))
            return native_loadgen.Run(p50_ms=rate / 100, p99_ms=rate / 10, rps=rate, requests=10)

        return run, 1  # pid 1: its CPU time is readable and does not move during the test

    result = overhead_native._alternating({"direct": side("direct"), "router": side("router")}, 1, 0.1, 3)
    assert order == ["direct", "router", "router", "direct", "direct", "router"]
    assert result["direct"]["rps"] == 200.0 and result["router"]["rps"] == 20.0
    assert result["router"]["p50_ms"] == pytest.approx(0.2) and len(result["router"]["runs"]) == 3


def test_latency_pair_interleaves_the_two_sides() -> None:
    calls: list[str] = []

    def fake(name: str, seconds: float) -> overhead_calls.Call:
        async def call() -> tuple[float, float]:
            calls.append(name)
            return seconds, seconds

        return call

    direct, routed = asyncio.run(overhead_calls.latency_pair(fake("d", 0.001), fake("r", 0.003), 4))
    assert calls[40:] == ["d", "r", "r", "d", "d", "r", "r", "d"]  # after 20 warm-up pairs
    assert direct.p50_ms == pytest.approx(1.0) and routed.p50_ms == pytest.approx(3.0)


@pytest.mark.parametrize("proxied", [False, True], ids=["floor", "proxy-floor"])
def test_floor_server_answers_both_calls_with_the_official_stubs(proxied: bool) -> None:
    posted: list[dict[str, object]] = []

    async def generate(request: web.Request) -> web.Response:
        posted.append(await request.json())
        return web.json_response({"text_output": "x"})

    async def scenario() -> None:
        upstream = web.Application()
        upstream.router.add_post("/v2/models/m/generate", generate)
        async with TestServer(upstream) as pod:
            proxy_to = f"127.0.0.1:{pod.port}/v2/models/m/generate" if proxied else None
            server = grpc.aio.server()
            service_pb2_grpc.add_GRPCInferenceServiceServicer_to_server(grpc_floor.FloorServer(proxy_to), server)
            port = server.add_insecure_port("127.0.0.1:0")
            await server.start()
            try:
                async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
                    stub = service_pb2_grpc.GRPCInferenceServiceStub(channel)
                    request = service_pb2.ModelInferRequest(model_name="m", id="7")
                    unary = await stub.ModelInfer(request)
                    assert (unary.model_name, unary.id) == ("m", "7") and read_text(unary).text
                    stream = stub.ModelStreamInfer(iter([request]))
                    (message,) = [m async for m in stream]
                    assert message.infer_response.parameters[FINAL_RESPONSE_PARAM].bool_param
            finally:
                await server.stop(None)

    asyncio.run(scenario())
    assert posted == ([{"text_input": "hello world, how are you", "max_tokens": 32}] * 2 if proxied else [])


def test_blocking_client_times_keep_alive_requests_and_refuses_errors() -> None:
    seen: list[tuple[str, object]] = []

    async def answer(request: web.Request) -> web.Response:
        body = await request.json()
        seen.append((request.path, body))
        if body.get("fail"):
            return web.json_response({"error": "no"}, status=400)
        return web.json_response({"text_output": "x" * 100_000 if request.path == "/big" else "ok"})

    async def scenario() -> None:
        app = web.Application()
        app.router.add_post("/{tail:.*}", answer)
        async with TestServer(app) as server:
            base = f"http://127.0.0.1:{server.port}"
            direct, routed = await asyncio.to_thread(
                native_loadgen.blocking_latency_pair, (base + "/a", {"n": 1}), (base + "/big", {"n": 2}), 10, 2
            )
            assert direct.requests == routed.requests == 10 and 0 < direct.p50_ms <= direct.p99_ms
            client = native_loadgen.BlockingClient(base + "/a", {"fail": True})
            try:
                with pytest.raises(RuntimeError, match="400"):
                    await asyncio.to_thread(client.call)
            finally:
                client.close()

    asyncio.run(scenario())
    assert [path for path, _ in seen[:4]] == ["/a", "/big", "/big", "/a"]  # interleaved, order flipped
    assert len(seen) == 2 * 12 + 1
