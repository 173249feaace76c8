"""Who may use the router's internal endpoints: the peer port and the debug endpoints of the metrics port.

Three modes, chosen once at start (:func:`choose_access`):

* ``token`` (``--internal-token-file``): a request must carry one of the file's bearer tokens
  (:mod:`trtfleet.internalauth`); the chart provisions it from a Secret.
* ``loopback`` (no token file): only clients on this host's loopback address are let in. A lone router run by
  hand, and the local operator beside it, work as before; nothing off the host reaches its view. Replicas
  configured with ``--peer``/``--peer-dns`` need a token instead (or the opt-out): the router refuses to start.
* ``open`` (``--no-internal-auth``): everyone who can reach the port, an explicit opt-out that is logged with
  what it exposes.

A request let in here is the only kind that may add a replica to the membership or make the router subscribe
to a URL it advertises (:mod:`trtfleet_router.peering.server`).
"""

from __future__ import annotations

import enum
import ipaddress
import logging
from pathlib import Path
from typing import Final

from aiohttp import web

from trtfleet.internalauth import BEARER_REALM, TokenFile, presented_bearer

log = logging.getLogger(__name__)

OPEN_EXPOSES: Final = (
    "anyone who can reach the peer port can read every pod's address, adapters and prefix blocks, the demand "
    "and held requests, join as a replica and feed this router residency and load events (steering its "
    "routing), and make it connect to any URL it advertises; the debug endpoints, when on, are open too"
)


class AccessMode(enum.Enum):
    TOKEN = "token"
    LOOPBACK = "loopback"
    OPEN = "open"


def choose_access(token_file: Path | None, open_access: bool, peers_configured: bool) -> AccessMode:
    """The mode of ``--internal-token-file`` / ``--no-internal-auth`` (``peers_configured``: ``--peer`` or
    ``--peer-dns`` given); ValueError for a combination that cannot be meant."""
    if token_file is not None and open_access:
        raise ValueError("give --internal-token-file or --no-internal-auth, not both")
    if token_file is not None:
        return AccessMode.TOKEN
    if open_access:
        return AccessMode.OPEN
    if peers_configured:
        raise ValueError(
            "--peer/--peer-dns without a credential: the replicas would accept events and subscriptions from "
            "anyone who reaches the peer port. Give --internal-token-file FILE (the same file on every replica; "
            "the chart mounts one from a Secret), or --no-internal-auth to accept that exposure"
        )
    return AccessMode.LOOPBACK


def _loopback(remote: str | None) -> bool:
    if not remote:
        return False
    try:
        return ipaddress.ip_address(remote.split("%", 1)[0]).is_loopback
    except ValueError:
        return False


class InternalAccess:
    """The check every internal endpoint runs first (``tokens`` is required in mode ``token``)."""

    def __init__(self, mode: AccessMode, tokens: TokenFile | None = None) -> None:
        if (mode is AccessMode.TOKEN) != (tokens is not None):
            raise ValueError("a token file goes with the token mode, and only with it")
        self.mode = mode
        self.tokens = tokens

    def describe(self) -> None:
        """Log, once at start, who the internal endpoints answer."""
        if self.mode is AccessMode.OPEN:
            log.warning("internal endpoints without a credential (--no-internal-auth)",
                        extra={"ctx": {"exposes": OPEN_EXPOSES}})
        elif self.mode is AccessMode.LOOPBACK:
            log.info("internal endpoints answer loopback clients only (no --internal-token-file)")

    def admits(self, request: web.BaseRequest) -> bool:
        """Whether ``request`` is let in; asked again by a long-lived request (an event stream), so a token
        removed from the file ends the streams it opened."""
        if self.mode is AccessMode.OPEN:
            return True
        if self.mode is AccessMode.LOOPBACK:
            return _loopback(request.remote)
        assert self.tokens is not None
        return self.tokens.accepts(presented_bearer(request.headers))

    def check(self, request: web.BaseRequest) -> None:
        """Raise 401 (no or a wrong token) or 403 (not loopback, no credential configured) unless admitted."""
        if self.admits(request):
            return
        if self.mode is AccessMode.LOOPBACK:
            raise web.HTTPForbidden(
                text="this router has no internal credential: its internal endpoints answer loopback clients only"
            )
        raise web.HTTPUnauthorized(
            text="a bearer token is required (Authorization: Bearer <token>, the router's --internal-token-file)",
            headers={"WWW-Authenticate": BEARER_REALM},
        )
