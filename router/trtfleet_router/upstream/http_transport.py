"""Warm text requests over Triton's HTTP generate extension (aiohttp, all on the event loop).

Measured on the project's 2-core machine against the echo upstream: a grpc.aio ``ModelStreamInfer``
round trip costs about 290 us of router CPU and ~1 ms of latency (every message crosses grpc's poller
thread and wakes the event loop), an aiohttp keep-alive POST about 175 us and ~0.25 ms. So requests
that carry no weights (the warm majority) may use ``POST /v2/models/{m}/generate`` (one JSON answer)
or ``/generate_stream`` (SSE, ``data: {json}`` per piece, errors as ``data: {"error": ...}``) when the
pod's HTTP port is known; requests with weights always use gRPC, since LoRA weights cannot travel as
JSON. Answers come back as the same ``ModelStreamInferResponse`` messages the gRPC transports yield,
so the dispatcher's miss recovery and retries do not care which transport carried an attempt.

Errors: a non-200 status or an SSE error event carries Triton's ``{"error": "<text>"}``, classified by
text like gRPC errors (400 counts as invalid, 503 as a full queue); a refused or broken connection is
a pod failure. Closing the connection (the client went away) is Triton's cancellation signal for HTTP.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncGenerator, Mapping
from typing import Any, Final

import aiohttp
from tritonclient.grpc import service_pb2

from trtfleet_router.upstream.protocol import (
    FINAL_RESPONSE_PARAM,
    FailureKind,
    UpstreamFailure,
    classify_upstream_error,
)
from trtfleet_router.upstream.tensors import encode_bytes
from trtfleet_router.upstream.transport import TransportError

SSE_DATA: Final = b"data:"
_STATUS_HINTS: Final[dict[int, FailureKind]] = {
    400: FailureKind.INVALID,
    404: FailureKind.POD_FAILED,
    503: FailureKind.QUEUE_FULL,
}


def text_message(text: str, *, final: bool, request_id: str = "") -> service_pb2.ModelStreamInferResponse:
    response = service_pb2.ModelInferResponse(id=request_id)
    response.outputs.add(name="text_output", datatype="BYTES", shape=[1, 1])
    response.raw_output_contents.append(encode_bytes((text.encode("utf-8"),)))
    response.parameters[FINAL_RESPONSE_PARAM].bool_param = final
    return service_pb2.ModelStreamInferResponse(infer_response=response)


def _failure(status: int, message: str) -> UpstreamFailure:
    failure = classify_upstream_error(message)
    hint = _STATUS_HINTS.get(status)
    if failure.kind is FailureKind.INTERNAL and hint is not None:
        return UpstreamFailure(hint, message)
    return failure


def _error_text(body: bytes) -> str:
    try:
        doc = json.loads(body)
    except ValueError:
        return body.decode("utf-8", errors="replace")[:1000]
    error = doc.get("error") if isinstance(doc, dict) else None
    return str(error) if error is not None else body.decode("utf-8", errors="replace")[:1000]


class HttpTransport:
    def __init__(self) -> None:
        self._session: aiohttp.ClientSession | None = None

    def _http(self) -> aiohttp.ClientSession:
        if self._session is None:
            connector = aiohttp.TCPConnector(limit=0, keepalive_timeout=60.0)
            self._session = aiohttp.ClientSession(connector=connector, skip_auto_headers=("User-Agent",))
        return self._session

    async def exchange(
        self, address: str, model: str, body: Mapping[str, Any], deadline_s: float, *, stream: bool
    ) -> AsyncGenerator[service_pb2.ModelStreamInferResponse, None]:
        timeout_s = deadline_s - time.monotonic()
        if timeout_s <= 0:
            raise TransportError(UpstreamFailure(FailureKind.TIMEOUT, "the request deadline passed"))
        url = f"http://{address}/v2/models/{model}/{'generate_stream' if stream else 'generate'}"
        payload = json.dumps(body, separators=(",", ":")).encode("utf-8")
        try:
            async with self._http().post(
                url,
                data=payload,
                headers={"Content-Type": "application/json"},
                timeout=aiohttp.ClientTimeout(total=timeout_s),
            ) as response:
                if response.status != 200:
                    raise TransportError(_failure(response.status, _error_text(await response.read())))
                if not stream:
                    doc = json.loads(await response.read())
                    yield text_message(str(doc.get("text_output", "")), final=True)
                    return
                async for line in response.content:
                    if not line.startswith(SSE_DATA):
                        continue
                    doc = json.loads(line[len(SSE_DATA) :])
                    if "error" in doc:
                        yield service_pb2.ModelStreamInferResponse(error_message=str(doc["error"]))
                        return
                    yield text_message(str(doc.get("text_output", "")), final=False)
                yield service_pb2.ModelStreamInferResponse(infer_response=_final_only())
        except (aiohttp.ClientConnectionError, aiohttp.ClientPayloadError) as exc:
            raise TransportError(UpstreamFailure(FailureKind.POD_FAILED, f"{url}: {exc}")) from exc
        except TimeoutError as exc:
            raise TransportError(UpstreamFailure(FailureKind.TIMEOUT, f"no answer from {url} in time")) from exc
        except ValueError as exc:
            raise TransportError(UpstreamFailure(FailureKind.INTERNAL, f"{url}: bad answer: {exc}")) from exc

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            await asyncio.sleep(0)


def _final_only() -> service_pb2.ModelInferResponse:
    response = service_pb2.ModelInferResponse()
    response.parameters[FINAL_RESPONSE_PARAM].bool_param = True
    return response
