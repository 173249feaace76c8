"""A lean keep-alive HTTP/1.1 client for unary upstream requests (all on the event loop).

aiohttp's client costs about 200 us of CPU per small POST on the project's 2-core machine (request and
response objects, header multidicts, timers, stream readers); one warm unary generate needs none of
that: one pre-encoded request head, a Content-Length or chunked JSON answer. This client costs about
50 us. Streams (SSE) stay on aiohttp.
"""

from __future__ import annotations

import asyncio
import time
from typing import Final

_MAX_HEAD_BYTES: Final = 64 * 1024
_IDLE_KEEP_S: Final = 30.0
_MAX_IDLE_PER_ADDRESS: Final = 256
_SWEEP_EVERY: Final = 1024


class Closed(ConnectionResetError):
    """The pod closed the connection before the whole answer arrived."""


class _Connection(asyncio.Protocol):
    """One HTTP/1.1 connection to a pod, one request at a time."""

    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self.closed = False
        self.idle_since = 0.0
        self.received = False  # a byte of the current answer arrived
        self._buffer = bytearray()
        self._waiter: asyncio.Future[tuple[int, bytes]] | None = None
        self._head: tuple[int, int, int | None, bool, bool] | None = None  # status, body start, length, chunked, keep
        self.reusable = False

    # protocol callbacks
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            head = self._head
            if head is not None and head[2] is None and not head[3]:  # body delimited by the end of the connection
                waiter.set_result((head[0], bytes(self._buffer[head[1] :])))
            else:
                waiter.set_exception(exc if exc is not None else Closed("the pod closed the connection"))

    def data_received(self, data: bytes) -> None:
        self.received = True
        self._buffer += data
        waiter = self._waiter
        if waiter is None or waiter.done():
            return
        try:
            answer = self._complete()
        except ValueError as exc:
            waiter.set_exception(exc)
            return
        if answer is not None:
            waiter.set_result(answer)

    def eof_received(self) -> bool:
        return False  # close; connection_lost settles the waiter

    # one exchange
    async def request(self, data: bytes, deadline_s: float) -> tuple[int, bytes]:
        """The answer to ``data``; ``TimeoutError`` when none is complete by ``deadline_s``
        (``time.monotonic``). One timer handle per exchange: ``asyncio.timeout`` costs several
        times more per request (task cancellation and uncancel bookkeeping)."""
        if self.closed or self.transport is None:
            raise Closed("the pod closed the connection")
        self.received = False
        self.reusable = False
        self._head = None
        self._buffer.clear()
        loop = asyncio.get_running_loop()
        waiter: asyncio.Future[tuple[int, bytes]] = loop.create_future()
        self._waiter = waiter
        timer = loop.call_later(deadline_s - time.monotonic(), _expire, waiter)
        self.transport.write(data)
        try:
            return await waiter
        finally:
            timer.cancel()
            self._waiter = None

    def close(self) -> None:
        self.closed = True
        if self.transport is not None:
            self.transport.abort()

    def _complete(self) -> tuple[int, bytes] | None:
        buffer = self._buffer
        head = self._head
        if head is None:
            end = buffer.find(b"\r\n\r\n")
            if end < 0:
                if len(buffer) > _MAX_HEAD_BYTES:
                    raise ValueError("the answer's header is too large")
                return None
            head = self._head = parse_head(bytes(buffer[:end]), end + 4)
        status, start, length, chunked, keep = head
        if length is not None:
            if len(buffer) < start + length:
                return None
            body = bytes(buffer[start : start + length])
            self.reusable = keep and len(buffer) == start + length
            return status, body
        if chunked:
            decoded = dechunk(buffer, start)
            if decoded is None:
                return None
            body, used = decoded
            self.reusable = keep and used == len(buffer)
            return status, body
        return None  # read until the pod closes the connection


def _expire(waiter: asyncio.Future[tuple[int, bytes]]) -> None:
    if not waiter.done():
        waiter.set_exception(TimeoutError("no complete answer before the deadline"))


def parse_head(head: bytes, body_start: int) -> tuple[int, int, int | None, bool, bool]:
    lines = head.split(b"\r\n")
    parts = lines[0].split(b" ", 2)
    if len(parts) < 2 or not parts[0].startswith(b"HTTP/1."):
        raise ValueError(f"not an HTTP answer: {lines[0][:100]!r}")
    status = int(parts[1])
    length: int | None = None
    chunked = False
    keep = parts[0] == b"HTTP/1.1"
    for line in lines[1:]:
        name, _, value = line.partition(b":")
        name = name.strip().lower()
        if name == b"content-length":
            length = int(value)
        elif name == b"transfer-encoding":
            chunked = b"chunked" in value.lower()
        elif name == b"connection":
            token = value.strip().lower()
            keep = token != b"close" and (keep or token == b"keep-alive")
    if chunked:
        length = None
    elif status in (204, 304) or 100 <= status < 200:
        length = 0
    elif length is None:
        keep = False  # the body ends with the connection
    return status, body_start, length, chunked, keep


def dechunk(buffer: bytearray, start: int) -> tuple[bytes, int] | None:
    """The body of a complete chunked answer and the bytes it used, or None while incomplete."""
    parts: list[bytes] = []
    offset = start
    while True:
        end = buffer.find(b"\r\n", offset)
        if end < 0:
            return None
        size = int(bytes(buffer[offset:end]).split(b";", 1)[0].strip(), 16)
        offset = end + 2
        if size == 0:
            trailer_end = buffer.find(b"\r\n\r\n", offset - 2)  # no trailers: the CRLF right after
            if trailer_end < 0:
                return None
            return b"".join(parts), trailer_end + 4
        if len(buffer) < offset + size + 2:
            return None
        parts.append(bytes(buffer[offset : offset + size]))
        offset += size + 2


class UnaryClient:
    """Keep-alive connections per pod address (as many as requests in flight, idle ones reused)."""

    def __init__(self) -> None:
        self._idle: dict[str, list[_Connection]] = {}
        self._releases = 0

    async def post(self, address: str, data: bytes, deadline_s: float) -> tuple[int, bytes]:
        """Send ``data`` (a whole request) and return (status, body) by ``deadline_s`` (``time.monotonic``).
        Raises OSError (TimeoutError at the deadline), ValueError."""
        connection, reused = await self._acquire(address, deadline_s)
        try:
            try:
                answer = await connection.request(data, deadline_s)
            except TimeoutError:
                raise
            except OSError:
                if not reused or connection.received:
                    raise
                connection.close()  # an idle connection the pod had closed: once more on a new one
                connection, reused = await self._connect(address, deadline_s), False
                answer = await connection.request(data, deadline_s)
        except BaseException:
            connection.close()  # also on cancellation: closing is Triton's cancellation signal
            raise
        self._release(address, connection)
        return answer

    async def _acquire(self, address: str, deadline_s: float) -> tuple[_Connection, bool]:
        idle = self._idle.get(address)
        now = time.monotonic()
        while idle:
            connection = idle.pop()
            if not connection.closed and now - connection.idle_since < _IDLE_KEEP_S:
                return connection, True
            connection.close()
        return await self._connect(address, deadline_s), False

    @staticmethod
    async def _connect(address: str, deadline_s: float) -> _Connection:
        host, _, port = address.rpartition(":")
        async with asyncio.timeout(deadline_s - time.monotonic()):  # a pod that never answers the SYN
            _, connection = await asyncio.get_running_loop().create_connection(_Connection, host.strip("[]"), int(port))
        return connection

    def _release(self, address: str, connection: _Connection) -> None:
        self._releases += 1
        if self._releases % _SWEEP_EVERY == 0:
            self._sweep()
        if connection.closed or not connection.reusable:
            connection.close()
            return
        idle = self._idle.setdefault(address, [])
        if len(idle) >= _MAX_IDLE_PER_ADDRESS:
            connection.close()
            return
        connection.idle_since = time.monotonic()
        idle.append(connection)

    def _sweep(self) -> None:
        """Drop idle connections that closed or idled too long (pods that left the fleet included)."""
        now = time.monotonic()
        for address, idle in list(self._idle.items()):
            keep = [c for c in idle if not c.closed and now - c.idle_since < _IDLE_KEEP_S]
            for connection in idle:
                if connection not in keep:
                    connection.close()
            if keep:
                self._idle[address] = keep
            else:
                del self._idle[address]

    def close(self) -> None:
        for idle in self._idle.values():
            for connection in idle:
                connection.close()
        self._idle.clear()
