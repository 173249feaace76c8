"""Router replicas share one view of the pods' LoRA caches by streaming their residency events to each other.

The pure core is in :mod:`trtfleet_router.routing.events` (the events) and
:mod:`trtfleet_router.routing.remote` (applying them); this package is the I/O shell around it:

* :mod:`.journal` - this replica's own events: numbered, kept in a bounded ring, batched per event-loop turn;
* :mod:`.view` - the merged view as JSON (``/fleet/v1/snapshot``) and back, and the demand summary;
* :mod:`.server` - the internal peer port: ``/fleet/v1/events`` (NDJSON stream), ``/snapshot``, ``/demand``,
  ``/held``, each behind :mod:`trtfleet_router.internalaccess` (the replicas' bearer token);
* :mod:`.peers` - subscriptions to every other replica (static ``--peer`` seeds, replicas that subscribed
  to us, a headless Service's DNS), reconnect with back-off, start-up sync, dead-replica release.

Errors: :class:`PeerError` is the root; :class:`PeerProtocolError` (a peer answered something that is not
our protocol). Network failures are not errors here: a peer that cannot be reached is retried with back-off,
and the router routes on with its own view.
"""

from __future__ import annotations


class PeerError(Exception):
    """Root of the peering errors."""


class PeerProtocolError(PeerError):
    """A peer answered something that is not the peer protocol (wrong header, bad event line)."""
