"""The picker port's HTTP/2 (``trtfleet_router.epp.wire``) against grpcio's real client: health checks as kubelet
and Envoy call them, unknown methods, messages larger than every flow-control window, header blocks continued over
frames, many streams on one connection, a client that cancels, a handler that fails, a peer that is not HTTP/2.
The ext_proc exchange itself over this port is tested in test_picker_protocol.py, and behind a real Envoy in
tests/integration/router/test_router_gateway.py."""

from __future__ import annotations

import asyncio
import socket
import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

import grpc
import hpack
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from hypothesis import given, settings
from hypothesis import strategies as st
from trtfleet_router.epp import wire
from trtfleet_router.epp.server import HEALTH_CHECK, PickerHealth
from trtfleet_router.epp.wire import PREFACE, CallFailed, GrpcStatus, Method, Stream, WireServer

from tests.support.loopthread import LoopThread

ECHO = "/test.Wire/Echo"
FAIL = "/test.Wire/Fail"
HOLD = "/test.Wire/Hold"
MAX_MESSAGE = 4 << 20
Request = health_pb2.HealthCheckRequest  # any message with a string field serves as a payload


async def echo(stream: Stream) -> None:
    while (message := await stream.read()) is not grpc.aio.EOF:
        await stream.write(message)


class Served:
    def __init__(self) -> None:
        self.loop = LoopThread()
        self.health = PickerHealth()
        self.held = threading.Event()
        self.released = threading.Event()
        methods = {
            ECHO: Method(Request.FromString, echo),
            FAIL: Method(Request.FromString, self.fail),
            HOLD: Method(Request.FromString, self.hold),
            HEALTH_CHECK: Method(Request.FromString, self.health.check),
        }
        self.server = WireServer(methods, MAX_MESSAGE)
        self.port = self.loop.run(self.server.start("127.0.0.1", 0))
        self.channel = grpc.insecure_channel(f"127.0.0.1:{self.port}",
                                             options=[("grpc.max_send_message_length", 64 << 20)])

    async def fail(self, stream: Stream) -> None:
        message = await stream.read()
        if message.service == "refuse":
            raise CallFailed(GrpcStatus.NOT_FOUND, "no such thing: é")
        raise ValueError("broken handler")

    async def hold(self, stream: Stream) -> None:
        await stream.read()
        self.held.set()
        try:
            await asyncio.sleep(60)
        finally:
            self.released.set()

    def call(self, path: str, messages: list[Request], **options: object) -> list[Request]:
        method = self.channel.stream_stream(path, request_serializer=Request.SerializeToString,
                                            response_deserializer=Request.FromString)
        return list(method(iter(messages), timeout=30, **options))

    def close(self) -> None:
        self.channel.close()
        self.loop.run(self.server.stop(grace_s=0.5))
        self.loop.close()


@pytest.fixture
def served() -> Iterator[Served]:
    found = Served()
    yield found
    found.close()


def test_health_checks_answer_as_kubelet_and_envoy_ask(served: Served) -> None:
    stub = health_pb2_grpc.HealthStub(served.channel)
    with pytest.raises(grpc.RpcError) as unknown_before:
        stub.Check(health_pb2.HealthCheckRequest(service="readiness"), timeout=10)
    assert unknown_before.value.code() == grpc.StatusCode.NOT_FOUND  # nothing said yet
    served.loop.loop.call_soon_threadsafe(served.health.serving, True)
    served.loop.run(asyncio.sleep(0))
    serving = health_pb2.HealthCheckResponse.SERVING
    for service in ("liveness", "readiness", "envoy.service.ext_proc.v3.ExternalProcessor", ""):
        assert stub.Check(health_pb2.HealthCheckRequest(service=service), timeout=10).status == serving
    served.loop.loop.call_soon_threadsafe(served.health.serving, False)
    served.loop.run(asyncio.sleep(0))
    assert stub.Check(health_pb2.HealthCheckRequest(service="readiness"), timeout=10).status == (
        health_pb2.HealthCheckResponse.NOT_SERVING)
    assert stub.Check(health_pb2.HealthCheckRequest(service="liveness"), timeout=10).status == serving
    with pytest.raises(grpc.RpcError) as watch:
        next(iter(stub.Watch(health_pb2.HealthCheckRequest(service="liveness"), timeout=10)))
    assert watch.value.code() == grpc.StatusCode.UNIMPLEMENTED


def test_a_method_not_served_is_unimplemented_and_the_connection_goes_on(served: Served) -> None:
    with pytest.raises(grpc.RpcError) as refused:
        served.call("/test.Wire/Nothing", [Request(service="x")])
    assert refused.value.code() == grpc.StatusCode.UNIMPLEMENTED
    assert "/test.Wire/Nothing" in (refused.value.details() or "")
    assert served.call(ECHO, [Request(service="after")]) == [Request(service="after")]


def test_messages_larger_than_every_window_go_both_ways_whole_and_in_order(served: Served) -> None:
    messages = [Request(service=f"{index}:" + "x" * (300_000 + index)) for index in range(12)]  # 3.6 MB each way
    assert served.call(ECHO, messages) == messages


def test_a_message_over_the_limit_is_refused_as_resource_exhausted(served: Served) -> None:
    with pytest.raises(grpc.RpcError) as refused:
        served.call(ECHO, [Request(service="x" * (MAX_MESSAGE + 1))])
    assert refused.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert served.call(ECHO, [Request(service="small")]) == [Request(service="small")]


def test_a_header_block_continued_over_frames_is_read(served: Served) -> None:
    big = (("x-big", "v" * 40_000),)  # over one 16 KiB frame: HEADERS then CONTINUATION
    assert served.call(ECHO, [Request(service="headers")], metadata=big) == [Request(service="headers")]


def test_many_streams_on_one_connection_each_get_their_own_answers(served: Served) -> None:
    def one(index: int) -> list[Request]:
        return served.call(ECHO, [Request(service=f"{index}-{part}") for part in range(5)])

    with ThreadPoolExecutor(16) as pool:
        answers = list(pool.map(one, range(64)))
    assert answers == [[Request(service=f"{index}-{part}") for part in range(5)] for index in range(64)]


def test_a_failing_handler_ends_its_call_with_a_status_the_client_reads(served: Served) -> None:
    with pytest.raises(grpc.RpcError) as refused:
        served.call(FAIL, [Request(service="refuse")])
    assert refused.value.code() == grpc.StatusCode.NOT_FOUND
    assert refused.value.details() == "no such thing: é"  # percent-encoded on the wire, as gRPC says
    with pytest.raises(grpc.RpcError) as broken:
        served.call(FAIL, [Request(service="crash")])
    assert broken.value.code() == grpc.StatusCode.INTERNAL
    assert "broken handler" in (broken.value.details() or "")


def test_a_client_that_cancels_cancels_the_handler(served: Served) -> None:
    method = served.channel.stream_stream(HOLD, request_serializer=Request.SerializeToString,
                                          response_deserializer=Request.FromString)
    call = method(iter([Request(service="hold")]), timeout=30)
    assert served.held.wait(10)
    call.cancel()
    assert served.released.wait(10)  # the handler's task was cancelled: its finally ran


def test_stopping_ends_open_calls_as_unavailable(served: Served) -> None:
    method = served.channel.stream_stream(HOLD, request_serializer=Request.SerializeToString,
                                          response_deserializer=Request.FromString)
    call = method(iter([Request(service="hold")]), timeout=30)
    assert served.held.wait(10)
    served.loop.run(served.server.stop(grace_s=0.2))
    with pytest.raises(grpc.RpcError) as stopped:
        list(call)
    assert stopped.value.code() == grpc.StatusCode.UNAVAILABLE
    assert served.released.wait(10)


def test_a_peer_that_is_not_http2_is_told_so_and_others_are_served(served: Served) -> None:
    with socket.create_connection(("127.0.0.1", served.port), timeout=10) as sock:
        sock.sendall(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
        answer = b""
        while chunk := sock.recv(65536):
            answer += chunk
    frames = []
    while answer:
        length = int.from_bytes(answer[:3], "big")
        frames.append((answer[3], answer[9 : 9 + length]))
        answer = answer[9 + length :]
    assert [kind for kind, _ in frames] == [4, 8, 7]  # SETTINGS and a window on connect, then GOAWAY
    assert int.from_bytes(frames[-1][1][4:8], "big") == 1 and b"prior knowledge" in frames[-1][1]  # PROTOCOL_ERROR
    assert served.call(ECHO, [Request(service="still")]) == [Request(service="still")]


class Recorder(asyncio.Transport):
    """A transport that keeps what the connection writes."""

    def __init__(self) -> None:
        super().__init__()
        self.written = bytearray()
        self.closed = False

    def write(self, data: bytes | bytearray | memoryview) -> None:
        self.written += data

    def is_closing(self) -> bool:
        return self.closed

    def close(self) -> None:
        self.closed = True


def _client_bytes(messages: list[Request]) -> bytes:
    """A gRPC client's side of one call, framed by hand: the preface, SETTINGS, a HEADERS block continued over a
    CONTINUATION, a GOAWAY (the client opens nothing more), the messages in DATA frames of at most 100 bytes (one
    of them padded), END_STREAM, a PING."""
    block = hpack.Encoder().encode([(":method", "POST"), (":scheme", "http"), (":path", ECHO),
                                    (":authority", "picker"), ("content-type", "application/grpc"),
                                    ("te", "trailers"), ("x-filler", "f" * 300)])
    out = PREFACE + wire.frame(wire.SETTINGS, 0, 0)
    out += wire.frame(wire.HEADERS, 0, 1, block[:50]) + wire.frame(wire.CONTINUATION, wire.END_HEADERS, 1, block[50:])
    out += wire.frame(wire.GOAWAY, 0, 0, (1).to_bytes(4, "big") + (0).to_bytes(4, "big"))
    data = b"".join(b"\x00" + len(m.SerializeToString()).to_bytes(4, "big") + m.SerializeToString() for m in messages)
    chunks = [data[start : start + 100] for start in range(0, len(data), 100)]
    for index, chunk in enumerate(chunks):
        flags = wire.END_STREAM if index == len(chunks) - 1 else 0
        if index == 1:
            out += wire.frame(wire.DATA, flags | wire.PADDED, 1, bytes([3]) + chunk + b"\x00\x00\x00")
        else:
            out += wire.frame(wire.DATA, flags, 1, chunk)
    return out + wire.frame(wire.PING, 0, 0, b"12345678")


def _frames(data: bytes) -> list[tuple[int, int, int, bytes]]:
    found = []
    while data:
        length = int.from_bytes(data[:3], "big")
        found.append((data[3], data[4], int.from_bytes(data[5:9], "big"), data[9 : 9 + length]))
        data = data[9 + length :]
    return found


@given(cuts=st.lists(st.integers(min_value=1, max_value=2_000), max_size=30))
@settings(max_examples=60, derandomize=True, database=None, deadline=None)
def test_whatever_the_segmentation_a_call_is_read_and_answered_the_same(cuts: list[int]) -> None:
    messages = [Request(service=f"m{index}-" + "y" * (index * 37)) for index in range(6)]
    sent = _client_bytes(messages)
    points = sorted({cut % len(sent) for cut in cuts} | {0, len(sent)})

    async def exchange() -> tuple[bytes, bool]:
        server = WireServer({ECHO: Method(Request.FromString, echo)}, MAX_MESSAGE)
        connection = wire.Connection(server.methods, MAX_MESSAGE, server)
        transport = Recorder()
        connection.connection_made(transport)
        for start, end in zip(points, points[1:], strict=False):
            connection.data_received(sent[start:end])
            await asyncio.sleep(0)
        for _ in range(20):
            await asyncio.sleep(0)
        return bytes(transport.written), transport.closed

    written, closed = asyncio.run(exchange())
    assert closed  # after the GOAWAY, once its one stream ended
    frames = _frames(written)
    kinds = [(kind, flags) for kind, flags, stream, _ in frames if stream == 1]
    assert kinds[0] == (wire.HEADERS, wire.END_HEADERS)
    assert kinds[-1] == (wire.HEADERS, wire.END_HEADERS | wire.END_STREAM)
    answer = b"".join(payload for kind, _, stream, payload in frames if kind == wire.DATA and stream == 1)
    echoed = []
    while answer:
        length = int.from_bytes(answer[1:5], "big")
        echoed.append(Request.FromString(answer[5 : 5 + length]))
        answer = answer[5 + length :]
    assert echoed == messages
    trailers = next(payload for kind, flags, stream, payload in frames
                    if stream == 1 and kind == wire.HEADERS and flags & wire.END_STREAM)
    assert hpack.Decoder().decode(trailers) == [("grpc-status", "0")]
    assert (wire.PING, wire.ACK, 0, b"12345678") in frames


def test_a_frame_size_setting_outside_the_protocols_range_ends_the_connection() -> None:
    async def exchange() -> tuple[bytes, bool]:
        server = WireServer({ECHO: Method(Request.FromString, echo)}, MAX_MESSAGE)
        connection = wire.Connection(server.methods, MAX_MESSAGE, server)
        transport = Recorder()
        connection.connection_made(transport)
        setting = (wire.SETTINGS_MAX_FRAME_SIZE).to_bytes(2, "big") + (0).to_bytes(4, "big")
        connection.data_received(PREFACE + wire.frame(wire.SETTINGS, 0, 0, setting))
        return bytes(transport.written), transport.closed

    written, closed = asyncio.run(exchange())
    goaway = [payload for kind, _, _, payload in _frames(written) if kind == wire.GOAWAY]
    assert closed and len(goaway) == 1
    assert int.from_bytes(goaway[0][4:8], "big") == 1 and b"SETTINGS_MAX_FRAME_SIZE of 0" in goaway[0]


ENVOY_STREAM_HEADERS = bytes.fromhex(  # how Envoy 1.40 starts its later ext_proc streams on a connection, captured
    "8304a560b5773fa5d05b3b98855cbe5315761c8bf7657c1e525b2a1d1aec390a841ec635d8721508c286c1c0bfbe")


@pytest.mark.parametrize(("block", "writes"), [
    (ENVOY_STREAM_HEADERS, False),  # reads the table (indices 62-65), a literal :path not indexed
    (b"\x82\x86\x84", False),  # static entries only
    (b"\xbe\xff\x00", False),  # indices 62 and 127 (a multi-byte integer): reads
    (b"\x04\x03abc", False),  # not indexed, :path's name from the static table
    (b"\x10\x01x\x01y", False),  # never indexed, literal name
    (b"\x44\x03abc", True),  # incremental indexing adds to the table
    (b"\x82\x40\x01x\x01y", True),  # ... also after other fields, with a literal name
    (b"\x20\x82", True),  # a table size update
    (b"\x04\x05abc", True),  # a value cut short: not known
    (b"\x10\x01x", True),  # a literal name with no value
    (b"\xff\xff\xff\xff\xff\xff", True),  # an integer that never ends
    (b"", False),
])
def test_a_header_block_writes_the_table_when_a_field_adds_to_or_resizes_it(block: bytes, writes: bool) -> None:
    assert wire.writes_table(block) is writes


def test_envoys_stream_headers_are_decoded_once_while_the_table_stays() -> None:
    encoder, headers = hpack.Encoder(), wire.HeaderDecoder()
    fixed = [(":method", "POST"), (":authority", "picker"), ("content-type", "application/grpc")]
    path = hpack.NeverIndexedHeaderTuple(":path", "/envoy.service.ext_proc.v3.ExternalProcessor/Process")
    first = encoder.encode([*fixed, path])  # indexes the fixed fields
    assert wire.writes_table(first) and headers.decode(first)[-1] == (b":path", path[1].encode())
    second = encoder.encode([*fixed, path])
    assert not wire.writes_table(second) and len(second) < len(first)
    decoded = headers.decode(second)
    assert headers.decode(second) is decoded and list(headers.known) == [second]
    assert headers.decode(encoder.encode([("x-new", "1")])) == [(b"x-new", b"1")]  # indexed: the table changed
    assert headers.known == {}


HEADER_NAMES = st.sampled_from([":path", ":method", "content-type", "x-request-id", "x-custom", "te"])
HEADER_LISTS = st.lists(st.tuples(HEADER_NAMES, st.sampled_from(["a", "POST", "/x", "trailers", "é" * 3]),
                                  st.booleans()), max_size=6)


@given(steps=st.lists(st.one_of(HEADER_LISTS, st.integers(min_value=0, max_value=50)), max_size=25))
@settings(max_examples=120, derandomize=True, database=None, deadline=None)
def test_kept_blocks_decode_as_hpack_does_whatever_the_table_holds(steps: list[object]) -> None:
    """Blocks an encoder makes (indexed, never indexed, the table growing and evicting) and replays of earlier ones
    decode through the memo exactly as through hpack alone, errors included."""
    encoder = hpack.Encoder()
    encoder.header_table_size = 256  # small: entries get evicted, and an old block's references go stale
    sent: list[bytes] = []
    ours, plain = wire.HeaderDecoder(), hpack.Decoder()
    for step in steps:
        if isinstance(step, int):
            if not sent:
                continue
            block = sent[step % len(sent)]
        else:
            fields = [hpack.NeverIndexedHeaderTuple(n, v) if never else hpack.HeaderTuple(n, v)
                      for n, v, never in step]  # type: ignore[misc]
            block = encoder.encode(fields)
            sent.append(block)
        try:
            expected: object = [(bytes(n), bytes(v)) for n, v in plain.decode(block, raw=True)]
        except hpack.HPACKError as exc:
            expected = type(exc)
        try:
            got: object = ours.decode(block)
        except hpack.HPACKError as exc:
            got = type(exc)
        assert got == expected
