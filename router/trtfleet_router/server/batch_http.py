"""OpenAI's Files and Batches API: ``/v1/files`` and ``/v1/batches`` (on when ``--batch-store`` is set).

``POST /v1/files`` (multipart ``file`` + ``purpose=batch``, streamed, up to ``max_file_bytes``),
``GET /v1/files``, ``GET /v1/files/{id}``, ``GET /v1/files/{id}/content``, ``DELETE /v1/files/{id}``;
``POST /v1/batches``, ``GET /v1/batches`` (``limit``, ``after``), ``GET /v1/batches/{id}``,
``POST /v1/batches/{id}/cancel``. Errors carry OpenAI's
body; :func:`_translate` turns the batch layer's errors into the router's tree (one place).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any, Final

from aiohttp import BodyPartReader, MultipartReader, web

from trtfleet.batch.errors import BatchLayerError, InvalidBatchRequest, NotFound
from trtfleet.batch.records import FileRecord
from trtfleet.batch.service import LIST_LIMIT_DEFAULT, BatchService
from trtfleet_router.errors import (
    BodyTooLarge,
    MalformedRequest,
    ObjectNotFound,
    RequestError,
    RequestTimeout,
    RouterError,
)
from trtfleet_router.server.auth import Principal, presented_key
from trtfleet_router.server.common import Services, read_json_body
from trtfleet_router.server.openai_http import error_response, json_response

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
MAX_FILE_BYTES_DEFAULT: Final = 200 * 1024 * 1024
"""OpenAI's limit for a batch input file."""
UPLOAD_CHUNK_BYTES: Final = 1024 * 1024
PRINCIPAL: Final = web.RequestKey("principal", Principal)


def _allowed_models(request: web.Request) -> tuple[str, ...] | None:
    principal = request.get(PRINCIPAL)
    if principal is None or principal.models is None:
        return None
    return tuple(sorted(principal.models))


def _caller(request: web.Request) -> str | None:
    """Who asks: the sha256 of the API key (None with keys off: every object is visible)."""
    principal = request.get(PRINCIPAL)
    return None if principal is None else principal.owner


def _translate(exc: BatchLayerError) -> RouterError:
    if isinstance(exc, NotFound):
        return ObjectNotFound(exc.message, param=exc.param, code=exc.code)
    if isinstance(exc, InvalidBatchRequest):
        return RequestError(exc.message, param=exc.param, code=exc.code)
    return RouterError(f"batch store: {exc.message}")


def _list(data: list[dict[str, Any]], has_more: bool) -> dict[str, Any]:
    return {
        "object": "list",
        "data": data,
        "first_id": data[0]["id"] if data else None,
        "last_id": data[-1]["id"] if data else None,
        "has_more": has_more,
    }


def _limit(request: web.Request) -> int:
    raw = request.query.get("limit", str(LIST_LIMIT_DEFAULT))
    try:
        return int(raw)
    except ValueError as exc:
        raise MalformedRequest(f"limit must be an integer, not {raw!r}", param="limit") from exc


class BatchFrontend:
    def __init__(self, services: Services, batches: BatchService, max_file_bytes: int = MAX_FILE_BYTES_DEFAULT) -> None:
        self.services = services
        self.batches = batches
        self.max_file_bytes = max_file_bytes

    def routes(self) -> list[web.RouteDef]:
        h = self._handler
        return [
            web.post("/v1/files", h(self.upload)),
            web.get("/v1/files", h(self.list_files)),
            web.get("/v1/files/{file_id}", h(self.file)),
            web.get("/v1/files/{file_id}/content", h(self.content)),
            web.delete("/v1/files/{file_id}", h(self.delete_file)),
            web.post("/v1/batches", h(self.create)),
            web.get("/v1/batches", h(self.list_batches)),
            web.get("/v1/batches/{batch_id}", h(self.batch)),
            web.post("/v1/batches/{batch_id}/cancel", h(self.cancel)),
        ]

    def _handler(self, handler: Handler) -> Handler:
        """API keys (when configured: any valid key may use the endpoints; files and batches are private to
        the key that created them, others get 404; a batch's lines may use only the models of the key that
        created it), then the errors as OpenAI's bodies."""

        async def handle(request: web.Request) -> web.StreamResponse:
            try:
                if self.services.api_keys is not None:
                    request[PRINCIPAL] = self.services.api_keys.authenticate(presented_key(request.headers))
                try:
                    return await handler(request)
                except BatchLayerError as exc:
                    raise _translate(exc) from exc
            except RouterError as exc:
                return error_response(exc)

        return handle

    # -- files -----------------------------------------------------------------------------------------
    async def upload(self, request: web.Request) -> web.StreamResponse:
        """The multipart form read as a stream: the file may exceed ``--max-body-bytes`` up to
        ``max_file_bytes``; a stall of ``--body-timeout-s`` between two chunks is answered 408."""
        try:
            reader = await request.multipart()
        except (AssertionError, ValueError, KeyError) as exc:  # aiohttp's answers to a non-multipart body
            raise MalformedRequest(f"the upload must be multipart/form-data: {exc}") from exc
        fields: dict[str, str] = {}
        filename, data = None, None
        try:
            while (part := await self._next_part(reader)) is not None:
                if part.name == "file":
                    filename, data = part.filename or "upload.jsonl", await self._read_file(part)
                elif part.name:
                    fields[part.name] = (await self._read_file(part)).decode("utf-8", errors="replace").strip()
        except ValueError as exc:  # a malformed multipart body
            raise MalformedRequest(f"the multipart body is malformed: {exc}") from exc
        except TimeoutError as exc:
            limit_s = self.services.settings.body_timeout_s
            raise RequestTimeout(f"the upload stalled for {limit_s:g} s") from exc
        if data is None:
            raise MalformedRequest("the form needs a 'file' part with the JSONL file", param="file")
        if "purpose" not in fields:
            raise MalformedRequest("the form needs a 'purpose' field", param="purpose")
        record = await self.batches.upload(
            filename=filename or "upload.jsonl", purpose=fields["purpose"], data=data, owner=_caller(request)
        )
        return json_response(record.to_openai())

    async def _next_part(self, reader: MultipartReader) -> BodyPartReader | None:
        async with self._stall_limit():
            part = await reader.next()
        if part is not None and not isinstance(part, BodyPartReader):
            raise MalformedRequest("nested multipart bodies are not accepted")
        return part

    async def _read_file(self, part: BodyPartReader) -> bytes:
        chunks: list[bytes] = []
        size = 0
        while True:
            async with self._stall_limit():
                chunk = await part.read_chunk(UPLOAD_CHUNK_BYTES)
            if not chunk:
                return b"".join(chunks)
            size += len(chunk)
            if size > self.max_file_bytes:
                raise BodyTooLarge(f"the file exceeds the upload limit of {self.max_file_bytes} bytes", param="file")
            chunks.append(chunk)

    def _stall_limit(self) -> asyncio.Timeout:
        return asyncio.timeout(self.services.settings.body_timeout_s)

    async def list_files(self, request: web.Request) -> web.StreamResponse:
        records = await self.batches.files(request.query.get("purpose"), _caller(request))
        limit, after = _limit(request), request.query.get("after")
        start = next((i + 1 for i, r in enumerate(records) if r.id == after), 0) if after else 0
        page: list[FileRecord] = records[start : start + limit]
        return json_response(_list([r.to_openai() for r in page], start + limit < len(records)))

    async def file(self, request: web.Request) -> web.StreamResponse:
        return json_response((await self.batches.file(request.match_info["file_id"], _caller(request))).to_openai())

    async def content(self, request: web.Request) -> web.StreamResponse:
        data = await self.batches.file_content(request.match_info["file_id"], _caller(request))
        return web.Response(body=data, content_type="application/octet-stream")

    async def delete_file(self, request: web.Request) -> web.StreamResponse:
        file_id = request.match_info["file_id"]
        await self.batches.delete_file(file_id, _caller(request))
        return json_response({"id": file_id, "object": "file", "deleted": True})

    # -- batches ---------------------------------------------------------------------------------------
    async def create(self, request: web.Request) -> web.StreamResponse:
        services = self.services
        limit = services.body_limit(presented_key(request.headers))
        body = await read_json_body(request, limit, services.settings.body_timeout_s)
        if not isinstance(body, dict):
            raise MalformedRequest("the request body must be a JSON object")
        for required in ("input_file_id", "endpoint", "completion_window"):
            if required not in body:
                raise MalformedRequest(f"Missing required parameter: '{required}'.", param=required)
        record = await self.batches.create(
            endpoint=body["endpoint"],
            input_file_id=body["input_file_id"],
            completion_window=body["completion_window"],
            metadata=body.get("metadata"),
            allowed_models=_allowed_models(request),
            owner=_caller(request),
        )
        return json_response(record.to_openai())

    async def list_batches(self, request: web.Request) -> web.StreamResponse:
        page, has_more = await self.batches.batches(
            limit=_limit(request), after=request.query.get("after"), caller=_caller(request)
        )
        return json_response(_list([r.to_openai() for r in page], has_more))

    async def batch(self, request: web.Request) -> web.StreamResponse:
        return json_response((await self.batches.batch(request.match_info["batch_id"], _caller(request))).to_openai())

    async def cancel(self, request: web.Request) -> web.StreamResponse:
        return json_response((await self.batches.cancel(request.match_info["batch_id"], _caller(request))).to_openai())
