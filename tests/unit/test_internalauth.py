"""The shared internal credential (``trtfleet.internalauth``): the token file, its re-reading as the kubelet
updates a mounted Secret, the constant-time check, and the client that survives a rotation."""

from __future__ import annotations

import asyncio
import logging
import os
from pathlib import Path

import aiohttp
import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer

from trtfleet.internalauth import (
    REREAD_S,
    TokenFile,
    TokenFileError,
    authorized_get,
    parse_tokens,
    presented_bearer,
)

OLD = "old-token-0123456789abcdef"
NEW = "new-token-fedcba9876543210"


@pytest.mark.parametrize(
    ("text", "tokens"),
    [
        pytest.param(f"{NEW}\n", (NEW,), id="one"),
        pytest.param(f"# rotating\n\n  {NEW}  \n{OLD}\n", (NEW, OLD), id="comment, blank line, spaces"),
        pytest.param(f"{NEW}\r\n{OLD}", (NEW, OLD), id="CRLF, no final newline"),
    ],
)
def test_a_token_file_lists_tokens_in_order(text: str, tokens: tuple[str, ...]) -> None:
    assert parse_tokens(text, "f") == tokens


@pytest.mark.parametrize(
    ("text", "message"),
    [
        pytest.param("", "lists no token", id="empty"),
        pytest.param("# only a comment\n\n", "lists no token", id="comments only"),
        pytest.param(f"{NEW}\nshort\n", "token 2 has fewer than 16", id="a short token"),
    ],
)
def test_a_token_file_without_a_usable_token_is_refused(text: str, message: str) -> None:
    with pytest.raises(TokenFileError, match=message) as caught:
        parse_tokens(text, "f")
    assert NEW not in str(caught.value)  # errors name the file, never a token


def test_an_unreadable_token_file_stops_the_start(tmp_path: Path) -> None:
    with pytest.raises(TokenFileError, match="cannot read the token file"):
        TokenFile(tmp_path / "missing")


def _mounted_secret(directory: Path, text: str, version: int) -> Path:
    """The kubelet's layout of a Secret volume: ``tokens -> ..data/tokens``, ``..data -> ..<version>``; an
    update writes a new version directory and swaps the ``..data`` link atomically."""
    target = directory / f"..v{version}"
    target.mkdir()
    (target / "tokens").write_text(text)
    link = directory / "..data_tmp"
    link.symlink_to(target.name)
    os.replace(link, directory / "..data")
    if not (directory / "tokens").is_symlink():
        (directory / "tokens").symlink_to("..data/tokens")
    return directory / "tokens"


def test_the_file_is_read_again_when_the_secret_changes(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    path = _mounted_secret(tmp_path, f"{OLD}\n", 1)
    tokens = TokenFile(path)
    assert tokens.tokens() == (OLD,) and tokens.accepts(OLD) and not tokens.accepts(NEW)
    with caplog.at_level(logging.DEBUG):
        _mounted_secret(tmp_path, f"{NEW}\n{OLD}\n", 2)  # rotation, step 1: the new one first, the old kept
        assert tokens.tokens() == (NEW, OLD) and tokens.accepts(NEW) and tokens.accepts(OLD)
        _mounted_secret(tmp_path, f"{NEW}\n", 3)  # step 2: the old one gone
        assert tokens.tokens() == (NEW,) and not tokens.accepts(OLD)
        _mounted_secret(tmp_path, "\n", 4)  # a broken update: the tokens read last stay
        assert tokens.tokens() == (NEW,) and tokens.accepts(NEW)
    assert all(NEW not in r.getMessage() + str(r.__dict__) and OLD not in str(r.__dict__) for r in caplog.records)
    assert [r.getMessage() for r in caplog.records].count("token file changed: tokens re-read") == 2


@pytest.mark.parametrize(
    ("presented", "accepted"),
    [
        pytest.param(NEW, True, id="the current token"),
        pytest.param(OLD, True, id="the previous token"),
        pytest.param(NEW[:-1], False, id="one character short"),
        pytest.param(NEW + "x", False, id="one character more"),
        pytest.param("", False, id="empty"),
        pytest.param(None, False, id="none"),
        pytest.param("\udcff" * 20, False, id="not encodable as UTF-8"),
    ],
)
def test_a_presented_token_is_one_of_the_listed(tmp_path: Path, presented: str | None, accepted: bool) -> None:
    path = tmp_path / "tokens"
    path.write_text(f"{NEW}\n{OLD}\n")
    assert TokenFile(path).accepts(presented) is accepted


@pytest.mark.parametrize(
    ("headers", "token"),
    [
        pytest.param({"Authorization": f"Bearer {NEW}"}, NEW, id="bearer"),
        pytest.param({"authorization": f"bearer  {NEW} "}, NEW, id="lower case, spaces"),
        pytest.param({"Authorization": f"Basic {NEW}"}, None, id="another scheme"),
        pytest.param({"Authorization": "Bearer "}, None, id="no token"),
        pytest.param({}, None, id="no header"),
    ],
)
def test_the_bearer_token_of_a_request(headers: dict[str, str], token: str | None) -> None:
    assert presented_bearer(headers) == token


def test_a_client_that_read_the_new_file_first_still_gets_through(tmp_path: Path) -> None:
    """During a rotation one process may send the new token to another that accepts only the old one yet: the
    401 is asked again with the next token of the file, and the answer comes back, nothing lost."""
    server_file, client_file = tmp_path / "server", tmp_path / "client"
    server_file.write_text(f"{OLD}\n")
    client_file.write_text(f"{NEW}\n{OLD}\n")
    seen: list[str | None] = []

    async def handler(request: web.Request) -> web.Response:
        presented = presented_bearer(request.headers)
        seen.append(presented)
        if not TokenFile(server_file).accepts(presented):
            raise web.HTTPUnauthorized()
        return web.json_response({"ok": True})

    async def scenario() -> None:
        app = web.Application()
        app.router.add_get("/x", handler)
        async with TestServer(app) as server, aiohttp.ClientSession() as session:
            url = str(server.make_url("/x"))
            async with authorized_get(session, url, TokenFile(client_file)) as response:
                assert response.status == 200 and await response.json() == {"ok": True}
            assert seen == [NEW, OLD]
            server_file.write_text("wrong-token-for-everyone-here\n")
            async with authorized_get(session, url, TokenFile(client_file)) as response:
                assert response.status == 401  # every token tried: the last answer is the caller's
            async with authorized_get(session, url, None) as response:
                assert response.status == 401 and seen[-1] is None  # no file: no header

    asyncio.run(scenario())


def test_an_edit_that_keeps_the_files_identity_is_read_within_the_reread_interval(tmp_path: Path) -> None:
    path = tmp_path / "tokens"
    path.write_text(f"{OLD}\n")
    frozen = path.stat()  # an edit in place within the timestamp granularity: the same inode, size and mtime
    clock = [0.0]
    tokens = TokenFile(path, stat=lambda _: frozen, now=lambda: clock[0])
    path.write_text(f"{NEW}\n")
    clock[0] = REREAD_S / 2
    assert tokens.tokens() == (OLD,)
    clock[0] = REREAD_S
    assert tokens.tokens() == (NEW,)
