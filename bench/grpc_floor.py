"""Floors for the router's gRPC front end: what grpc.aio itself costs, measured beside the router.

``python -m bench.grpc_floor --port N [--proxy-to HOST:PORT/PATH]`` serves ``ModelInfer`` and
``ModelStreamInfer`` with the same official stubs as the router's gRPC front end and answers every
request with a fixed one-output response: no parsing, no routing. Without ``--proxy-to`` it answers at
once (grpc.aio's own per-request cost). With it, each request first makes one HTTP POST of a fixed
generate body to that upstream with the router's own keep-alive client and waits for the answer: the
least any grpc.aio front end that forwards to a pod can do.
"""

from __future__ import annotations

import argparse
import asyncio
import time
from collections.abc import AsyncIterator
from typing import Any

import grpc
from tritonclient.grpc import service_pb2, service_pb2_grpc
from trtfleet_router.upstream.http_client import UnaryClient
from trtfleet_router.upstream.protocol import FINAL_RESPONSE_PARAM
from trtfleet_router.upstream.tensors import encode_bytes


def _answer(request: service_pb2.ModelInferRequest) -> service_pb2.ModelInferResponse:
    response = service_pb2.ModelInferResponse(model_name=request.model_name, model_version="1", id=request.id)
    response.outputs.add(name="text_output", datatype="BYTES", shape=[1, 1])
    response.raw_output_contents.append(encode_bytes((b"hello world, how are you",)))
    return response


class FloorServer(service_pb2_grpc.GRPCInferenceServiceServicer):  # type: ignore[misc]
    def __init__(self, proxy_to: str | None = None) -> None:
        self.client = UnaryClient()
        self.upstream, self.post = None, b""
        if proxy_to is not None:
            address, _, path = proxy_to.partition("/")
            body = b'{"text_input": "hello world, how are you", "max_tokens": 32}'
            self.upstream = address
            self.post = (
                f"POST /{path} HTTP/1.1\r\nHost: {address}\r\nContent-Type: application/json\r\n"
                f"Content-Length: {len(body)}\r\n\r\n"
            ).encode() + body

    async def _forward(self) -> None:
        if self.upstream is not None:
            status, _ = await self.client.post(self.upstream, self.post, time.monotonic() + 10.0)
            if status != 200:
                raise RuntimeError(f"upstream answered {status}")

    async def ModelInfer(self, request: service_pb2.ModelInferRequest, context: Any) -> service_pb2.ModelInferResponse:
        await self._forward()
        return _answer(request)

    async def ModelStreamInfer(
        self, request_iterator: AsyncIterator[service_pb2.ModelInferRequest], context: Any
    ) -> AsyncIterator[service_pb2.ModelStreamInferResponse]:
        async for request in request_iterator:
            await self._forward()
            response = _answer(request)
            response.parameters[FINAL_RESPONSE_PARAM].bool_param = True
            yield service_pb2.ModelStreamInferResponse(infer_response=response)


async def serve(port: int, proxy_to: str | None) -> None:
    server = grpc.aio.server(options=[("grpc.max_receive_message_length", 64 << 20)])
    service_pb2_grpc.add_GRPCInferenceServiceServicer_to_server(FloorServer(proxy_to), server)
    server.add_insecure_port(f"127.0.0.1:{port}")
    await server.start()
    await server.wait_for_termination()


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.grpc_floor", description=__doc__.splitlines()[0])
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--proxy-to", help="HOST:PORT/PATH of a Triton generate endpoint to call per request")
    args = parser.parse_args()
    asyncio.run(serve(args.port, args.proxy_to))


if __name__ == "__main__":
    main()
