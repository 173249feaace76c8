"""Subscriptions to the other router replicas: who they are, how far we are, and when one is gone.

Membership: the static ``--peer`` URLs, every replica that subscribes to us with an ``advertise`` URL
(so a replica started later with ``--peer <one of us>`` is found by all), the peers a snapshot lists,
and, on Kubernetes, the addresses a headless Service's DNS name resolves to (``--peer-dns``; re-resolved
every ``refresh_s``). One stream per origin: an address that turns out to be ourselves, or a replica
already streaming under another address, is dropped.

Start-up (:meth:`Peers.sync`): take one reachable peer's snapshot, then subscribe to every peer from that
snapshot's watermark for it; bounded by ``sync_timeout_s`` (a replica alone starts at once).

Who is subscribed to: the ``--peer`` seeds, the ``--peer-dns`` addresses, the peers of a snapshot taken from
one of those, and the ``advertise`` URL of a subscriber the peer server admitted (a bearer token, see
:mod:`trtfleet_router.internalaccess`); never a URL a stranger named. Every request this replica sends carries
its token (:func:`trtfleet.internalauth.authorized_get`).

A stream that ends is retried with exponential back-off (``backoff_s`` .. ``backoff_max_s``). An origin
without a stream for ``grace_s`` is gone: its requests are ended and its pins released in every fleet
(``Fleet.forget_origin``). A gap (the peer's ring no longer holds events we missed) does the same for
that origin at once, then the stream goes on.
"""

from __future__ import annotations

import asyncio
import json
import logging
import random
import re
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Final
from urllib.parse import urlsplit

import aiohttp
from aiohttp.http_exceptions import HttpProcessingError

from trtfleet.internalauth import TokenFile, authorized_get
from trtfleet_router.liveview import FleetSet
from trtfleet_router.metrics import RouterMetrics
from trtfleet_router.peering import PeerProtocolError
from trtfleet_router.peering.journal import EventLog
from trtfleet_router.peering.view import import_view
from trtfleet_router.routing.events import STREAM_VERSION, EventDecodeError, EventKind, decode_event

log = logging.getLogger(__name__)

PEER_PORT_DEFAULT: Final = 8082
GRACE_S_DEFAULT: Final = 10.0
SYNC_TIMEOUT_S_DEFAULT: Final = 5.0
BACKOFF_S: Final = 0.1
BACKOFF_MAX_S: Final = 5.0
REFRESH_S: Final = 1.0
CONNECT_TIMEOUT_S: Final = 2.0
SILENCE_TIMEOUT_S: Final = 6.0  # three heartbeats without a line: the stream is dead
PEER_URL_CHARS_MAX: Final = 256
REPLICA_ID: Final = re.compile(r"[A-Za-z0-9._-]{1,64}")
"""What a replica id may be (the router's own are 12 hex digits)."""
STREAM_FAILURES: Final = (aiohttp.ClientError, HttpProcessingError, TimeoutError, PeerProtocolError, EventDecodeError)
"""What ends one stream to be retried: the network, a line past the reader's limit (128 KiB, far above an
event's), an answer that is not the protocol. Anything else is a bug."""


def normalize_peer_url(value: str) -> str:
    """``value`` as a peer URL: ``http(s)://host[:port]`` with no credentials, path, query or fragment, at most
    :data:`PEER_URL_CHARS_MAX` printable ASCII characters; the trailing slash dropped. ValueError otherwise."""
    if not value or len(value) > PEER_URL_CHARS_MAX or not value.isascii() or not value.isprintable() or " " in value:
        raise ValueError(f"a peer URL is http(s)://host:port in at most {PEER_URL_CHARS_MAX} printable characters")
    parts = urlsplit(value)  # ValueError for a malformed IPv6 host
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ValueError("a peer URL is http(s)://host:port")
    if parts.username is not None or parts.password is not None or parts.query or parts.fragment:
        raise ValueError("a peer URL carries no credentials, query or fragment")
    if parts.path not in ("", "/"):
        raise ValueError("a peer URL has no path")
    _ = parts.port  # ValueError for a port that is not a number in 0..65535
    return value.rstrip("/")


@dataclass(frozen=True)
class PeerSettings:
    port: int = PEER_PORT_DEFAULT  # 0: any free port
    seeds: tuple[str, ...] = ()  # --peer URLs
    dns: str | None = None  # --peer-dns host:port of a headless Service of the router pods
    advertise_url: str | None = None  # how the others reach us (default http://<host or 127.0.0.1>:<port>)
    grace_s: float = GRACE_S_DEFAULT
    sync_timeout_s: float = SYNC_TIMEOUT_S_DEFAULT


@dataclass(slots=True)
class OriginState:
    watermark: int = 0  # last seq applied
    connected: bool = False
    lost_at_s: float | None = None  # stream gone since (None: connected, or already forgotten)
    url: str | None = None


class Peers:
    def __init__(
        self,
        journal: EventLog,
        fleets: FleetSet,
        metrics: RouterMetrics,
        settings: PeerSettings,
        *,
        tokens: TokenFile | None = None,
        now: Callable[[], float] = time.monotonic,
    ) -> None:
        self.journal = journal
        self.release_listeners: list[Callable[[str], None]] = []
        """Called with the base model when another replica's request ended there (its room is free again)."""
        self.tokens = tokens  # sent with every request (None: no credential configured)
        self.fleets = fleets
        self.metrics = metrics
        self.settings = settings
        self.advertise_url = (settings.advertise_url or "").rstrip("/")
        self.seeds = tuple(url.rstrip("/") for url in settings.seeds)
        self.dns = settings.dns
        self.grace_s = settings.grace_s
        self.sync_timeout_s = settings.sync_timeout_s
        self._now = now
        self.origins: dict[str, OriginState] = {}
        self._url_origin: dict[str, str] = {}  # address -> replica id last seen there
        self._dropped: dict[str, str] = {}  # address -> why it is not subscribed (self, alias of another)
        self._streams: dict[str, asyncio.Task[None]] = {}
        self._session: aiohttp.ClientSession | None = None

    def listening(self, host: str, port: int) -> None:
        """The peer server is up on ``port``: advertise it (unless an address was given)."""
        if not self.advertise_url:
            local = "127.0.0.1" if host in ("", "0.0.0.0", "::") else host
            self.advertise_url = f"http://{local}:{port}"

    # -- membership (also called by the peer server) -------------------------------------------------
    def heard_of(self, replica_id: str, advertise_url: str) -> None:
        url = advertise_url.rstrip("/")
        if replica_id == self.journal.replica_id or url == self.advertise_url:
            return
        if url not in self._url_origin or self._url_origin[url] != replica_id:
            self._url_origin[url] = replica_id
            self._dropped.pop(url, None)
        self._subscribe(url)

    def watermarks(self) -> dict[str, int]:
        return {origin: state.watermark for origin, state in self.origins.items()}

    def known_peers(self) -> dict[str, str]:
        peers = {origin: url for url, origin in self._url_origin.items() if url not in self._dropped}
        peers[self.journal.replica_id] = self.advertise_url
        return peers

    def connected(self) -> int:
        return sum(1 for state in self.origins.values() if state.connected)

    # -- start-up -------------------------------------------------------------------------------------
    async def sync(self) -> bool:
        """Import one reachable peer's snapshot and subscribe to all; False when none answered in time."""
        candidates = [*self.seeds, *(await self._resolve())]
        candidates = [url for url in dict.fromkeys(candidates) if url != self.advertise_url]
        if not candidates:
            return False
        deadline = self._now() + self.sync_timeout_s
        backoff = BACKOFF_S
        while True:
            for url in candidates:
                left = deadline - self._now()
                if left <= 0:
                    break
                try:
                    snapshot = await self._get_json(url + "/fleet/v1/snapshot", min(left, CONNECT_TIMEOUT_S))
                except (aiohttp.ClientError, TimeoutError, ValueError) as exc:
                    log.debug("peer snapshot failed", extra={"ctx": {"peer": url, "error": str(exc)}})
                    continue
                if snapshot.get("replica") == self.journal.replica_id:
                    continue
                try:
                    self._import(url, snapshot)
                except (KeyError, TypeError, ValueError) as exc:
                    log.warning("peer snapshot not importable", extra={"ctx": {"peer": url, "error": repr(exc)}})
                    continue
                return True
            if self._now() + backoff >= deadline:
                log.warning("no peer reachable at start-up: routing on this replica's own view for now")
                return False
            await asyncio.sleep(backoff)
            backoff = min(backoff * 2, BACKOFF_MAX_S)

    def _import(self, url: str, snapshot: dict[str, Any]) -> None:
        stored = import_view(self.fleets.fleets, snapshot)
        source = str(snapshot["replica"])
        now_s = self._now()
        origins = {source, *snapshot.get("watermarks", {})}
        for fleet in snapshot.get("fleets", {}).values():
            origins.update(fleet.get("tickets", {}))
        origins.discard(self.journal.replica_id)
        for origin in origins:  # the grace clock runs until a stream to each of them is up
            self.origins[origin] = OriginState(watermark=0, lost_at_s=now_s)
        for origin, seq in snapshot.get("watermarks", {}).items():
            if origin in self.origins:
                self.origins[origin].watermark = int(seq)
        self.origins[source].watermark = int(snapshot.get("seq", 0))
        self._url_origin[url] = source
        for origin, peer_url in snapshot.get("peers", {}).items():
            try:
                known = normalize_peer_url(str(peer_url))
            except ValueError:
                log.info("peer URL of a snapshot skipped", extra={"ctx": {"peer": url, "replica": str(origin)[:64]}})
                continue
            if origin != self.journal.replica_id and known != self.advertise_url:
                self._url_origin[known] = origin
        log.info("synced from a peer", extra={"ctx": {"peer": url, "replica": source, "adapters": stored}})
        for peer_url in list(self._url_origin):
            self._subscribe(peer_url)

    # -- the loop -------------------------------------------------------------------------------------
    async def run(self) -> None:
        """Keep a stream to every peer; release the pins of origins gone longer than ``grace_s``."""
        for url in self.seeds:
            self._subscribe(url)
        while True:
            for url in await self._resolve():
                self._subscribe(url)
            self._expire()
            self.metrics.peers_connected.labels().set(self.connected())
            for name, fleet in self.fleets.fleets.items():
                self.metrics.fleet_inflight_requests.labels(name).set(fleet.inflight_total())
            await asyncio.sleep(REFRESH_S)

    def _expire(self) -> None:
        now_s = self._now()
        for origin, state in self.origins.items():
            if state.connected or state.lost_at_s is None or now_s - state.lost_at_s < self.grace_s:
                continue
            state.lost_at_s = None
            ended = sum(fleet.forget_origin(origin) for fleet in self.fleets.fleets.values())
            for url in [url for url, why in self._dropped.items() if why == origin]:
                del self._dropped[url]  # an alias of a gone replica may be someone new now
            log.info("peer gone: its requests ended", extra={"ctx": {"replica": origin, "requests": ended}})

    async def close(self) -> None:
        for task in self._streams.values():
            task.cancel()
        await asyncio.gather(*self._streams.values(), return_exceptions=True)
        if self._session is not None:
            await self._session.close()

    # -- streams --------------------------------------------------------------------------------------
    def _subscribe(self, url: str) -> None:
        if url == self.advertise_url or url in self._dropped:
            return
        task = self._streams.get(url)
        if task is None or task.done():
            self._streams[url] = asyncio.create_task(self._follow(url), name=f"peer {url}")

    async def _follow(self, url: str) -> None:
        backoff = BACKOFF_S
        while url not in self._dropped:
            try:
                if await self._stream(url):
                    backoff = BACKOFF_S
            except STREAM_FAILURES as exc:
                log.debug("peer stream failed", extra={"ctx": {"peer": url, "error": str(exc)[:200]}})
            if url in self._dropped:
                return
            await asyncio.sleep(backoff * (0.5 + random.random()))
            backoff = min(backoff * 2, BACKOFF_MAX_S)

    async def _stream(self, url: str) -> bool:
        """Follow one stream until it ends; True if it delivered a header (a reconnect may be quick)."""
        expected = self._url_origin.get(url)
        state = self.origins.get(expected) if expected is not None else None
        # version 2: batch lines come with their priority class (a replica of an earlier version ignores the ask)
        params = {"replica": self.journal.replica_id, "advertise": self.advertise_url, "version": str(STREAM_VERSION)}
        if expected is not None and state is not None:
            params |= {"since": str(state.watermark), "origin": expected}
        timeout = aiohttp.ClientTimeout(total=None, sock_connect=CONNECT_TIMEOUT_S, sock_read=SILENCE_TIMEOUT_S)
        events_url = url + "/fleet/v1/events"
        async with authorized_get(self._client(), events_url, self.tokens, params=params, timeout=timeout) as response:
            if response.status != 200:
                if response.status in (401, 403):
                    log.warning("peer refused our credential", extra={"ctx": {"peer": url, "status": response.status}})
                raise PeerProtocolError(f"{url}: HTTP {response.status}")
            header = _header(await response.content.readline())
            origin = header["replica"]
            if origin == self.journal.replica_id:
                self._dropped[url] = origin
                return True
            state = self.origins.setdefault(origin, OriginState())
            if state.connected and state.url != url:
                self._dropped[url] = origin  # the same replica under another address
                return True
            self._url_origin[url] = origin
            if origin != expected and state.watermark > 0:
                return True  # a replica we follow already, found at this address: ask again from its watermark
            if header["gap"]:
                self.metrics.peer_stream_gaps.inc()
                ended = sum(fleet.forget_origin(origin) for fleet in self.fleets.fleets.values())
                log.warning("peer events lost", extra={"ctx": {"peer": url, "replica": origin, "requests": ended}})
                state.watermark = int(header.get("since", 0))
            state.connected, state.lost_at_s, state.url = True, None, url
            log.info("peer connected", extra={"ctx": {"peer": url, "replica": origin}})
            try:
                await self._apply_stream(origin, state, response.content)
            finally:
                state.connected, state.lost_at_s = False, self._now()
                log.info("peer disconnected", extra={"ctx": {"peer": url, "replica": origin}})
        return True

    async def _apply_stream(self, origin: str, state: OriginState, content: aiohttp.StreamReader) -> None:
        fleets = self.fleets.fleets
        applied = self.metrics.peer_events.labels("applied")
        ignored = self.metrics.peer_events.labels("ignored")
        async for line in content:
            if line == b"\n":
                continue  # heartbeat
            event = decode_event(origin, line)
            if event.seq <= state.watermark:
                continue
            state.watermark = event.seq
            fleet = fleets.get(event.base_model)
            if fleet is not None and fleet.apply_remote(event):
                applied.inc()
                if event.kind is EventKind.RELEASE:
                    for listener in self.release_listeners:
                        listener(event.base_model)
            else:
                ignored.inc()

    def _client(self) -> aiohttp.ClientSession:
        if self._session is None:
            self._session = aiohttp.ClientSession()
        return self._session

    async def _get_json(self, url: str, timeout_s: float) -> dict[str, Any]:
        timeout = aiohttp.ClientTimeout(total=timeout_s)
        async with authorized_get(self._client(), url, self.tokens, timeout=timeout) as response:
            response.raise_for_status()
            body = await response.json()
        if not isinstance(body, dict):
            raise ValueError(f"{url}: not a JSON object")
        return body

    async def _resolve(self) -> list[str]:
        """``http://<address>:<port>`` for every address the headless Service's name resolves to."""
        if self.dns is None:
            return []
        parts = urlsplit("//" + self.dns)
        host, port = parts.hostname or "", parts.port or 8082
        try:
            infos = await asyncio.get_running_loop().getaddrinfo(host, port, type=0, proto=6)
        except OSError as exc:
            log.debug("peer DNS lookup failed", extra={"ctx": {"name": host, "error": str(exc)}})
            return []
        urls = []
        for _family, _type, _proto, _name, sockaddr in infos:
            address = str(sockaddr[0])
            urls.append(f"http://[{address}]:{port}" if ":" in address else f"http://{address}:{port}")
        return sorted(set(urls))


def _header(line: bytes) -> dict[str, Any]:
    """The stream's first line, checked: ``replica`` an id, ``gap`` a bool, ``since`` an integer >= 0."""
    try:
        header = json.loads(line)
    except ValueError as exc:
        raise PeerProtocolError(f"not a peer event stream: {line[:80]!r}") from exc
    if (
        not isinstance(header, dict)
        or not isinstance(header.get("replica"), str)
        or not REPLICA_ID.fullmatch(header["replica"])
        or not isinstance(header.get("gap"), bool)
        or not isinstance(header.get("since", 0), int)
        or isinstance(header.get("since", 0), bool)
        or header.get("since", 0) < 0
    ):
        raise PeerProtocolError(f"not a peer event stream header: {line[:80]!r}")
    return header
