"""The internal peer port: what one router replica serves to the others (never on the public API port).

Every request first passes :class:`~trtfleet_router.internalaccess.InternalAccess` (a bearer token, loopback
only, or open by opt-out): a request turned away gets 401/403 and changes nothing. Only an admitted
``/events`` request adds its ``replica`` to the membership and makes this router subscribe to its
``advertise`` URL; bad parameters are a 400 before anything is recorded.

* ``GET /fleet/v1/events?since=<seq>&replica=<id>&advertise=<url>[&origin=<id>][&version=2]`` - a long-lived NDJSON
  stream: a header line ``{"replica", "seq", "since", "gap", "version"}``, then this replica's own events after
  ``since`` (:mod:`trtfleet_router.routing.events`), written in one chunk per event-loop turn, and an
  empty line every ``heartbeat_s`` while idle. ``gap`` is true when events after ``since`` already left
  the ring: the subscriber then knows it missed some. ``origin`` is the replica id the subscriber
  expects: if this replica is another one (restarted behind the same address), ``since`` means nothing
  here and the stream starts at this replica's first event. A subscriber that falls a whole ring behind
  is disconnected (it reconnects and sees the gap). ``replica``/``advertise`` say who subscribes and
  where it can be reached: an unknown replica is subscribed back. ``version`` is the newest event format the
  subscriber reads: 1 (the default, what earlier replicas read) or 2 (batch lines' ``put``/``acquire`` carry their
  priority class, :mod:`trtfleet_router.routing.events`); the header says which one the stream is in.
* ``GET /fleet/v1/snapshot`` - the merged view and watermarks (:mod:`trtfleet_router.peering.view`).
* ``GET /fleet/v1/demand`` - requests in flight and per-adapter rates per base model (all replicas).
* ``GET /fleet/v1/held?base_model=<name>[&after=<episode>&wait=<s>&replica=<id>&above=<n>]`` - the base
  model's requests held for want of a ready pod on this replica: ``{"replica", "base_model", "held",
  "episode"}`` (:mod:`trtfleet_router.upstream.hold`). With ``after``, the answer waits (at most ``wait``
  seconds, capped at :data:`HELD_WAIT_S_MAX`) for a hold episode numbered above it, or for more than
  ``above`` held requests: the operator's long poll, which scales the base model from zero at once.
  ``replica`` is the id the caller's ``after`` came from: when this replica is another one (restarted
  behind the same address), it answers at once.
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Awaitable, Callable
from typing import Final, Protocol

from aiohttp import web

from trtfleet_router.internalaccess import InternalAccess
from trtfleet_router.liveview import FleetSet
from trtfleet_router.peering.journal import EventLog
from trtfleet_router.peering.peers import REPLICA_ID, normalize_peer_url
from trtfleet_router.peering.view import demand_summary, export_view
from trtfleet_router.routing.events import STREAM_VERSION

HEARTBEAT_S_DEFAULT: Final = 2.0
NDJSON: Final = "application/x-ndjson"
HELD_WAIT_S_MAX: Final = 60.0

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


class HeldRequests(Protocol):
    def held(self, base_model: str) -> int: ...

    def episode(self, base_model: str) -> int: ...

    async def wait_episode(self, base_model: str, after: int, timeout_s: float, above: int | None = None) -> int: ...


class Membership(Protocol):
    def heard_of(self, replica_id: str, advertise_url: str) -> None: ...

    def watermarks(self) -> dict[str, int]: ...

    def known_peers(self) -> dict[str, str]: ...


class PeerServer:
    def __init__(
        self,
        journal: EventLog,
        fleets: FleetSet,
        membership: Membership,
        *,
        access: InternalAccess,
        heartbeat_s: float = HEARTBEAT_S_DEFAULT,
        holds: HeldRequests | None = None,
    ) -> None:
        self.journal = journal
        self.fleets = fleets
        self.membership = membership
        self.access = access
        self.heartbeat_s = heartbeat_s
        self.holds = holds
        self.closing = False

    def close(self) -> None:
        """End every event stream at its next wake-up (the router is stopping)."""
        self.closing = True
        self.journal.flush()

    def app(self) -> web.Application:
        app = web.Application()
        app.add_routes(
            [
                web.get("/fleet/v1/events", self._admitted(self.events)),
                web.get("/fleet/v1/snapshot", self._admitted(self.snapshot)),
                web.get("/fleet/v1/demand", self._admitted(self.demand)),
                web.get("/fleet/v1/held", self._admitted(self.held)),
            ]
        )
        return app

    def _admitted(self, handler: Handler) -> Handler:
        """``handler`` behind the access check: a request turned away reaches no handler."""
        check = self.access.check

        async def admitted(request: web.Request) -> web.StreamResponse:
            check(request)
            return await handler(request)

        return admitted

    async def events(self, request: web.Request) -> web.StreamResponse:
        query = request.query
        try:
            since = int(query.get("since", "0"))
        except ValueError:
            raise web.HTTPBadRequest(text="since: an integer event sequence number") from None
        if since < 0:
            raise web.HTTPBadRequest(text="since: must be >= 0")
        try:
            version = min(int(query.get("version", "1")), STREAM_VERSION)
        except ValueError:
            raise web.HTTPBadRequest(text="version: an integer event format version") from None
        if version < 1:
            raise web.HTTPBadRequest(text="version: must be >= 1")
        replica = query.get("replica", "")
        if replica and not REPLICA_ID.fullmatch(replica):
            raise web.HTTPBadRequest(text="replica: letters, digits, '.', '_' or '-', at most 64")
        if replica == self.journal.replica_id:
            raise web.HTTPConflict(text="a replica does not subscribe to itself")
        expected = query.get("origin")
        if expected is not None and expected != self.journal.replica_id:
            since = 0
        advertise = query.get("advertise")
        if advertise is not None:
            try:
                advertise = normalize_peer_url(advertise)
            except ValueError as exc:
                raise web.HTTPBadRequest(text=f"advertise: {exc}") from None
        if replica and advertise:
            self.membership.heard_of(replica, advertise)
        response = web.StreamResponse(headers={"Content-Type": NDJSON, "Cache-Control": "no-store"})
        await response.prepare(request)
        journal = self.journal
        gap, lines = journal.after(since, version)
        header = {
            "replica": journal.replica_id, "seq": journal.flushed_seq(), "since": since, "gap": gap, "version": version
        }
        await response.write(json.dumps(header).encode() + b"\n" + b"".join(lines))
        cursor = journal.flushed_seq() if lines or gap else max(since, 0)
        admits, recheck_s = self.access.admits, time.monotonic() + self.heartbeat_s
        try:
            while not self.closing:
                await journal.wait_beyond(cursor, self.heartbeat_s)
                if time.monotonic() >= recheck_s:  # a token taken out of the file ends its streams
                    if not admits(request):
                        break
                    recheck_s = time.monotonic() + self.heartbeat_s
                gap, lines = journal.after(cursor, version)
                if gap:
                    break  # fell a whole ring behind: the subscriber reconnects and learns of the gap
                if lines:
                    cursor += len(lines)
                    await response.write(b"".join(lines))
                else:
                    await response.write(b"\n")
        except ConnectionError:
            pass  # the subscriber went away
        return response

    async def snapshot(self, request: web.Request) -> web.Response:
        membership = self.membership
        body = export_view(
            self.fleets.fleets,
            self.journal.replica_id,
            self.journal.seq,
            membership.watermarks(),
            membership.known_peers(),
        )
        return web.json_response(body)

    async def demand(self, request: web.Request) -> web.Response:
        body = demand_summary(self.fleets.fleets, self.fleets.registry, self.journal.replica_id, time.monotonic())
        return web.json_response(body)

    async def held(self, request: web.Request) -> web.Response:
        query = request.query
        base = query.get("base_model", "")
        if not base:
            raise web.HTTPBadRequest(text="base_model: the base model's name is required")
        if self.holds is None:
            raise web.HTTPNotFound(text="this router holds no requests (no dispatcher)")
        try:
            after = int(query["after"]) if "after" in query else None
            above = int(query["above"]) if "above" in query else None
            wait_s = float(query.get("wait", "0"))
        except ValueError:
            raise web.HTTPBadRequest(text="after, above: integers; wait: seconds") from None
        if not math.isfinite(wait_s):
            raise web.HTTPBadRequest(text="wait: a finite number of seconds")
        if query.get("replica", self.journal.replica_id) != self.journal.replica_id:
            after = None  # numbered by another replica: mean nothing here
        if after is not None and wait_s > 0:
            until_s = time.monotonic() + min(wait_s, HELD_WAIT_S_MAX)
            # in slices, so a stopping router ends the poll within one heartbeat
            while (
                not self.closing
                and self.holds.episode(base) <= after
                and (above is None or self.holds.held(base) <= above)
            ):
                left_s = until_s - time.monotonic()
                if left_s <= 0:
                    break
                await self.holds.wait_episode(base, after, min(left_s, self.heartbeat_s), above)
        body = {
            "replica": self.journal.replica_id,
            "base_model": base,
            "held": self.holds.held(base),
            "episode": self.holds.episode(base),
        }
        return web.json_response(body)
