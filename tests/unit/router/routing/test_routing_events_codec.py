"""The peer event stream's line format: every event kind round-trips, malformed lines are refused."""

from __future__ import annotations

import pytest
from trtfleet_router.routing.events import (
    EventDecodeError,
    EventKind,
    ResidencyEvent,
    decode_event,
    encode_event,
)

EVENTS = [
    ResidencyEvent("r", 1, "m", "p0", "u", EventKind.PUT, 3, 1001, 4),
    ResidencyEvent("r", 2, "m", "p0", "u", EventKind.ACQUIRE, 4, None),
    ResidencyEvent("r", 4, "m", "p0", "u", EventKind.PUT, 5, 1001, 4, (0, 1, 2**64 - 1, 12345678901234567)),
    ResidencyEvent("r", 5, "m", "p0", "u", EventKind.ACQUIRE, 6, 1001, 0, (7,)),
    ResidencyEvent("r", 3, "base/ü", "p-1", "u-2", EventKind.POD_RESET),
]


@pytest.mark.parametrize("event", EVENTS, ids=lambda e: e.kind.value)
def test_events_round_trip(event: ResidencyEvent) -> None:
    line = encode_event(event)
    assert line.endswith(b"\n") and line.count(b"\n") == 1
    assert decode_event("r", line) == event


@pytest.mark.parametrize(
    "line",
    [
        b"{",
        b"{}",
        b"[1,2]",
        b'[1,"m","p","u","nope",0,null]',
        b'["1","m","p","u","put",0,1,1]',
        b'[1,"m","p","u","put",0,1,-1]',
        b'[1,"m","p","u","put",0,1,1,"not base64!"]',
        b'[1,"m","p","u","put",0,1,1,"AAAA"]',
        b'[1,"m","p","u","put",0,1,1,[1,2]]',
    ],
)
def test_malformed_event_lines_are_refused(line: bytes) -> None:
    with pytest.raises(EventDecodeError):
        decode_event("r", line)
