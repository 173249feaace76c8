"""SSE framing."""

from __future__ import annotations

import json

import pytest
from trtfleet_router.server.sse import DONE_EVENT, encode_event, json_event, parse_events


def test_event_framing() -> None:
    assert encode_event(b'{"a":1}') == b'data: {"a":1}\n\n'
    assert DONE_EVENT == b"data: [DONE]\n\n"


def test_json_event_is_one_line_even_with_newlines_in_text() -> None:
    event = json_event({"text": "line one\nline two", "emoji": "é"})
    assert event.count(b"\n") == 2 and event.endswith(b"\n\n")
    assert json.loads(event[len(b"data: ") : -2]) == {"text": "line one\nline two", "emoji": "é"}


def test_multiline_payload_rejected() -> None:
    with pytest.raises(ValueError, match="single line"):
        encode_event(b"a\nb")


def test_parse_roundtrip() -> None:
    stream = json_event({"n": 1}) + json_event({"n": 2}) + DONE_EVENT
    assert parse_events(stream) == [b'{"n":1}', b'{"n":2}', b"[DONE]"]
