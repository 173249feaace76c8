"""An ``ext_proc`` client that plays the gateway's side of the endpoint-picker protocol, for tests.

It speaks Envoy's ``envoy.service.ext_proc.v3.ExternalProcessor/Process`` over a real gRPC channel (the generated
stub from xds-protos), one stream per HTTP request, as Envoy does with ``FULL_DUPLEX_STREAMED`` bodies: request
headers, the body in chunks, then (once the picker has answered) the response headers and body.
"""

from __future__ import annotations

import json
import queue
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import grpc
from envoy.config.core.v3 import base_pb2
from envoy.service.ext_proc.v3 import external_processor_pb2 as ext_proc
from envoy.service.ext_proc.v3 import external_processor_pb2_grpc as ext_proc_grpc
from google.protobuf import struct_pb2

DESTINATION = "x-gateway-destination-endpoint"


def _header_map(headers: Mapping[str, str]) -> base_pb2.HeaderMap:
    return base_pb2.HeaderMap(
        headers=[base_pb2.HeaderValue(key=key, raw_value=value.encode()) for key, value in headers.items()]
    )


def metadata(subset: Sequence[str] | None = None, served: str | None = None) -> base_pb2.Metadata:
    """Filter metadata as a gateway sends it: the subset hint of a request, the served endpoint of a response."""
    found = base_pb2.Metadata()
    if subset is not None:
        hint = struct_pb2.Struct()
        hint.update({"x-gateway-destination-endpoint-subset": list(subset)})
        found.filter_metadata["envoy.lb.subset_hint"].CopyFrom(hint)
    if served is not None:
        lb = struct_pb2.Struct()
        lb.update({"x-gateway-destination-endpoint-served": served})
        found.filter_metadata["envoy.lb"].CopyFrom(lb)
    return found


def request_headers(
    path: str, method: str = "POST", extra: Mapping[str, str] | None = None, *, end_of_stream: bool = False,
    subset: Sequence[str] | None = None,
) -> ext_proc.ProcessingRequest:
    headers = {":path": path, ":method": method, ":scheme": "http", ":authority": "gateway", **(extra or {})}
    return ext_proc.ProcessingRequest(
        request_headers=ext_proc.HttpHeaders(headers=_header_map(headers), end_of_stream=end_of_stream),
        metadata_context=metadata(subset=subset),
    )


def request_body(body: bytes, *, end_of_stream: bool) -> ext_proc.ProcessingRequest:
    return ext_proc.ProcessingRequest(request_body=ext_proc.HttpBody(body=body, end_of_stream=end_of_stream))


def response_headers(
    status: int, extra: Mapping[str, str] | None = None, *, served: str | None = None, end_of_stream: bool = False
) -> ext_proc.ProcessingRequest:
    headers = {":status": str(status), **(extra or {})}
    return ext_proc.ProcessingRequest(
        response_headers=ext_proc.HttpHeaders(headers=_header_map(headers), end_of_stream=end_of_stream),
        metadata_context=metadata(served=served),
    )


def response_body(body: bytes, *, end_of_stream: bool) -> ext_proc.ProcessingRequest:
    return ext_proc.ProcessingRequest(response_body=ext_proc.HttpBody(body=body, end_of_stream=end_of_stream))


class PickerStream:
    """One ``Process`` stream: :meth:`send` messages, :meth:`receive` the picker's answers in order."""

    def __init__(self, channel: grpc.Channel, timeout_s: float = 60.0) -> None:
        self._requests: queue.Queue[ext_proc.ProcessingRequest | None] = queue.Queue()
        self._answers: Iterator[ext_proc.ProcessingResponse] = ext_proc_grpc.ExternalProcessorStub(channel).Process(
            iter(self._requests.get, None), timeout=timeout_s
        )

    def send(self, *messages: ext_proc.ProcessingRequest) -> None:
        for message in messages:
            self._requests.put(message)

    def receive(self) -> ext_proc.ProcessingResponse:
        return next(self._answers)

    def close(self) -> None:
        """Half-close: the gateway has nothing more to send (the stream ends when the picker returns)."""
        self._requests.put(None)

    def cancel(self) -> None:
        self._answers.cancel()  # type: ignore[attr-defined]

    def finish(self) -> list[ext_proc.ProcessingResponse]:
        """Half-close and read what is left (the picker's answers after the last message)."""
        self.close()
        return list(self._answers)

    def request(self, path: str, body: bytes | None, *, chunks: int = 1, headers: Mapping[str, str] | None = None,
                subset: Sequence[str] | None = None) -> Picked:
        """Send a whole request (``body`` None: headers only) and read the picker's answer to it."""
        if body is None:
            self.send(request_headers(path, "GET", headers, end_of_stream=True, subset=subset))
        else:
            self.send(request_headers(path, "POST", headers, subset=subset))
            step = max(1, -(-len(body) // chunks))
            pieces = [body[start : start + step] for start in range(0, len(body), step)] or [b""]
            for index, piece in enumerate(pieces):
                self.send(request_body(piece, end_of_stream=index == len(pieces) - 1))
        first = self.receive()
        if first.WhichOneof("response") == "immediate_response":
            return Picked(first, [])
        bodies: list[ext_proc.ProcessingResponse] = []
        if body is not None:
            while True:
                answer = self.receive()
                bodies.append(answer)
                if answer.request_body.response.body_mutation.streamed_response.end_of_stream:
                    break
        return Picked(first, bodies)


class Picked:
    """The picker's answer to a request phase."""

    def __init__(self, first: ext_proc.ProcessingResponse, bodies: list[ext_proc.ProcessingResponse]) -> None:
        self.first = first
        self.bodies = bodies

    @property
    def immediate(self) -> ext_proc.ImmediateResponse | None:
        return self.first.immediate_response if self.first.WhichOneof("response") == "immediate_response" else None

    @property
    def status(self) -> int:
        immediate = self.immediate
        return int(immediate.status.code) if immediate is not None else 0

    def answer(self) -> Any:
        immediate = self.immediate
        assert immediate is not None, "the picker routed the request"  # the body of its immediate answer
        return json.loads(immediate.body)

    @property
    def headers(self) -> dict[str, str]:
        mutation = self.first.request_headers.response.header_mutation
        return {option.header.key: option.header.raw_value.decode() for option in mutation.set_headers}

    @property
    def destinations(self) -> list[str]:
        return self.headers[DESTINATION].split(",")

    @property
    def metadata_destination(self) -> str:
        return str(self.first.dynamic_metadata.fields["envoy.lb"].struct_value.fields[DESTINATION].string_value)

    @property
    def body(self) -> bytes:
        return b"".join(answer.request_body.response.body_mutation.streamed_response.body for answer in self.bodies)

    def json(self) -> Any:
        return json.loads(self.body)
