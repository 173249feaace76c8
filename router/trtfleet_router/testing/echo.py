"""A minimal Triton-gRPC-compatible echo upstream: no model, the real LoRA cache contract.

For benchmarks that isolate the router's own overhead from model compute, and for fast tests of the
upstream path. It serves one text-level model (``tensorrt_llm_bls`` by default) with the BLS inputs
the router uses, over gRPC only, and keeps a real :class:`~trtfleet.loracache.LoraPageCache`:
weights for an unknown ``lora_task_id`` are stored (``Cache is full ...`` when nothing idle can be
evicted), an id-only request for an id it does not hold fails with TRT-LLM's exact miss text.

The answer is ``text_input`` itself, prefixed ``[<task id>] `` for an adapter, cut to ``max_tokens``
characters; with ``stream`` it arrives in pieces of ``chunk_chars`` characters, ``chunk_delay_s``
apart. Run it alone with ``python -m trtfleet_router.testing.echo --port 8001 [--http-port 8000]`` (the
HTTP side serves Triton's generate extension, for direct-vs-router comparisons over HTTP).
"""

from __future__ import annotations

import argparse
import asyncio
import json
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import grpc
from aiohttp import web
from tritonclient.grpc import model_config_pb2, service_pb2, service_pb2_grpc

from trtfleet.loracache import FULL_TEXT, MISS_TEXT, LoraCacheError, LoraPageCache
from trtfleet_router.upstream.protocol import EMPTY_FINAL_PARAM, FINAL_RESPONSE_PARAM
from trtfleet_router.upstream.tensors import decode_bytes, encode_bytes

_INPUTS = (
    ("text_input", model_config_pb2.TYPE_STRING, [1], False),
    ("max_tokens", model_config_pb2.TYPE_INT32, [1], False),
    ("stream", model_config_pb2.TYPE_BOOL, [1], True),
    ("temperature", model_config_pb2.TYPE_FP32, [1], True),
    ("top_p", model_config_pb2.TYPE_FP32, [1], True),
    ("top_k", model_config_pb2.TYPE_INT32, [1], True),
    ("seed", model_config_pb2.TYPE_UINT64, [1], True),
    ("stop_words", model_config_pb2.TYPE_STRING, [-1], True),
    ("exclude_input_in_output", model_config_pb2.TYPE_BOOL, [1], True),
    ("lora_task_id", model_config_pb2.TYPE_UINT64, [1], True),
    ("lora_weights", model_config_pb2.TYPE_FP16, [-1, -1], True),
    ("lora_config", model_config_pb2.TYPE_INT32, [-1, 3], True),
)


def echo_model_config(name: str) -> model_config_pb2.ModelConfig:
    config = model_config_pb2.ModelConfig(name=name, backend="python", max_batch_size=8)
    for input_name, data_type, dims, optional in _INPUTS:
        config.input.add(name=input_name, data_type=data_type, dims=dims, optional=optional)
    config.output.add(name="text_output", data_type=model_config_pb2.TYPE_STRING, dims=[-1])
    config.model_transaction_policy.decoupled = True
    return config


@dataclass
class EchoStats:
    requests: int = 0
    weights_received: int = 0
    misses: int = 0
    task_ids_seen: list[int] = field(default_factory=list)


class EchoUpstream(service_pb2_grpc.GRPCInferenceServiceServicer):  # type: ignore[misc]
    def __init__(
        self,
        *,
        model_name: str = "tensorrt_llm_bls",
        host_pages: int = 4,
        pages_per_adapter: int = 1,
        chunk_chars: int = 4,
        chunk_delay_s: float = 0.0,
    ) -> None:
        self.model_name = model_name
        self.config = echo_model_config(model_name)
        self.cache = LoraPageCache(host_pages, host_pages)
        self.pages_per_adapter = pages_per_adapter
        self.chunk_chars = chunk_chars
        self.chunk_delay_s = chunk_delay_s
        self.stats = EchoStats()
        self.fail_with: str | None = None  # tests: answer every request with this error text
        self._thawed = asyncio.Event()  # tests: cleared while the upstream plays a frozen (SIGSTOPped) pod
        self._thawed.set()

    def freeze(self) -> None:
        """Answer nothing (no piece, no readiness) until :meth:`thaw`, like a pod under SIGSTOP."""
        self._thawed.clear()

    def thaw(self) -> None:
        self._thawed.set()

    async def ServerLive(self, request: Any, context: Any) -> service_pb2.ServerLiveResponse:
        return service_pb2.ServerLiveResponse(live=True)

    async def ServerReady(self, request: Any, context: Any) -> service_pb2.ServerReadyResponse:
        return service_pb2.ServerReadyResponse(ready=True)

    async def ModelReady(self, request: Any, context: Any) -> service_pb2.ModelReadyResponse:
        await self._thawed.wait()
        return service_pb2.ModelReadyResponse(ready=request.name == self.model_name)

    async def ModelConfig(self, request: Any, context: Any) -> service_pb2.ModelConfigResponse:
        if request.name != self.model_name:
            await context.abort(grpc.StatusCode.NOT_FOUND, f"Request for unknown model: '{request.name}'")
        return service_pb2.ModelConfigResponse(config=self.config)

    async def ModelMetadata(self, request: Any, context: Any) -> service_pb2.ModelMetadataResponse:
        if request.name != self.model_name:
            await context.abort(grpc.StatusCode.NOT_FOUND, f"Request for unknown model: '{request.name}'")
        metadata = service_pb2.ModelMetadataResponse(name=self.model_name, versions=["1"], platform="python")
        for tensor in self.config.input:
            datatype = model_config_pb2.DataType.Name(tensor.data_type).removeprefix("TYPE_")
            metadata.inputs.add(
                name=tensor.name,
                datatype="BYTES" if datatype == "STRING" else datatype,
                shape=[-1, *tensor.dims],
            )
        metadata.outputs.add(name="text_output", datatype="BYTES", shape=[-1, -1])
        return metadata

    async def ModelStreamInfer(
        self, request_iterator: AsyncIterator[service_pb2.ModelInferRequest], context: Any
    ) -> AsyncIterator[service_pb2.ModelStreamInferResponse]:
        """Requests of one stream run concurrently, as Triton runs them; answers interleave."""
        queue: asyncio.Queue[service_pb2.ModelStreamInferResponse | None] = asyncio.Queue()
        tasks: set[asyncio.Task[None]] = set()

        async def answer(request: service_pb2.ModelInferRequest) -> None:
            async for response in self._answer(request):
                queue.put_nowait(response)

        async def read() -> None:
            async for request in request_iterator:
                task = asyncio.create_task(answer(request))
                tasks.add(task)
                task.add_done_callback(tasks.discard)
            while tasks:
                await asyncio.gather(*list(tasks), return_exceptions=True)
            queue.put_nowait(None)

        reader = asyncio.create_task(read())
        try:
            while (item := await queue.get()) is not None:
                yield item
        finally:
            reader.cancel()
            for task in list(tasks):
                task.cancel()

    async def _answer(
        self, request: service_pb2.ModelInferRequest
    ) -> AsyncIterator[service_pb2.ModelStreamInferResponse]:
        values = dict(zip((t.name for t in request.inputs), request.raw_input_contents, strict=True))
        text = b"".join(decode_bytes(values.get("text_input", b""))).decode("utf-8", errors="replace")
        max_tokens = int.from_bytes(values.get("max_tokens", b"\x10\x00\x00\x00")[:4], "little", signed=True)
        stream = values.get("stream", b"\x00")[:1] == b"\x01"
        empty_final = EMPTY_FINAL_PARAM in request.parameters and request.parameters[EMPTY_FINAL_PARAM].bool_param
        outcome = self.respond(text, max_tokens, stream, _task_id(values), "lora_weights" in values)
        if isinstance(outcome, str):
            yield service_pb2.ModelStreamInferResponse(
                error_message=outcome, infer_response=service_pb2.ModelInferResponse(id=request.id)
            )
            return
        # Like TRT-LLM's BLS: a whole answer is one response flagged final; streamed pieces are followed by
        # an empty final response when the client asked for one.
        empty_final = empty_final and stream
        for index, piece in enumerate(outcome):
            if index and self.chunk_delay_s:
                await asyncio.sleep(self.chunk_delay_s)
            await self._thawed.wait()
            yield self._response(request, piece, final=index == len(outcome) - 1 and not empty_final)
        if empty_final:
            final = service_pb2.ModelInferResponse(model_name=self.model_name, model_version="1", id=request.id)
            final.parameters[FINAL_RESPONSE_PARAM].bool_param = True
            yield service_pb2.ModelStreamInferResponse(infer_response=final)

    def respond(
        self, text: str, max_tokens: int, stream: bool, task_id: int | None, has_weights: bool
    ) -> list[str] | str:
        """The answer's pieces, or an error text (the cache contract decides)."""
        self.stats.requests += 1
        error = self.fail_with or self._admit(task_id, has_weights)
        if error is not None:
            return error
        answer = ((f"[{task_id}] " if task_id is not None else "") + text)[: max(0, max_tokens)]
        if not stream:
            return [answer]
        return [answer[i : i + self.chunk_chars] for i in range(0, len(answer), self.chunk_chars)] or [""]

    def _admit(self, task_id: int | None, has_weights: bool) -> str | None:
        if task_id is None:
            return None
        self.stats.task_ids_seen.append(task_id)
        if has_weights:
            self.stats.weights_received += 1
            try:
                self.cache.put(task_id, self.pages_per_adapter)
            except LoraCacheError:
                return FULL_TEXT
        if task_id not in self.cache:
            self.stats.misses += 1
            return "Executor failed process requestId 1 due to the following error: " + MISS_TEXT.format(
                task_id=task_id
            )
        self.cache.acquire(task_id)
        self.cache.release(task_id)
        return None

    def _response(
        self, request: service_pb2.ModelInferRequest, text: str, *, final: bool
    ) -> service_pb2.ModelStreamInferResponse:
        response = service_pb2.ModelInferResponse(model_name=self.model_name, model_version="1", id=request.id)
        response.outputs.add(name="text_output", datatype="BYTES", shape=[1, 1])
        response.raw_output_contents.append(encode_bytes((text.encode("utf-8"),)))
        response.parameters[FINAL_RESPONSE_PARAM].bool_param = final
        return service_pb2.ModelStreamInferResponse(infer_response=response)


def _task_id(values: dict[str, bytes]) -> int | None:
    raw = values.get("lora_task_id")
    return int.from_bytes(raw[:8], "little") if raw else None


async def serve_echo(upstream: EchoUpstream, host: str = "127.0.0.1", port: int = 0) -> tuple[grpc.aio.Server, int]:
    """Start a grpc.aio server for ``upstream``; returns it and its bound port."""
    server = grpc.aio.server(options=[("grpc.max_receive_message_length", -1)])
    service_pb2_grpc.add_GRPCInferenceServiceServicer_to_server(upstream, server)
    bound = server.add_insecure_port(f"{host}:{port}")
    await server.start()
    return server, bound


def echo_http_app(upstream: EchoUpstream) -> web.Application:
    """Triton's generate extension for the echo model (``/v2/models/{m}/generate`` and
    ``/generate_stream``), so benchmarks can call the upstream directly over HTTP too."""

    async def generate(request: web.Request) -> web.StreamResponse:
        body = await request.json()
        task_id = body.get("lora_task_id")
        outcome = upstream.respond(
            str(body.get("text_input", "")),
            int(body.get("max_tokens", 16)),
            bool(body.get("stream", False)),
            int(task_id) if task_id is not None else None,
            False,
        )
        streaming = request.path.endswith("_stream")
        if isinstance(outcome, str):
            return web.json_response({"error": outcome}, status=500)
        if not streaming:
            await upstream._thawed.wait()
            return web.json_response(
                {"model_name": upstream.model_name, "model_version": "1", "text_output": "".join(outcome)}
            )
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        for index, piece in enumerate(outcome):
            if index and upstream.chunk_delay_s:
                await asyncio.sleep(upstream.chunk_delay_s)
            await upstream._thawed.wait()
            event = json.dumps({"model_name": upstream.model_name, "model_version": "1", "text_output": piece})
            await response.write(b"data: " + event.encode() + b"\n\n")
        await response.write_eof()
        return response

    async def ready(request: web.Request) -> web.Response:
        return web.Response(status=200)

    app = web.Application()
    app.add_routes(
        [
            web.post("/v2/models/{model}/generate", generate),
            web.post("/v2/models/{model}/generate_stream", generate),
            web.get("/v2/health/ready", ready),
        ]
    )
    return app


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8001, help="gRPC port (0: any free port, printed)")
    parser.add_argument("--http-port", type=int, help="also serve Triton's generate extension over HTTP (0: any)")
    parser.add_argument("--host-pages", type=int, default=64)
    parser.add_argument("--chunk-chars", type=int, default=4)
    parser.add_argument("--chunk-delay-s", type=float, default=0.0, help="pause between streamed pieces")
    args = parser.parse_args()

    async def run() -> None:
        upstream = EchoUpstream(
            host_pages=args.host_pages, chunk_chars=args.chunk_chars, chunk_delay_s=args.chunk_delay_s
        )
        server, port = await serve_echo(upstream, args.host, args.port)
        http_port = None
        if args.http_port is not None:
            runner = web.AppRunner(echo_http_app(upstream), access_log=None)
            await runner.setup()
            site = web.TCPSite(runner, args.host, args.http_port)
            await site.start()
            sockets = getattr(site._server, "sockets", None) or []
            http_port = int(sockets[0].getsockname()[1]) if sockets else args.http_port
        print(f"echo upstream on {args.host}:{port} (http {http_port})", flush=True)  # the bound ports (0: any)
        await server.wait_for_termination()

    asyncio.run(run())


if __name__ == "__main__":
    main()
