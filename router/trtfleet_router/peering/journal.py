"""This replica's own residency events: numbered, kept in a bounded ring, handed to subscribers in batches.

``record`` (called by the fleets on the request path) only appends the event to a pending list and, on
the first event of an event-loop turn, schedules one flush for the end of the turn: the flush encodes
the turn's events once, appends them to the ring and wakes every subscriber stream, which then writes
them in one chunk. A subscriber that asks for events older than the ring is told it has a gap.

The ring keeps each event's line in the stream format version 1 (7 to 9 fields, what every replica reads) and, for a
batch line's ``put``/``acquire``, also its version 2 line with the priority class
(:mod:`trtfleet_router.routing.events`); :meth:`EventLog.after` hands out the version the subscriber asked for.
"""

from __future__ import annotations

import asyncio
import json
import os
from collections import deque
from collections.abc import Sequence
from typing import Final

from trtfleet_router.routing.events import BATCH_CLASS, EventKind, encode_blocks

RING_EVENTS_DEFAULT: Final = 65536
PREFIX_CACHE_ENTRIES: Final = 4096


def new_replica_id() -> str:
    """A fresh id per process start: a restarted replica is a new origin (its old pins expire)."""
    return os.urandom(6).hex()


class EventLog:
    """The :class:`~trtfleet_router.routing.events.Journal` of one router replica."""

    def __init__(self, replica_id: str, ring_events: int = RING_EVENTS_DEFAULT) -> None:
        if ring_events < 1:
            raise ValueError("the event ring must hold at least one event")
        self.replica_id = replica_id
        self.seq = 0  # last seq recorded
        # flushed (seq, NDJSON line, its version 2 line when that differs)
        self._ring: deque[tuple[int, bytes, bytes | None]] = deque(maxlen=ring_events)
        self._pending: list[tuple[int, str, str, str, EventKind, int, int | None, int, Sequence[int], bool]] = []
        self._flush_scheduled = False
        self._flushed = asyncio.Event()
        self._prefixes: dict[tuple[str, str, str], str] = {}  # (base, pod, uid) -> their JSON, encoded once

    # -- the request path --------------------------------------------------------------------------
    def record(
        self,
        base_model: str,
        pod_id: str,
        pod_uid: str,
        kind: EventKind,
        ticket: int = 0,
        task_id: int | None = None,
        pages: int = 0,
        blocks: Sequence[int] = (),
        background: bool = False,
    ) -> None:
        self.seq += 1
        self._pending.append((self.seq, base_model, pod_id, pod_uid, kind, ticket, task_id, pages, blocks, background))
        if not self._flush_scheduled:
            self._flush_scheduled = True
            try:
                asyncio.get_running_loop().call_soon(self.flush)
            except RuntimeError:  # no event loop (a synchronous caller): flush now
                self.flush()

    def flush(self) -> None:
        self._flush_scheduled = False
        pending, self._pending = self._pending, []
        prefixes = self._prefixes
        ring = self._ring
        for seq, base_model, pod_id, pod_uid, kind, ticket, task_id, pages, blocks, background in pending:
            # the same bytes as routing.events.encode_event, without a json.dumps per event
            key = (base_model, pod_id, pod_uid)
            prefix = prefixes.get(key)
            if prefix is None:
                if len(prefixes) > PREFIX_CACHE_ENTRIES:
                    prefixes.clear()
                prefix = prefixes[key] = json.dumps([base_model, pod_id, pod_uid], separators=(",", ":"))[1:-1]
            task = "null" if task_id is None else task_id
            head = f'[{seq},{prefix},"{kind.value}",{ticket},{task}'
            hashes = encode_blocks(blocks) if blocks or background else ""  # here: off the request path
            if blocks:
                tail = f',{pages},"{hashes}"]\n'
            else:
                tail = f",{pages}]\n" if pages else "]\n"
            classed = f'{head},{pages},"{hashes}","{BATCH_CLASS}"]\n'.encode() if background else None
            ring.append((seq, f"{head}{tail}".encode(), classed))
        flushed, self._flushed = self._flushed, asyncio.Event()
        flushed.set()

    # -- subscribers -------------------------------------------------------------------------------
    @property
    def first_seq(self) -> int:
        """The oldest seq still in the ring (``seq + 1`` when it is empty)."""
        return self._ring[0][0] if self._ring else self.seq + 1

    def after(self, since: int, version: int = 1) -> tuple[bool, list[bytes]]:
        """(gap, lines): the flushed events after ``since`` (up to :meth:`flushed_seq`) in stream format
        ``version``; ``gap`` when some of them already left the ring."""
        ring = self._ring
        if not ring or since >= ring[-1][0]:
            return False, []
        lines = []
        classed = version >= 2
        for seq, line, line_v2 in reversed(ring):  # O(events after since), however long the ring
            if seq <= since:
                break
            lines.append(line_v2 if classed and line_v2 is not None else line)
        lines.reverse()
        return since + 1 < ring[0][0], lines

    def flushed_seq(self) -> int:
        return self._ring[-1][0] if self._ring else self.seq - len(self._pending)

    async def wait_beyond(self, seq: int, timeout_s: float) -> None:
        """Return when events after ``seq`` are flushed, or after ``timeout_s`` (a heartbeat is due)."""
        if self.flushed_seq() > seq:
            return
        try:
            await asyncio.wait_for(self._flushed.wait(), timeout_s)
        except TimeoutError:
            return
