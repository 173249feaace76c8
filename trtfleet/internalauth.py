"""The credential between trtfleet's own parts: bearer tokens shared through a file (a mounted Secret).

It guards the router's internal endpoints: the peer port (replicas stream events to each other, the operator
reads demand and held requests there) and the debug endpoints. The router checks it, the other replicas and the
operator send it. Clients send ``Authorization: Bearer <token>``.

The file lists one token per line (blank lines and lines starting with ``#`` are ignored). Every listed token is
accepted; the first is the one this process sends, and a request answered 401 is tried again with the next ones,
so two processes that read different versions of the file during a rotation still understand each other. The
file is re-read when it changes (its inode, size or modification time), as the kubelet updates a mounted Secret
in place: a rotation needs no restart (docs/security.md says how).

Presented tokens are compared with every listed one through their SHA-256 digests and
:func:`hmac.compare_digest`, so the time a check takes says nothing about how close a guess was. Tokens never
appear in a log line or an error message; errors name the file only.

Errors: :class:`TokenFileError` (a ``ValueError``): the file cannot be read or lists no usable token.
"""

from __future__ import annotations

import hashlib
import hmac
import logging
import os
import time
from collections.abc import AsyncIterator, Callable, Mapping
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any, Final

import aiohttp

log = logging.getLogger(__name__)

TOKEN_CHARS_MIN: Final = 16
"""A shorter token is refused: the chart generates 48 random characters."""
REREAD_S: Final = 10.0
"""The file is read again at least this often even when it looks unchanged (an edit in place within the file
system's timestamp granularity keeps its inode, size and modification time)."""
AUTHORIZATION: Final = "Authorization"
BEARER_REALM: Final = 'Bearer realm="trtfleet-internal"'
"""The ``WWW-Authenticate`` value of a 401 from an internal endpoint."""


class TokenFileError(ValueError):
    """The token file cannot be read, or lists no token of at least :data:`TOKEN_CHARS_MIN` characters."""


def parse_tokens(text: str, source: str) -> tuple[str, ...]:
    """The tokens a file's ``text`` lists, in order (``source``: the file, for the error message)."""
    tokens = tuple(
        line.strip() for line in text.splitlines() if line.strip() and not line.strip().startswith("#")
    )
    if not tokens:
        raise TokenFileError(f"{source}: lists no token (one per line)")
    short = [index + 1 for index, token in enumerate(tokens) if len(token) < TOKEN_CHARS_MIN]
    if short:
        raise TokenFileError(f"{source}: token {short[0]} has fewer than {TOKEN_CHARS_MIN} characters")
    return tokens


def _digest(token: str) -> bytes:
    return hashlib.sha256(token.encode("utf-8", "surrogatepass")).digest()


class TokenFile:
    """The tokens of one file, read again when the file changes. ``stat`` and ``read`` are injectable for
    tests; by default the file system's; ``now`` the clock of :data:`REREAD_S`."""

    def __init__(
        self,
        path: Path,
        *,
        stat: Callable[[Path], os.stat_result] = os.stat,
        read: Callable[[Path], str] = lambda path: path.read_text(encoding="utf-8"),
        now: Callable[[], float] = time.monotonic,
    ) -> None:
        self.path = path
        self._stat = stat
        self._read = read
        self._now = now
        self._read_at_s = float("-inf")
        self._seen: tuple[int, int, int] | None = None
        self._tokens: tuple[str, ...] = ()
        self._digests: tuple[bytes, ...] = ()
        self._refresh(strict=True)

    def _refresh(self, *, strict: bool) -> None:
        """Re-read the file when its identity changed. ``strict``: a failure raises (at start); otherwise the
        tokens read last stay (the kubelet swaps a Secret's files through a symlink, so a read can fall between)."""
        try:
            info = self._stat(self.path)
            seen = (info.st_ino, info.st_size, info.st_mtime_ns)
            now_s = self._now()
            if seen == self._seen and now_s - self._read_at_s < REREAD_S:
                return
            self._read_at_s = now_s
            tokens = parse_tokens(self._read(self.path), str(self.path))
            if seen == self._seen and tokens == self._tokens:
                return
        except (OSError, UnicodeDecodeError, TokenFileError) as exc:
            if strict:
                if isinstance(exc, TokenFileError):
                    raise
                raise TokenFileError(f"{self.path}: cannot read the token file ({type(exc).__name__})") from exc
            log.warning("token file not re-read: the tokens read before stay", extra={"path": str(self.path)})
            return
        if self._seen is not None:
            log.info("token file changed: tokens re-read", extra={"path": str(self.path), "tokens": len(tokens)})
        self._seen, self._tokens = seen, tokens
        self._digests = tuple(_digest(token) for token in tokens)

    def tokens(self) -> tuple[str, ...]:
        """Every token the file lists now, the one to send first."""
        self._refresh(strict=False)
        return self._tokens

    def accepts(self, presented: str | None) -> bool:
        """Whether ``presented`` is one of the listed tokens (each compared, in constant time)."""
        self._refresh(strict=False)
        if not presented:
            return False
        digest = _digest(presented)
        matched = False
        for known in self._digests:
            matched |= hmac.compare_digest(known, digest)
        return matched


def presented_bearer(headers: Mapping[str, str]) -> str | None:
    """The token of an ``Authorization: Bearer <token>`` header (None without one)."""
    value = headers.get(AUTHORIZATION) or headers.get(AUTHORIZATION.lower())
    if not value:
        return None
    scheme, _, token = value.partition(" ")
    if scheme.lower() != "bearer":
        return None
    return token.strip() or None


def bearer_header(token: str) -> dict[str, str]:
    return {AUTHORIZATION: f"Bearer {token}"}


@asynccontextmanager
async def authorized_get(
    session: aiohttp.ClientSession, url: str, tokens: TokenFile | None, **kwargs: Any
) -> AsyncIterator[aiohttp.ClientResponse]:
    """``session.get(url, **kwargs)`` with this process's token; a 401 is asked again with each further token
    the file lists (a peer that has not seen the newest file yet), and the last answer is the one yielded.
    Without ``tokens``, no header is sent."""
    candidates: tuple[str | None, ...] = tokens.tokens() if tokens is not None else (None,)
    headers = dict(kwargs.pop("headers", None) or {})
    for index, token in enumerate(candidates):
        if token is not None:
            headers.update(bearer_header(token))
        async with session.get(url, headers=headers, **kwargs) as response:
            if response.status == 401 and index + 1 < len(candidates):
                continue
            yield response
            return
