"""The peer event stream's line format: every event kind round-trips, malformed lines are refused, and a batch
line's class is written only in format version 2, which earlier replicas never ask for."""

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
    ResidencyEvent("r", 6, "m", "p0", "u", EventKind.PUT, 7, 1001, 4, (), True),
    ResidencyEvent("r", 7, "m", "p0", "u", EventKind.ACQUIRE, 8, None, 0, (9, 10), True),
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
        b'[1,"m","p","u","put",0,1,1,"",1]',
        b'[1,"m","p","u","put",0,1,1,"","batch",2]',
    ],
)
def test_malformed_event_lines_are_refused(line: bytes) -> None:
    with pytest.raises(EventDecodeError):
        decode_event("r", line)


def test_a_batch_lines_class_goes_only_to_subscribers_of_version_2() -> None:
    event = ResidencyEvent("r", 6, "m", "p0", "u", EventKind.ACQUIRE, 7, 1001, 0, (), True)
    assert encode_event(event, version=2) == b'[6,"m","p0","u","acquire",7,1001,0,"","batch"]\n'
    old = encode_event(event, version=1)
    assert old == b'[6,"m","p0","u","acquire",7,1001]\n'  # what an earlier replica decodes: 7 to 9 fields
    assert decode_event("r", old) == ResidencyEvent("r", 6, "m", "p0", "u", EventKind.ACQUIRE, 7, 1001)
    assert encode_event(event).endswith(b',"batch"]\n')  # by default the newest format, with the class


def test_a_class_from_a_later_version_reads_as_interactive() -> None:
    event = decode_event("r", b'[6,"m","p0","u","acquire",7,1001,0,"","offline-low"]')
    assert event.background is False and event.task_id == 1001
