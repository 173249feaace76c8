"""Attempts over trtllm-serve's OpenAI API (runtime ``pytorch``): POSTs over aiohttp keep-alive connections.

The request and answer formats, and how an error answer is classified, are :mod:`.openai_upstream`'s.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncGenerator
from typing import Final

import aiohttp
from tritonclient.grpc import service_pb2

from trtfleet_router import jsoncodec
from trtfleet_router.upstream.failures import UpstreamCallFailed, translated
from trtfleet_router.upstream.openai_upstream import (
    DONE,
    HEALTH_PATH,
    HEALTH_TIMEOUT_S,
    choice_text,
    classify_answer,
    piece_message,
)
from trtfleet_router.upstream.protocol import SSE_DATA, FailureKind, UpstreamFailure, error_text
from trtfleet_router.upstream.transport import Attempt

_HEADERS: Final = {"Content-Type": "application/json"}


class OpenAITransport:
    """POSTs to trtllm-serve pods over aiohttp (keep-alive); one connection per attempt in flight."""

    label = "openai"

    def __init__(self) -> None:
        self._session: aiohttp.ClientSession | None = None

    def _http(self) -> aiohttp.ClientSession:
        if self._session is None:
            connector = aiohttp.TCPConnector(limit=0, keepalive_timeout=60.0)
            self._session = aiohttp.ClientSession(connector=connector)
        return self._session

    async def healthy(self, address: str) -> bool:
        """``GET /health`` answers 200 (trtllm-serve: 503 while the engine is unavailable)."""
        try:
            async with self._http().get(
                f"http://{address}{HEALTH_PATH}", timeout=aiohttp.ClientTimeout(total=HEALTH_TIMEOUT_S)
            ) as response:
                return response.status == 200
        except (aiohttp.ClientError, OSError, TimeoutError):
            return False

    async def _failed(self, address: str, failure: UpstreamFailure) -> UpstreamCallFailed:
        """The error answer's failure, the pod's when its health check fails."""
        if failure.kind in (FailureKind.INVALID, FailureKind.INTERNAL) and not await self.healthy(address):
            failure = UpstreamFailure(FailureKind.POD_FAILED, f"pod {address} is not healthy: {failure.message}")
        return UpstreamCallFailed(failure)

    def carries(self, attempt: Attempt) -> bool:
        return attempt.payload.openai_json() is not None

    async def exchange(self, attempt: Attempt) -> AsyncGenerator[service_pb2.ModelStreamInferResponse, None]:
        wire = attempt.payload.openai_json()
        assert wire is not None
        address = attempt.endpoint.http_address or attempt.endpoint.address
        path, body, stream = wire.path, wire.body, wire.stream
        timeout_s = attempt.deadline_s - time.monotonic()
        if timeout_s <= 0:
            raise UpstreamCallFailed(UpstreamFailure(FailureKind.TIMEOUT, "the request deadline passed"))
        url = f"http://{address}{path}"
        with translated(url):
            async with self._http().post(
                url, data=jsoncodec.dumps(body), headers=_HEADERS, timeout=aiohttp.ClientTimeout(total=timeout_s)
            ) as response:
                if response.status != 200:
                    answer = await response.read()
                    raise await self._failed(address, classify_answer(response.status, error_text(answer)))
                if not stream:
                    doc = jsoncodec.loads(await response.read())
                    if not isinstance(doc, dict):  # trtllm-serve answers null when its executor stopped
                        failure = UpstreamFailure(FailureKind.POD_FAILED, f"pod {address} answered {doc!r}")
                        raise UpstreamCallFailed(failure)
                    yield piece_message(choice_text(doc), doc.get("usage"))
                    return
                async for line in response.content:
                    if not line.startswith(SSE_DATA):
                        continue
                    data = line[len(SSE_DATA) :].strip()
                    if data == DONE:
                        return
                    doc = jsoncodec.loads(data)
                    if isinstance(doc, dict) and "error" in doc:
                        raise await self._failed(address, classify_answer(400, error_text(data)))
                    if isinstance(doc, dict):
                        yield piece_message(choice_text(doc), doc.get("usage"))
        failure = UpstreamFailure(FailureKind.POD_FAILED, f"pod {address} ended the stream before [DONE]")
        raise UpstreamCallFailed(failure)

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            await asyncio.sleep(0)
