"""Server-sent events framing (pure) and a lazily started SSE response for aiohttp.

An event is ``data: <payload>\\n\\n``; payloads are single-line JSON, so no event ever needs to be
split over several ``data:`` lines. OpenAI streams end with ``data: [DONE]``; Triton's
``generate_stream`` has no terminator.

:class:`LazySse` sends the response headers only when the first event is written, so a request
that fails before producing anything still gets a proper HTTP error status instead of a 200 stream.
"""

from __future__ import annotations

from typing import Any, Final

from aiohttp import web

from trtfleet_router import jsoncodec

DONE_EVENT: Final = b"data: [DONE]\n\n"
SSE_HEADERS: Final = {
    "Content-Type": "text/event-stream; charset=utf-8",
    "Cache-Control": "no-cache",
    "X-Accel-Buffering": "no",
}


def encode_event(payload: bytes) -> bytes:
    """One SSE event carrying ``payload`` (which must not contain a newline)."""
    if b"\n" in payload or b"\r" in payload:
        raise ValueError("an SSE data payload must be a single line")
    return b"data: " + payload + b"\n\n"


def json_event(obj: Any) -> bytes:
    return encode_event(jsoncodec.dumps(obj))


def parse_events(stream: bytes) -> list[bytes]:
    """The ``data`` payloads of a complete SSE byte stream (for tests and the bench)."""
    payloads = []
    for block in stream.split(b"\n\n"):
        lines = [line[5:].lstrip(b" ") for line in block.split(b"\n") if line.startswith(b"data:")]
        if lines:
            payloads.append(b"\n".join(lines))
    return payloads


class LazySse:
    """An SSE response that is prepared on the first write."""

    def __init__(self, request: web.Request, headers: dict[str, str] | None = None) -> None:
        self.request = request
        self.headers = {**SSE_HEADERS, **(headers or {})}
        self.response: web.StreamResponse | None = None

    @property
    def started(self) -> bool:
        return self.response is not None

    async def send(self, event: bytes) -> None:
        if self.response is None:
            self.response = web.StreamResponse(status=200, headers=self.headers)
            self.response.enable_chunked_encoding()
            await self.response.prepare(self.request)
        await self.response.write(event)

    async def finish(self) -> web.StreamResponse:
        if self.response is None:
            self.response = web.StreamResponse(status=200, headers=self.headers)
            await self.response.prepare(self.request)
        await self.response.write_eof()
        return self.response
