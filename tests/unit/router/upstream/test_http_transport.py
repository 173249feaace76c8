"""The lean keep-alive HTTP/1.1 client of warm unary requests (upstream.http_transport)."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Awaitable, Callable

import pytest
from tritonclient.grpc import service_pb2
from trtfleet_router.liveview import PodEndpoint
from trtfleet_router.upstream.failures import UpstreamCallFailed
from trtfleet_router.upstream.http_client import dechunk, parse_head
from trtfleet_router.upstream.http_transport import HttpTransport
from trtfleet_router.upstream.payload import GenerateJson, TritonTensorPayload
from trtfleet_router.upstream.protocol import FailureKind, read_text
from trtfleet_router.upstream.transport import Attempt

Answer = Callable[[asyncio.StreamReader, asyncio.StreamWriter, int], Awaitable[bool]]
BODY = {"text_input": "hi", "max_tokens": 4}


def test_head_and_chunked_framing() -> None:
    status, start, length, chunked, keep = parse_head(b"HTTP/1.1 200 OK\r\nContent-Length: 12", 40)
    assert (status, start, length, chunked, keep) == (200, 40, 12, False, True)
    assert parse_head(b"HTTP/1.1 400 Bad\r\nConnection: close\r\nContent-Length: 0", 1)[4] is False
    assert parse_head(b"HTTP/1.0 200 OK", 1)[2:] == (None, False, False)  # ends with the connection
    assert parse_head(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked", 1)[2:4] == (None, True)
    with pytest.raises(ValueError):
        parse_head(b"SSH-2.0", 1)
    whole = bytearray(b"5\r\nhello\r\n6;x=1\r\n world\r\n0\r\n\r\n")
    assert dechunk(whole, 0) == (b"hello world", len(whole))
    for cut in range(len(whole)):
        assert dechunk(whole[:cut], 0) is None


async def _serve(answer: Answer) -> tuple[asyncio.Server, str, list[int]]:
    connections: list[int] = []

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        connections.append(len(connections))
        number = len(connections)
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                length = next(
                    int(line.split(b":")[1])
                    for line in head.split(b"\r\n")
                    if line.lower().startswith(b"content-length")
                )
                json.loads(await reader.readexactly(length))
                if not await answer(reader, writer, number):
                    break
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()

    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    return server, f"127.0.0.1:{port}", connections


def _attempt(address: str, timeout_s: float) -> Attempt:
    """A warm unary attempt of model ``m`` whose generate form is BODY."""
    payload = TritonTensorPayload(service_pb2.ModelInferRequest(model_name="m"), GenerateJson(BODY, stream=False))
    endpoint = PodEndpoint("p0", "unused:1", "uid", http_address=address)
    return Attempt(payload, endpoint, time.monotonic() + timeout_s, client_streaming=False)


async def _text(transport: HttpTransport, address: str) -> str:
    attempt = _attempt(address, 5)
    assert transport.carries(attempt)
    messages = [m async for m in transport.exchange(attempt)]
    assert len(messages) == 1
    text: str = read_text(messages[0].infer_response).text
    return text


def test_keep_alive_chunked_and_a_closed_idle_connection() -> None:
    async def answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, number: int) -> bool:
        if number == 1:  # content-length, then the pod drops the idle connection
            data = json.dumps({"text_output": "one"}).encode()
            writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n%s" % (len(data), data))
            await writer.drain()
            return False
        data = json.dumps({"text_output": "two"}).encode()
        writer.write(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n")
        writer.write(b"%x\r\n%s\r\n" % (len(data[:3]), data[:3]))
        await writer.drain()
        writer.write(b"%x\r\n%s\r\n0\r\n\r\n" % (len(data[3:]), data[3:]))
        await writer.drain()
        return True

    async def main() -> None:
        server, address, connections = await _serve(answer)
        transport = HttpTransport()
        try:
            assert await _text(transport, address) == "one"
            await asyncio.sleep(0.05)
            assert await _text(transport, address) == "two"  # the closed idle one was replaced
            assert await _text(transport, address) == "two"  # kept alive
            assert len(connections) == 2
            idle = transport._unary._idle[address]
            assert len(idle) == 1 and not idle[0].closed
            idle[0].idle_since -= 3600  # idled too long: the sweep closes and forgets it
            transport._unary._sweep()
            assert address not in transport._unary._idle
        finally:
            await transport.close()
            server.close()

    asyncio.run(main())


def test_errors_are_classified() -> None:
    async def answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, number: int) -> bool:
        if number == 1:
            data = json.dumps({"error": "Maximum queue size of 4 has been reached"}).encode()
            writer.write(b"HTTP/1.1 503 Unavailable\r\nContent-Length: %d\r\n\r\n%s" % (len(data), data))
            await writer.drain()
            return True
        if number == 2:
            writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\n{")  # cut off
            await writer.drain()
            return False
        await asyncio.sleep(5)  # never answers
        return False

    async def main() -> None:
        server, address, _ = await _serve(answer)
        transport = HttpTransport()
        try:
            with pytest.raises(UpstreamCallFailed) as full:
                await _text(transport, address)
            assert full.value.failure.kind is FailureKind.QUEUE_FULL
            transport._unary.close()  # the next request opens connection 2
            with pytest.raises(UpstreamCallFailed) as broken:
                await _text(transport, address)
            assert broken.value.failure.kind is FailureKind.POD_FAILED
            with pytest.raises(UpstreamCallFailed) as late:
                async for _ in transport.exchange(_attempt(address, 0.2)):
                    pass
            assert late.value.failure.kind is FailureKind.TIMEOUT
            with pytest.raises(UpstreamCallFailed) as refused:
                await _text(transport, "127.0.0.1:1")
            assert refused.value.failure.kind is FailureKind.POD_FAILED
        finally:
            await transport.close()
            server.close()

    asyncio.run(main())
