"""Warm requests over Triton's HTTP generate extension (all on the event loop): text requests, and
tensor requests that generate JSON carries unchanged (see ``server.triton_protocol``).

Measured on the project's 2-core machine against the echo upstream: a grpc.aio ``ModelStreamInfer``
round trip costs about 290 us of router CPU and ~1 ms of latency (every message crosses grpc's poller
thread and wakes the event loop), an aiohttp keep-alive POST about 175-200 us, and the lean keep-alive
HTTP/1.1 client of :mod:`.http_client` (used for unary requests; streams use aiohttp) about 50 us.
So requests that carry no weights (the warm majority) may use ``POST /v2/models/{m}/generate`` (one JSON answer)
or ``/generate_stream`` (SSE, ``data: {json}`` per piece, errors as ``data: {"error": ...}``) when the
pod's HTTP port is known; requests with weights always use gRPC, since LoRA weights cannot travel as
JSON. Answers come back as the same ``ModelStreamInferResponse`` messages the gRPC transports yield
(read by an :data:`~.protocol.AnswerReader`: ``text_output`` only by default, every declared output for tensor calls),
so the dispatcher's miss recovery and retries do not care which transport carried an attempt.

Errors: a non-200 status or an SSE error event carries Triton's ``{"error": "<text>"}``, classified by
text like gRPC errors (400 counts as invalid, 503 as a full queue); a refused or broken connection is
a pod failure. Closing the connection (the client went away) is Triton's cancellation signal for HTTP.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncGenerator
from typing import Final

import aiohttp
import yarl
from tritonclient.grpc import service_pb2

from trtfleet_router import jsoncodec
from trtfleet_router.upstream.failures import UpstreamCallFailed, translated
from trtfleet_router.upstream.http_client import UnaryClient
from trtfleet_router.upstream.protocol import (
    FINAL_RESPONSE_PARAM,
    SSE_DATA,
    FailureKind,
    UpstreamFailure,
    classify_upstream_error,
    error_text,
    text_answer,
)
from trtfleet_router.upstream.transport import Attempt

_POST_HEADERS: Final = {"Content-Type": "application/json"}
_SKIP_AUTO_HEADERS: Final = ("User-Agent", "Accept", "Accept-Encoding")
"""Upstream answers are small JSON on a local network: no compression negotiation, no default headers."""
_URL_CACHE_MAX: Final = 4096
_UNARY_HEADERS: Final = "Content-Type: application/json\r\n"
_STATUS_HINTS: Final[dict[int, FailureKind]] = {
    400: FailureKind.INVALID,
    404: FailureKind.POD_FAILED,
    503: FailureKind.QUEUE_FULL,
}


def answer_failure(status: int, message: str) -> UpstreamFailure:
    failure = classify_upstream_error(message)
    hint = _STATUS_HINTS.get(status)
    if failure.kind is FailureKind.INTERNAL and hint is not None:
        return UpstreamFailure(hint, message)
    return failure


class HttpTransport:
    label = "http"

    def __init__(self, *, enabled: bool = True) -> None:
        self.enabled = enabled
        self._session: aiohttp.ClientSession | None = None
        self._urls: dict[tuple[str, str, bool], tuple[yarl.URL, str, bytes]] = {}
        self._unary = UnaryClient()

    def _http(self) -> aiohttp.ClientSession:
        if self._session is None:
            connector = aiohttp.TCPConnector(limit=0, keepalive_timeout=60.0)
            self._session = aiohttp.ClientSession(connector=connector, skip_auto_headers=_SKIP_AUTO_HEADERS)
        return self._session

    def _url(self, address: str, model: str, stream: bool) -> tuple[yarl.URL, str, bytes]:
        """The parsed URL (aiohttp would parse the string on every request), its text for messages and
        the request head up to the Content-Length value (for :class:`~.http_client.UnaryClient`)."""
        key = (address, model, stream)
        cached = self._urls.get(key)
        if cached is None:
            if len(self._urls) >= _URL_CACHE_MAX:
                self._urls.clear()
            text = f"http://{address}/v2/models/{model}/{'generate_stream' if stream else 'generate'}"
            url = yarl.URL(text)
            head = f"POST {url.raw_path} HTTP/1.1\r\nHost: {address}\r\n{_UNARY_HEADERS}Content-Length: "
            cached = self._urls[key] = (url, text, head.encode("latin-1"))
        return cached

    def carries(self, attempt: Attempt) -> bool:
        """A warm attempt (no weights: they only travel as binary tensors over gRPC) to a pod with a known HTTP
        port, for a payload that has a generate form."""
        return (
            self.enabled
            and attempt.weights is None
            and bool(attempt.endpoint.http_address)
            and attempt.payload.generate_json() is not None
        )

    async def exchange(self, attempt: Attempt) -> AsyncGenerator[service_pb2.ModelStreamInferResponse, None]:
        """POST the payload's generate JSON to the pod's ``generate`` (``generate_stream`` when it streams);
        each answer becomes a response message by its reader (default :func:`text_answer`)."""
        generate = attempt.payload.generate_json()
        assert generate is not None
        address, model = attempt.endpoint.http_address or "", attempt.payload.model
        body, stream, read = generate.body, generate.stream, generate.reader or text_answer
        deadline_s = attempt.deadline_s
        timeout_s = deadline_s - time.monotonic()
        if timeout_s <= 0:
            raise UpstreamCallFailed(UpstreamFailure(FailureKind.TIMEOUT, "the request deadline passed"))
        parsed_url, url, head = self._url(address, model, stream)
        payload = jsoncodec.dumps(body)
        if not stream:
            with translated(url):
                request = b"%s%d\r\n\r\n%s" % (head, len(payload), payload)
                status, answer = await self._unary.post(address, request, deadline_s)
                if status != 200:
                    raise UpstreamCallFailed(answer_failure(status, error_text(answer)))
                message = read(jsoncodec.loads(answer), True)
            yield message
            return
        with translated(url):
            async with self._http().post(
                parsed_url,
                data=payload,
                headers=_POST_HEADERS,
                timeout=aiohttp.ClientTimeout(total=timeout_s),
            ) as response:
                if response.status != 200:
                    raise UpstreamCallFailed(answer_failure(response.status, error_text(await response.read())))
                async for line in response.content:
                    if not line.startswith(SSE_DATA):
                        continue
                    doc = jsoncodec.loads(line[len(SSE_DATA) :])
                    if "error" in doc:
                        yield service_pb2.ModelStreamInferResponse(error_message=str(doc["error"]))
                        return
                    yield read(doc, False)
                yield _final_only()

    async def close(self) -> None:
        self._unary.close()
        if self._session is not None:
            await self._session.close()
            await asyncio.sleep(0)


def _final_only() -> service_pb2.ModelStreamInferResponse:
    message = service_pb2.ModelStreamInferResponse()
    message.infer_response.parameters[FINAL_RESPONSE_PARAM].bool_param = True
    return message
