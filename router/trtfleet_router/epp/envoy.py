"""The endpoint-picker protocol's messages, as Envoy's ``ext_proc`` carries them (pure).

The protocol (GIE ``docs/proposals/004-endpoint-picker-protocol``, v1.0.0; the commit read is in
docs/gateway.md): the gateway opens one ``ExternalProcessor/Process`` stream per HTTP request, bodies in
``FULL_DUPLEX_STREAMED`` mode. After the request body ends, the picker answers the request-headers phase with the
destination, ``x-gateway-destination-endpoint: ip:port[,ip:port...]`` as a header and the same value under
``dynamic_metadata["envoy.lb"]``, with ``clear_route_cache``; then the (possibly rewritten) body as streamed body
responses. Response phases are answered in order, each body chunk streamed back. No endpoint: an immediate 503;
shed: 429. The gateway may narrow the candidates with a subset hint in the request's metadata
(``envoy.lb.subset_hint`` / ``x-gateway-destination-endpoint-subset``) and reports the endpoint that served the
response in ``envoy.lb`` / ``x-gateway-destination-endpoint-served``.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any, Final

from envoy.config.core.v3 import base_pb2
from envoy.service.ext_proc.v3 import external_processor_pb2 as ext_proc
from envoy.type.v3 import http_status_pb2
from google.protobuf import struct_pb2

from trtfleet_router import jsoncodec

DESTINATION: Final = "x-gateway-destination-endpoint"
DESTINATION_NAMESPACE: Final = "envoy.lb"
SERVED: Final = "x-gateway-destination-endpoint-served"
SUBSET_NAMESPACE: Final = "envoy.lb.subset_hint"
SUBSET: Final = "x-gateway-destination-endpoint-subset"
BODY_CHUNK_BYTES: Final = 62_000
"""Largest streamed body response: Envoy's gRPC messages stay well below their 4 MiB default limit."""


def header_map(headers: base_pb2.HeaderMap) -> dict[str, str]:
    """The HTTP headers of a headers phase, names lower-case (Envoy sends them so); a repeated name keeps its last."""
    return {header.key: (header.raw_value.decode("latin-1") if header.raw_value else header.value)
            for header in headers.headers}


def _metadata_field(metadata: base_pb2.Metadata, namespace: str, key: str) -> struct_pb2.Value | None:
    entry = metadata.filter_metadata.get(namespace)
    if entry is None or key not in entry.fields:
        return None
    return entry.fields[key]


def subset_hint(metadata: base_pb2.Metadata) -> frozenset[str] | None:
    """The endpoints (``ip:port``) the gateway allows for this request; None when it sends no hint."""
    value = _metadata_field(metadata, SUBSET_NAMESPACE, SUBSET)
    if value is None:
        return None
    if value.HasField("list_value"):
        return frozenset(item.string_value for item in value.list_value.values if item.string_value)
    if value.HasField("string_value"):
        return frozenset(part.strip() for part in value.string_value.split(",") if part.strip())
    return frozenset()


def served_endpoint(metadata: base_pb2.Metadata, headers: Mapping[str, str]) -> str | None:
    """The endpoint that served the response, as the gateway reports it (metadata, else a response header)."""
    value = _metadata_field(metadata, DESTINATION_NAMESPACE, SERVED)
    if value is not None and value.string_value:
        return str(value.string_value)
    served = headers.get(SERVED)
    return served or None


def _header(key: str, value: str) -> base_pb2.HeaderValueOption:
    return base_pb2.HeaderValueOption(header=base_pb2.HeaderValue(key=key, raw_value=value.encode("latin-1")))


def route_to(
    endpoints: Iterable[str], set_headers: Mapping[str, str] | None = None
) -> ext_proc.ProcessingResponse:
    """The request-headers answer that sends the request to ``endpoints`` (the first, then fallbacks in order);
    ``set_headers`` adds or replaces request headers (``:path`` included)."""
    value = ",".join(endpoints)
    headers = [_header(DESTINATION, value)]
    headers += [_header(key, text) for key, text in (set_headers or {}).items()]
    metadata = struct_pb2.Struct()
    metadata.fields[DESTINATION_NAMESPACE].struct_value.fields[DESTINATION].string_value = value
    return ext_proc.ProcessingResponse(
        request_headers=ext_proc.HeadersResponse(
            response=ext_proc.CommonResponse(
                clear_route_cache=True, header_mutation=ext_proc.HeaderMutation(set_headers=headers)
            )
        ),
        dynamic_metadata=metadata,
    )


def request_body(body: bytes) -> list[ext_proc.ProcessingResponse]:
    """The request body as streamed body responses (chunks of at most :data:`BODY_CHUNK_BYTES`, the last ending
    the stream); an empty body is one empty, final chunk."""
    chunks = [body[start : start + BODY_CHUNK_BYTES] for start in range(0, len(body), BODY_CHUNK_BYTES)] or [b""]
    last = len(chunks) - 1
    return [
        ext_proc.ProcessingResponse(
            request_body=ext_proc.BodyResponse(
                response=ext_proc.CommonResponse(
                    body_mutation=ext_proc.BodyMutation(
                        streamed_response=ext_proc.StreamedBodyResponse(body=chunk, end_of_stream=index == last)
                    )
                )
            )
        )
        for index, chunk in enumerate(chunks)
    ]


def response_body(chunk: bytes, end_of_stream: bool) -> ext_proc.ProcessingResponse:
    """One response body chunk streamed back to the gateway."""
    return ext_proc.ProcessingResponse(
        response_body=ext_proc.BodyResponse(
            response=ext_proc.CommonResponse(
                body_mutation=ext_proc.BodyMutation(
                    streamed_response=ext_proc.StreamedBodyResponse(body=chunk, end_of_stream=end_of_stream)
                )
            )
        )
    )


RESPONSE_HEADERS_UNCHANGED: Final = ext_proc.ProcessingResponse(
    response_headers=ext_proc.HeadersResponse(response=ext_proc.CommonResponse())
)
REQUEST_TRAILERS_UNCHANGED: Final = ext_proc.ProcessingResponse(request_trailers=ext_proc.TrailersResponse())
RESPONSE_TRAILERS_UNCHANGED: Final = ext_proc.ProcessingResponse(response_trailers=ext_proc.TrailersResponse())


def immediate(status: int, body: Any, headers: Mapping[str, str] | None = None) -> ext_proc.ProcessingResponse:
    """An answer the gateway gives the client at once, without a model server: ``body`` as JSON."""
    all_headers = {"content-type": "application/json", **(headers or {})}
    return ext_proc.ProcessingResponse(
        immediate_response=ext_proc.ImmediateResponse(
            status=http_status_pb2.HttpStatus(code=status),
            headers=ext_proc.HeaderMutation(set_headers=[_header(k.lower(), v) for k, v in all_headers.items()]),
            body=jsoncodec.dumps(body),
        )
    )
