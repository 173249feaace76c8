"""Output tokens of a trtllm-serve answer as the picker sees it stream past: what the request's tenant is charged.

The picker never parses an answer's JSON (it only rewrites model names), so it counts: in a streamed answer each
event with a choice (``"choices":[{``, trtllm-serve's compact JSON) as one token, as the pod sends an event per
step; a ``usage`` with ``completion_tokens`` (a unary answer's, or a stream's last event when the client asked for
it) replaces the count with the engine's. A pattern split across two chunks is still found (the meter keeps the
tail of the previous chunk).
"""

from __future__ import annotations

import re
from typing import Final

CHOICE: Final = b'"choices":[{'
COMPLETION_TOKENS: Final = re.compile(rb'"completion_tokens":\s*(\d+)')
_TAIL_BYTES: Final = 48


class ChunkMeter:
    """Counts output tokens in response body chunks; :meth:`feed` returns those a chunk added."""

    __slots__ = ("_counted", "_tail")

    def __init__(self) -> None:
        self._counted = 0
        self._tail = b""

    @property
    def counted(self) -> int:
        return self._counted

    def feed(self, chunk: bytes) -> int:
        if not chunk:
            return 0
        window = self._tail + chunk
        skip = len(self._tail)
        usage = COMPLETION_TOKENS.search(window)
        if usage is not None:
            total = int(usage.group(1))
        else:  # events whose pattern ends inside this chunk (one that ended in the tail was counted already)
            total = self._counted + sum(
                1 for match in re.finditer(re.escape(CHOICE), window) if match.end() > skip
            )
        self._tail = window[-_TAIL_BYTES:]
        added = max(0, total - self._counted)
        self._counted = max(self._counted, total)
        return added
