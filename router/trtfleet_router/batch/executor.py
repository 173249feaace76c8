"""Batch lines through the router's own OpenAI path (no HTTP to itself): parse, resolve, dispatch."""

from __future__ import annotations

from typing import Any, Final, Protocol

from trtfleet.batch.lines import BatchLine
from trtfleet.batch.runner import Answer
from trtfleet_router.errors import RetryableError, RouterError, mapping_for, openai_error_body

CHAT_ENDPOINT: Final = "/v1/chat/completions"


class UnaryAnswerer(Protocol):
    async def answer(self, body: Any, *, chat: bool, request_id: str) -> dict[str, Any]: ...


class DispatchExecutor:
    """Runs a line as the OpenAI front end runs a non-streamed request; a retryable router error (busy,
    no pod, draining) asks the runner to run the line again later instead of answering it."""

    def __init__(self, frontend: UnaryAnswerer) -> None:
        self.frontend = frontend

    async def execute(self, endpoint: str, item: BatchLine, request_id: str) -> Answer:
        try:
            body = await self.frontend.answer(dict(item.body), chat=endpoint == CHAT_ENDPOINT, request_id=request_id)
        except RouterError as exc:
            retry_after_s = float(exc.retry_after_s) if isinstance(exc, RetryableError) else None
            return Answer(mapping_for(exc).http_status, openai_error_body(exc), request_id, retry_after_s)
        return Answer(200, body, request_id)
