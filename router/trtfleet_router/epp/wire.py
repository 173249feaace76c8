"""The picker's gRPC port without a gRPC library: HTTP/2 frames read and written on the router's own event loop.

Why: a gateway's ``ext_proc`` stream carries about six small messages each way per HTTP request, and through
grpc.aio each one crosses gRPC's core and its poller thread before it reaches the event loop; handled here, a
message is a few slices of bytes and a protobuf parse (the comparison is in docs/benchmarks/gateway.md). The
exchanges run as tasks on the loop that owns the fleet view, so no message crosses a thread.

What it speaks: cleartext HTTP/2 with prior knowledge (RFC 9113), as Envoy's ``envoy_grpc`` client and every gRPC
client use it for an ``http://`` target, and gRPC's mapping onto it (length-prefixed messages, status in trailers).
Header blocks are decoded with ``hpack`` (the peer's dynamic table included), the repeated ones once while the table
stays as it is (:class:`HeaderDecoder`); this side writes only literals that are never indexed, so it keeps no
table. Flow control both ways: this side opens its receive windows to the maximum and reopens them as data is read;
it sends no more than the peer's windows allow and holds a writer until they reopen. A method this port does not
serve is answered UNIMPLEMENTED; a message over ``max_message_bytes`` RESOURCE_EXHAUSTED. No TLS, no server push, no
compression (a compressed message is refused).
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
import struct
import urllib.parse
from collections.abc import Awaitable, Callable, Mapping
from typing import Any, Final

import grpc
import hpack
from google.protobuf.message import DecodeError, Message

log = logging.getLogger(__name__)

PREFACE: Final = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
MAX_WINDOW: Final = (1 << 31) - 1
REOPEN_AT: Final = 1 << 30
"""Received bytes after which a receive window is reopened to its maximum."""
DEFAULT_FRAME_BYTES: Final = 16_384
MAX_FRAME_SIZE: Final = (1 << 24) - 1
MAX_HEADER_BLOCK_BYTES: Final = 256 * 1024
"""A header block continued past this is refused (a peer could otherwise send CONTINUATION frames forever)."""
KNOWN_BLOCKS, KNOWN_BLOCK_BYTES = 256, 4096
"""Header blocks kept decoded per connection (:class:`HeaderDecoder`), and the largest kept."""

DATA, HEADERS, PRIORITY, RST_STREAM, SETTINGS, PUSH_PROMISE, PING, GOAWAY, WINDOW_UPDATE, CONTINUATION = range(10)
END_STREAM, ACK, END_HEADERS, PADDED, PRIORITY_FLAG = 0x1, 0x1, 0x4, 0x8, 0x20
SETTINGS_HEADER_TABLE_SIZE, SETTINGS_INITIAL_WINDOW_SIZE, SETTINGS_MAX_FRAME_SIZE = 0x1, 0x4, 0x5
NO_ERROR, PROTOCOL_ERROR, FLOW_CONTROL_ERROR, COMPRESSION_ERROR, FRAME_SIZE_ERROR = 0x0, 0x1, 0x3, 0x9, 0x6


class GrpcStatus:
    OK: Final = 0
    NOT_FOUND: Final = 5
    RESOURCE_EXHAUSTED: Final = 8
    UNIMPLEMENTED: Final = 12
    INTERNAL: Final = 13
    UNAVAILABLE: Final = 14


class ConnectionFailed(Exception):
    """The peer broke the protocol: the connection ends with GOAWAY and this code."""

    def __init__(self, code: int, why: str) -> None:
        super().__init__(why)
        self.code = code


class CallFailed(Exception):
    """A handler's refusal: the call ends with this gRPC status and message."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


def frame(kind: int, flags: int, stream_id: int, payload: bytes | memoryview = b"") -> bytes:
    size = len(payload)
    return b"".join((bytes((size >> 16, (size >> 8) & 0xFF, size & 0xFF, kind, flags)), stream_id.to_bytes(4, "big"),
                     payload))


def _hpack_integer(value: int, prefix_bits: int, first: int) -> bytes:
    limit = (1 << prefix_bits) - 1
    if value < limit:
        return bytes((first | value,))
    out = bytearray((first | limit,))
    value -= limit
    while value >= 0x80:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def literal(name: bytes, value: bytes) -> bytes:
    """A header field as an HPACK literal never indexed, new name: no table on either side changes."""
    return b"\x10" + _hpack_integer(len(name), 7, 0) + name + _hpack_integer(len(value), 7, 0) + value


RESPONSE_HEADERS: Final = b"\x88" + literal(b"content-type", b"application/grpc")  # 0x88: ":status: 200", static


def trailers(status: int, message: str = "") -> bytes:
    block = literal(b"grpc-status", str(status).encode())
    if message:
        # gRPC's percent-encoding: printable ASCII but "%" stays as it is
        text = urllib.parse.quote(message, safe=" !\"#$&'()*+,-./:;<=>?@[\\]^_`{|}~")
        block += literal(b"grpc-message", text.encode())
    return block


def _prefixed(block: bytes, at: int, prefix_bits: int) -> tuple[int, int] | None:
    """An HPACK integer with a ``prefix_bits`` prefix at ``at``: (value, where the next field starts), None if cut."""
    limit = (1 << prefix_bits) - 1
    value = block[at] & limit
    at += 1
    if value < limit:
        return value, at
    shift = 0
    while at < len(block):
        byte = block[at]
        at += 1
        value += (byte & 0x7F) << shift
        shift += 7
        if not byte & 0x80:
            return value, at
        if shift > 28:
            return None
    return None


def writes_table(block: bytes) -> bool:
    """Whether decoding a header block can change the decoder's dynamic table (RFC 7541 section 6): it adds a field
    to it or resizes it (or does not parse, so nothing is known of it). Other blocks may read the table: such a
    block decodes to the same fields for as long as the table holds what it did."""
    at, size = 0, len(block)
    while at < size:
        first = block[at]
        if first & 0x80:  # an indexed field
            found = _prefixed(block, at, 7)
            if found is None:
                return True
            at = found[1]
            continue
        if first & 0xE0:  # 01xxxxxx adds to the table, 001xxxxx resizes it
            return True
        found = _prefixed(block, at, 4)  # 0000xxxx not indexed, 0001xxxx never indexed: a name index, 0 = literal
        if found is None:
            return True
        name_index, at = found
        for _string in range(1 if name_index else 2):  # the name's string if it is literal, then the value's
            if at >= size or (found := _prefixed(block, at, 7)) is None:
                return True
            at = found[1] + found[0]
        if at > size:
            return True
    return False


class HeaderDecoder:
    """The peer's header blocks decoded with ``hpack``. A block that leaves the dynamic table as it was is kept
    decoded by its bytes, until a block changes the table. Why: Envoy indexes its fixed fields in the first stream
    of a connection and then starts every ``ext_proc`` stream with the same block (table references and a literal
    ``:path``), which hpack would otherwise decode in pure Python, Huffman strings and all, for every request."""

    def __init__(self) -> None:
        self.decoder = hpack.Decoder()
        self.known: dict[bytes, list[tuple[bytes, bytes]]] = {}

    def decode(self, block: bytes) -> list[tuple[bytes, bytes]]:
        fields = self.known.get(block)
        if fields is not None:
            return fields
        fields = [(name, value) for name, value in self.decoder.decode(block, raw=True)]
        if writes_table(block):
            self.known.clear()  # what the kept blocks read from the table may have changed
        elif len(block) <= KNOWN_BLOCK_BYTES:
            if len(self.known) >= KNOWN_BLOCKS:
                self.known.clear()
            self.known[block] = fields
        return fields


class Stream:
    """One RPC, as its handler sees it: ``read`` the next request message (``grpc.aio.EOF`` once the peer has sent
    its last), ``write`` a response message; ``cancelled`` once the peer reset the stream."""

    def __init__(self, connection: Connection, stream_id: int, decode: Callable[[bytes], Message]) -> None:
        self.connection = connection
        self.id = stream_id
        self.decode = decode
        self.inbox: collections.deque[Message] = collections.deque()
        self.partial = bytearray()  # the start of a message whose end has not come yet
        self.wanted = 0  # bytes ``partial`` needs before a message can be parsed out of it
        self.waiter: asyncio.Future[None] | None = None  # the handler, parked for a message or for the windows
        self.half_closed = False  # the peer sent END_STREAM
        self.reset = False  # the peer sent RST_STREAM (or the connection ended)
        self.done = False  # this side ended the stream
        self.headers_sent = False
        self.send_window = connection.peer_window
        self.received = 0
        self.pending: collections.deque[memoryview] = collections.deque()
        self.task: asyncio.Task[None] | None = None

    async def read(self) -> Any:
        while not self.inbox:
            if self.half_closed or self.reset:
                return grpc.aio.EOF
            await self._park()
        return self.inbox.popleft()

    async def write(self, message: Message) -> None:
        if self.reset or self.done:
            raise asyncio.CancelledError("the stream has ended")
        payload = message.SerializeToString()
        self.connection.send_message(self, b"\x00" + len(payload).to_bytes(4, "big") + payload)
        while self.pending and not (self.reset or self.done):
            await self._park()
        await self.connection.writable()

    def cancelled(self) -> bool:
        return self.reset

    async def _park(self) -> None:
        """Wait for :meth:`wake` (one task serves a stream, so it waits on one thing at a time)."""
        self.waiter = asyncio.get_running_loop().create_future()
        try:
            await self.waiter
        finally:
            self.waiter = None

    def wake(self) -> None:
        if self.waiter is not None and not self.waiter.done():
            self.waiter.set_result(None)


Handler = Callable[[Stream], Awaitable[None]]


class Method:
    """A served method: how its request messages decode, and the coroutine that answers one call."""

    def __init__(self, decode: Callable[[bytes], Message], handler: Handler) -> None:
        self.decode = decode
        self.handler = handler


class Connection(asyncio.Protocol):
    """One peer's HTTP/2 connection: frames in, each stream's messages to its handler's task, frames out."""

    def __init__(self, methods: Mapping[str, Method], max_message_bytes: int, server: WireServer) -> None:
        self.methods = methods
        self.max_message_bytes = max_message_bytes
        self.server = server
        self.transport: asyncio.Transport | None = None
        self.buffer = b""
        self.preface = False
        self.headers = HeaderDecoder()
        self.streams: dict[int, Stream] = {}
        self.last_stream = 0
        self.header_block: tuple[int, int, bytearray] | None = None  # stream, flags, block until END_HEADERS
        self.peer_window = 65_535  # the peer's initial stream window (its SETTINGS)
        self.send_window = 65_535  # the connection's, grown by the peer's WINDOW_UPDATEs
        self.max_frame = DEFAULT_FRAME_BYTES
        self.received = 0
        self.out: list[bytes] = []
        self.flush_scheduled = False
        self.paused: asyncio.Future[None] | None = None
        self.closing = False
        self.table_update = b""  # a dynamic table size update owed at the start of the next header block

    # the transport's side

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport
        self.server.connections.add(self)
        settings = struct.pack(">HI", SETTINGS_INITIAL_WINDOW_SIZE, MAX_WINDOW)
        opened = struct.pack(">I", MAX_WINDOW - 65_535)  # the connection's window, from the protocol's 65,535
        transport.write(frame(SETTINGS, 0, 0, settings) + frame(WINDOW_UPDATE, 0, 0, opened))

    def connection_lost(self, exc: Exception | None) -> None:
        self.server.connections.discard(self)
        for stream in list(self.streams.values()):
            self._cancel(stream)
        self.streams.clear()
        if self.paused is not None and not self.paused.done():
            self.paused.set_result(None)

    def pause_writing(self) -> None:
        if self.paused is None:
            self.paused = asyncio.get_running_loop().create_future()

    def resume_writing(self) -> None:
        if self.paused is not None and not self.paused.done():
            self.paused.set_result(None)
        self.paused = None

    async def writable(self) -> None:
        if self.paused is not None:
            await self.paused

    def data_received(self, data: bytes) -> None:
        try:
            self._frames(self.buffer + data if self.buffer else data)
        except ConnectionFailed as exc:
            log.warning("picker connection closed: %s", exc)
            self.goaway(exc.code, str(exc))
        self._flush()

    # frames in

    def _frames(self, data: bytes) -> None:
        position = 0
        if not self.preface:
            if len(data) < len(PREFACE):
                if not PREFACE.startswith(data):
                    raise ConnectionFailed(PROTOCOL_ERROR, "not HTTP/2 with prior knowledge")
                self.buffer = data
                return
            if not data.startswith(PREFACE):
                raise ConnectionFailed(PROTOCOL_ERROR, "not HTTP/2 with prior knowledge")
            position = len(PREFACE)
            self.preface = True
        size = len(data)
        while size - position >= 9:
            length = int.from_bytes(data[position : position + 3], "big")
            if length > DEFAULT_FRAME_BYTES:  # this side advertises the default SETTINGS_MAX_FRAME_SIZE
                raise ConnectionFailed(FRAME_SIZE_ERROR, f"a frame of {length} bytes")
            if size - position - 9 < length:
                break
            kind, flags = data[position + 3], data[position + 4]
            stream_id = int.from_bytes(data[position + 5 : position + 9], "big") & MAX_WINDOW
            payload = data[position + 9 : position + 9 + length]
            position += 9 + length
            if self.header_block is not None and kind != CONTINUATION:
                raise ConnectionFailed(PROTOCOL_ERROR, "a header block interrupted")
            if kind == DATA:
                self._data(stream_id, flags, payload)
            elif kind == HEADERS:
                self._headers(stream_id, flags, payload)
            elif kind == CONTINUATION:
                self._continuation(stream_id, flags, payload)
            elif kind == SETTINGS:
                if not flags & ACK:
                    self._settings(payload)
            elif kind == PING:
                if not flags & ACK:
                    self.out.append(frame(PING, ACK, 0, payload))
            elif kind == WINDOW_UPDATE:
                self._window_update(stream_id, payload)
            elif kind == RST_STREAM:
                stream = self.streams.pop(stream_id, None)
                if stream is not None:
                    self._cancel(stream)
            elif kind == GOAWAY:  # the peer opens no more streams; the ones under way go on to their ends
                self.closing = True
                self._close_when_idle()
            elif kind == PUSH_PROMISE:
                raise ConnectionFailed(PROTOCOL_ERROR, "a client may not push")
            # PRIORITY and unknown frame types are ignored, as RFC 9113 allows
        self.buffer = data[position:]

    def _data(self, stream_id: int, flags: int, payload: bytes) -> None:
        length = len(payload)
        self.received += length
        if self.received >= REOPEN_AT:
            self.out.append(frame(WINDOW_UPDATE, 0, 0, struct.pack(">I", self.received)))
            self.received = 0
        if flags & PADDED:
            payload = payload[1 : len(payload) - payload[0]]
        stream = self.streams.get(stream_id)
        if stream is None or stream.half_closed:
            return  # a stream already ended or reset here: its data only counts toward the connection's window
        stream.received += length
        if stream.received >= REOPEN_AT:
            self.out.append(frame(WINDOW_UPDATE, 0, stream_id, struct.pack(">I", stream.received)))
            stream.received = 0
        if stream.partial:  # a message cut over frames: gathered until it is whole, then parsed once
            stream.partial += payload
            if len(stream.partial) < stream.wanted:
                self._data_end(stream, flags)
                return
            data, stream.partial = bytes(stream.partial), bytearray()
        else:
            data = payload
        position, size = 0, len(data)
        while size - position >= 5:
            length = int.from_bytes(data[position + 1 : position + 5], "big")
            if data[position]:
                self._finish(stream, GrpcStatus.UNIMPLEMENTED, "compressed messages are not accepted")
                return
            if length > self.max_message_bytes:
                self._finish(stream, GrpcStatus.RESOURCE_EXHAUSTED,
                             f"a message of {length} bytes is over this port's {self.max_message_bytes}")
                return
            if size - position - 5 < length:
                break
            try:
                stream.inbox.append(stream.decode(data[position + 5 : position + 5 + length]))
            except DecodeError:
                self._finish(stream, GrpcStatus.INTERNAL, "a request message that does not parse")
                return
            position += 5 + length
        if position < size:
            stream.partial = bytearray(data[position:])
            stream.wanted = 5 + length if size - position >= 5 else 5
        self._data_end(stream, flags)

    def _data_end(self, stream: Stream, flags: int) -> None:
        if flags & END_STREAM:
            stream.half_closed = True
        stream.wake()

    def _headers(self, stream_id: int, flags: int, payload: bytes) -> None:
        if flags & PADDED:
            payload = payload[1 : len(payload) - payload[0]]
        if flags & PRIORITY_FLAG:
            payload = payload[5:]
        if flags & END_HEADERS:
            self._header_block(stream_id, flags, payload)
        else:
            self.header_block = (stream_id, flags, bytearray(payload))

    def _continuation(self, stream_id: int, flags: int, payload: bytes) -> None:
        if self.header_block is None or self.header_block[0] != stream_id:
            raise ConnectionFailed(PROTOCOL_ERROR, "a CONTINUATION without its HEADERS")
        self.header_block[2].extend(payload)
        if len(self.header_block[2]) > MAX_HEADER_BLOCK_BYTES:
            raise ConnectionFailed(PROTOCOL_ERROR, f"a header block over {MAX_HEADER_BLOCK_BYTES} bytes")
        if flags & END_HEADERS:
            first, first_flags, block = self.header_block
            self.header_block = None
            self._header_block(first, first_flags, bytes(block))

    def _header_block(self, stream_id: int, flags: int, block: bytes) -> None:
        try:
            fields = self.headers.decode(block)
        except hpack.HPACKError as exc:
            raise ConnectionFailed(COMPRESSION_ERROR, f"a header block that does not decode: {exc}") from exc
        existing = self.streams.get(stream_id)
        if existing is not None:  # the peer's trailers
            if flags & END_STREAM:
                existing.half_closed = True
                existing.wake()
            return
        if stream_id <= self.last_stream or not stream_id & 1:
            return  # a stream this side already ended: late trailers
        self.last_stream = stream_id
        if self.closing:
            self.out.append(frame(RST_STREAM, 0, stream_id, struct.pack(">I", 0x7)))  # REFUSED_STREAM
            return
        path = next((value for name, value in fields if name == b":path"), b"").decode("latin-1")
        method = self.methods.get(path)
        stream = Stream(self, stream_id, method.decode if method is not None else _refuse)
        self.streams[stream_id] = stream
        if flags & END_STREAM:
            stream.half_closed = True
        if method is None:
            self._finish(stream, GrpcStatus.UNIMPLEMENTED, f"this port does not serve {path}")
            return
        stream.task = asyncio.get_running_loop().create_task(self._call(stream, method))

    def _settings(self, payload: bytes) -> None:
        if len(payload) % 6:
            raise ConnectionFailed(FRAME_SIZE_ERROR, "a SETTINGS frame of a partial setting")
        for offset in range(0, len(payload), 6):
            key, value = struct.unpack_from(">HI", payload, offset)
            if key == SETTINGS_INITIAL_WINDOW_SIZE:
                if value > MAX_WINDOW:
                    raise ConnectionFailed(FLOW_CONTROL_ERROR, "an initial window over 2^31-1")
                for stream in self.streams.values():
                    stream.send_window += value - self.peer_window
                self.peer_window = value
            elif key == SETTINGS_MAX_FRAME_SIZE:
                if not DEFAULT_FRAME_BYTES <= value <= MAX_FRAME_SIZE:
                    raise ConnectionFailed(PROTOCOL_ERROR, f"a SETTINGS_MAX_FRAME_SIZE of {value}")
                self.max_frame = value
            elif key == SETTINGS_HEADER_TABLE_SIZE and value < hpack.Encoder().header_table_size:
                # this side indexes nothing, but a smaller table must still be acknowledged in the next block
                self.table_update = _hpack_integer(value, 5, 0x20)
        self.out.append(frame(SETTINGS, ACK, 0))
        self._send_pending()

    def _window_update(self, stream_id: int, payload: bytes) -> None:
        increment = int.from_bytes(payload[:4], "big") & MAX_WINDOW
        if stream_id == 0:
            self.send_window += increment
        else:
            stream = self.streams.get(stream_id)
            if stream is None:
                return
            stream.send_window += increment
        self._send_pending()

    # frames out

    def send_message(self, stream: Stream, message: bytes) -> None:
        if not stream.headers_sent:
            self.out.append(frame(HEADERS, END_HEADERS, stream.id, self._block(RESPONSE_HEADERS)))
            stream.headers_sent = True
        stream.pending.append(memoryview(message))  # a message larger than the windows is sent in slices, uncopied
        self._send_stream(stream)
        self._schedule_flush()

    def _block(self, block: bytes) -> bytes:
        if self.table_update:
            block, self.table_update = self.table_update + block, b""
        return block

    def _send_stream(self, stream: Stream) -> None:
        while stream.pending:
            allowed = min(self.send_window, stream.send_window, self.max_frame)
            if allowed <= 0:
                return
            chunk = stream.pending[0]
            if len(chunk) <= allowed:
                stream.pending.popleft()
            else:
                stream.pending[0] = chunk[allowed:]
                chunk = chunk[:allowed]
            self.send_window -= len(chunk)
            stream.send_window -= len(chunk)
            self.out.append(frame(DATA, 0, stream.id, chunk))
        stream.wake()

    def _send_pending(self) -> None:
        for stream in self.streams.values():
            if stream.pending:
                self._send_stream(stream)

    def _finish(self, stream: Stream, status: int, message: str = "") -> None:
        """This side's end of a stream: its trailers (the headers first where none were sent)."""
        if stream.done or stream.reset:
            return
        stream.done = True
        stream.pending.clear()  # a handler ending early drops what the windows still held: the status says why
        block = trailers(status, message)
        if not stream.headers_sent:
            block = RESPONSE_HEADERS + block
        self.out.append(frame(HEADERS, END_HEADERS | END_STREAM, stream.id, self._block(block)))
        if not stream.half_closed:
            self.out.append(frame(RST_STREAM, 0, stream.id, struct.pack(">I", NO_ERROR)))
        self.streams.pop(stream.id, None)
        stream.wake()
        if stream.task is not None and stream.task is not asyncio.current_task() and not stream.task.done():
            stream.task.cancel()
        self._schedule_flush()
        self._close_when_idle()

    def _cancel(self, stream: Stream) -> None:
        stream.reset = True
        stream.wake()
        if stream.task is not None and not stream.task.done():
            stream.task.cancel()
        self._close_when_idle()

    async def _call(self, stream: Stream, method: Method) -> None:
        try:
            await method.handler(stream)
        except asyncio.CancelledError:
            if not stream.reset and not stream.done:
                self._finish(stream, GrpcStatus.UNAVAILABLE, "the picker is stopping")
            raise
        except CallFailed as exc:
            self._finish(stream, exc.status, exc.message)
            return
        except Exception as exc:  # the peer gets INTERNAL, the log the trace
            log.exception("picker stream %d failed", stream.id)
            self._finish(stream, GrpcStatus.INTERNAL, f"{type(exc).__name__}: {exc}")
            return
        self._finish(stream, GrpcStatus.OK)

    def _schedule_flush(self) -> None:
        if not self.flush_scheduled:
            self.flush_scheduled = True
            asyncio.get_running_loop().call_soon(self._flush)

    def _flush(self) -> None:
        self.flush_scheduled = False
        if self.out and self.transport is not None and not self.transport.is_closing():
            self.transport.write(b"".join(self.out))
        self.out.clear()

    def goaway(self, code: int = NO_ERROR, why: str = "") -> None:
        """Tell the peer no new stream is taken; the connection closes once its streams have ended."""
        self.out.append(frame(GOAWAY, 0, 0, struct.pack(">II", self.last_stream, code) + why.encode()[:256]))
        self.closing = True
        if code != NO_ERROR:
            for stream in list(self.streams.values()):
                self._cancel(stream)
            self.streams.clear()
        self._flush()
        self._close_when_idle()

    def _close_when_idle(self) -> None:
        if self.closing and not self.streams and self.transport is not None:
            self._flush()
            self.transport.close()


def _refuse(data: bytes) -> Message:
    raise DecodeError("no method")


class WireServer:
    """The listening socket and its connections."""

    def __init__(self, methods: Mapping[str, Method], max_message_bytes: int) -> None:
        self.methods = dict(methods)
        self.max_message_bytes = max_message_bytes
        self.connections: set[Connection] = set()
        self.server: asyncio.Server | None = None

    async def start(self, host: str, port: int) -> int:
        loop = asyncio.get_running_loop()
        self.server = await loop.create_server(
            lambda: Connection(self.methods, self.max_message_bytes, self), host, port
        )
        return int(self.server.sockets[0].getsockname()[1])

    async def stop(self, grace_s: float) -> None:
        """No new connections or streams; the streams under way get ``grace_s`` to end, then are cancelled."""
        if self.server is None:
            return
        self.server.close()
        for connection in list(self.connections):
            connection.goaway()
        loop = asyncio.get_running_loop()
        deadline = loop.time() + grace_s
        while any(connection.streams for connection in self.connections) and loop.time() < deadline:
            await asyncio.sleep(0.02)
        for connection in list(self.connections):
            for stream in list(connection.streams.values()):
                connection._finish(stream, GrpcStatus.UNAVAILABLE, "the picker has stopped")
            if connection.transport is not None:
                connection._flush()
                connection.transport.close()
        with contextlib.suppress(Exception):
            await self.server.wait_closed()
