"""The least a Python endpoint picker can cost: an ``ext_proc`` server that sends every request to one endpoint and
streams the bodies back unchanged (FULL_DUPLEX_STREAMED, both ways), deciding nothing.

``python -m bench.extproc_floor --port P --endpoint host:port [--wire]`` serves it on grpc.aio, or with ``--wire``
on the frames trtfleet's picker port reads itself (``trtfleet_router.epp.wire``). :mod:`bench.gateway` runs both
beside trtfleet's picker, so the table tells the protocol's cost in Python each way from what trtfleet's routing
adds on top.
"""

from __future__ import annotations

import argparse
import asyncio
from typing import Any

import grpc
from envoy.service.ext_proc.v3 import external_processor_pb2 as ext_proc
from envoy.service.ext_proc.v3 import external_processor_pb2_grpc as ext_proc_grpc
from trtfleet_router.epp import envoy
from trtfleet_router.epp.server import PROCESS
from trtfleet_router.epp.wire import Method, WireServer


class FixedPicker(ext_proc_grpc.ExternalProcessorServicer):  # type: ignore[misc]
    def __init__(self, endpoint: str) -> None:
        self.route = envoy.route_to([endpoint])

    async def Process(self, request_iterator: Any, context: Any) -> None:
        chunks: list[bytes] = []
        while True:
            message = await context.read()
            if message is grpc.aio.EOF:
                return
            kind = message.WhichOneof("request")
            if kind == "request_headers" and message.request_headers.end_of_stream:
                await context.write(self.route)
            elif kind == "request_body":
                chunks.append(message.request_body.body)
                if message.request_body.end_of_stream:
                    await context.write(self.route)
                    for answer in envoy.request_body(b"".join(chunks)):
                        await context.write(answer)
            elif kind == "response_headers":
                await context.write(envoy.RESPONSE_HEADERS_UNCHANGED)
            elif kind == "response_body":
                body = message.response_body
                await context.write(envoy.response_body(body.body, body.end_of_stream))
            elif kind == "response_trailers":
                await context.write(envoy.RESPONSE_TRAILERS_UNCHANGED)
            elif kind == "request_trailers":
                await context.write(ext_proc.ProcessingResponse(request_trailers=ext_proc.TrailersResponse()))


async def serve_wire(port: int, endpoint: str) -> None:
    picker = FixedPicker(endpoint)
    server = WireServer({PROCESS: Method(ext_proc.ProcessingRequest.FromString,
                                         lambda stream: picker.Process(None, stream))}, 64 << 20)
    await server.start("127.0.0.1", port)
    await asyncio.Event().wait()


async def serve(port: int, endpoint: str) -> None:
    server = grpc.aio.server()
    ext_proc_grpc.add_ExternalProcessorServicer_to_server(FixedPicker(endpoint), server)
    server.add_insecure_port(f"127.0.0.1:{port}")
    await server.start()
    await server.wait_for_termination()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--endpoint", required=True)
    parser.add_argument("--wire", action="store_true", help="serve on trtfleet's own HTTP/2 frames, not grpc.aio")
    args = parser.parse_args()
    asyncio.run((serve_wire if args.wire else serve)(args.port, args.endpoint))


if __name__ == "__main__":
    main()
