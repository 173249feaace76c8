"""Residency events: every change a router replica makes to its view of the pods' LoRA caches.

Router replicas share one view of each pod's cache by publishing these events to each other (see
:mod:`trtfleet_router.peering`). A :class:`~trtfleet_router.routing.fleet.Fleet` hands each change of
its own to a :class:`Journal` as it books a request; the peering shell numbers them (``origin``,
``seq``) and streams them; a receiving fleet applies them with ``Fleet.apply_remote``
(:mod:`trtfleet_router.routing.remote`).

Kinds, in the order one request produces them::

    put       request ``ticket`` started with weights for task_id (pages): the pod stores them (LRU
              among idle adapters) and the request pins them
    acquire   request ``ticket`` started without weights (task_id None: a request without an adapter)
    loaded    the pod answered request ``ticket`` (its first token): the weights it carried are stored, not in
              transit, and its prefill no longer queues there (published for every request with prefill
              queued since the ``trtfleet`` policy prices it; earlier versions sent it only with weights
              and ignore the others)
    release   request ``ticket`` ended (unpins its adapter)
    mark_cold the pod said it does not hold task_id (a miss), or weights sent with a failed request
    pod_reset the pod's LoRA cache is empty again (its Triton restarted inside the same pod)

A ``put`` or ``acquire`` also carries the request's KV-cache block hashes (:mod:`~trtfleet_router.routing.prefix`,
chained and keyed by the adapter's task id, the same on every replica): the receiver records them in its prefix
index for that pod, as the origin did. So every replica knows which prefixes each pod holds from every replica's
traffic, and routes a conversation's next turn where its prefix is whichever replica gets it. (The pods' own
``/kv_cache_events`` cannot give each replica this: trtllm-serve's handler drains the engine's event queue, so
each event goes to whichever caller asks first (``get_kv_cache_events`` in ``tensorrt_llm/serve/openai_server.py``,
NVIDIA/TensorRT-LLM@e7f7345e31e574b5d0918b756b871882c7346b3c), and its blocks carry no LoRA task id.) A replica
that joins later learns prefixes from the requests after it joined (the snapshot it copies holds no blocks).

The receiver also books the blocks of a ``put``/``acquire`` its prefix index does not hold on the pod yet as
prefill queued there (in tokens, by the base model's block size) until the request's ``loaded`` or ``release``.
A request is thus three events (``put``/``acquire``, ``loaded``, ``release``; four when it misses).
``ticket`` is the origin's own request number: a receiver books each remote request under
``(origin, ticket)``, so a release unpins exactly what that request pinned, never a pin of another replica's
request.

``pod_uid`` is the uid discovery gives (the Kubernetes pod uid): an event about another incarnation of
the pod than the one the receiver knows is ignored.

The codec is a JSON array per event, one per line (NDJSON): short, and every field positional; the block hashes
are one base64 string of 8-byte little-endian hashes (a 8,000-token prompt: 250 blocks, 2.7 kB).

A ``put`` or ``acquire`` of a batch line (``background``) has a 10th field, the priority class ``"batch"`` (the 9th
is then the block hashes, ``""`` when there are none): the receivers leave it out of the load an interactive request
is compared by, as the origin does. Replicas of earlier versions reject arrays of 10 fields, so a replica sends them
only on the streams of subscribers that asked for them (``version=2``, :mod:`trtfleet_router.peering.server`); the
others get the same event in 7 to 9 fields, without its class.
"""

from __future__ import annotations

import base64
import binascii
import json
import sys
from array import array
from collections.abc import Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Protocol


class EventKind(StrEnum):
    PUT = "put"
    ACQUIRE = "acquire"
    LOADED = "loaded"
    RELEASE = "release"
    MARK_COLD = "mark_cold"
    POD_RESET = "pod_reset"


_KINDS = {kind.value: kind for kind in EventKind}
_decode = json.JSONDecoder().decode


class EventDecodeError(ValueError):
    """A peer sent a line that is not an event."""


@dataclass(frozen=True, slots=True)
class ResidencyEvent:
    origin: str  # replica id of the router that made the change
    seq: int  # 1, 2, ... per origin, in the order the origin made its changes
    base_model: str
    pod_id: str
    pod_uid: str  # discovery's uid of the pod
    kind: EventKind
    ticket: int = 0  # the origin's request number (put, acquire, loaded, release)
    task_id: int | None = None
    pages: int = 0  # put: host-cache pages the adapter takes
    blocks: tuple[int, ...] = ()  # put / acquire: the request's KV-cache block hashes (chained, by adapter)
    background: bool = False  # put / acquire: a batch line (priority class "batch")


class Journal(Protocol):
    """Where a fleet hands the changes it makes (the peering shell numbers and publishes them)."""

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
    ) -> None: ...


def encode_blocks(blocks: Sequence[int]) -> str:
    """Block hashes (unsigned 64-bit) as one base64 string of little-endian 8-byte words."""
    words = array("Q", blocks)
    if sys.byteorder != "little":
        words.byteswap()
    return base64.b64encode(words.tobytes()).decode("ascii")


def decode_blocks(text: str) -> tuple[int, ...]:
    """The hashes of :func:`encode_blocks`; ``EventDecodeError`` when it is not such a string."""
    try:
        raw = base64.b64decode(text, validate=True)
    except (binascii.Error, ValueError) as exc:
        raise EventDecodeError(f"block hashes are not base64: {text[:40]!r}") from exc
    if len(raw) % 8:
        raise EventDecodeError(f"block hashes are 8-byte words, got {len(raw)} bytes")
    words = array("Q", raw)
    if sys.byteorder != "little":
        words.byteswap()
    return tuple(words)


BATCH_CLASS = "batch"
"""The 10th field of a batch line's ``put`` / ``acquire``."""
STREAM_VERSION = 2
"""The newest event format this version writes and reads (1: 7 to 9 fields; 2: a batch line's class too)."""


def encode_event(event: ResidencyEvent, version: int = STREAM_VERSION) -> bytes:
    """One NDJSON line (``\\n`` included); ``version`` 1 leaves out the priority class (earlier replicas)."""
    fields: list[object] = [
        event.seq, event.base_model, event.pod_id, event.pod_uid, event.kind.value, event.ticket, event.task_id
    ]
    classed = event.background and version >= 2
    if event.pages or event.blocks or classed:
        fields.append(event.pages)
    if event.blocks or classed:
        fields.append(encode_blocks(event.blocks))
    if classed:
        fields.append(BATCH_CLASS)
    return json.dumps(fields, separators=(",", ":")).encode() + b"\n"


def decode_event(origin: str, line: bytes | str) -> ResidencyEvent:
    """The event of :func:`encode_event`; the origin comes from the stream it arrived on."""
    try:
        fields = _decode(line.decode() if isinstance(line, bytes) else line)
    except ValueError as exc:  # UnicodeDecodeError included
        raise EventDecodeError(f"not JSON: {line[:80]!r}") from exc
    if type(fields) is not list or len(fields) not in (7, 8, 9, 10):
        raise EventDecodeError(f"an event is a JSON array of 7 to 10 fields, got {line[:80]!r}")
    seq, base_model, pod_id, pod_uid, kind, ticket, task_id = fields[:7]
    pages = fields[7] if len(fields) > 7 else 0
    blocks: tuple[int, ...] = ()
    if len(fields) >= 9:
        if type(fields[8]) is not str:
            raise EventDecodeError(f"malformed event {line[:80]!r}")
        blocks = decode_blocks(fields[8])
    background = False
    if len(fields) == 10:
        if type(fields[9]) is not str:
            raise EventDecodeError(f"malformed event {line[:80]!r}")
        background = fields[9] == BATCH_CLASS  # another class, from a later version: interactive, as before
    event_kind = _KINDS.get(kind) if type(kind) is str else None
    if (  # exact types: cheap, and a bool is no int here
        type(seq) is not int
        or type(ticket) is not int
        or type(base_model) is not str
        or type(pod_id) is not str
        or type(pod_uid) is not str
        or event_kind is None
        or (task_id is not None and type(task_id) is not int)
        or type(pages) is not int
        or pages < 0
    ):
        raise EventDecodeError(f"malformed event {line[:80]!r}")
    return ResidencyEvent(
        origin, seq, base_model, pod_id, pod_uid, event_kind, ticket, task_id, pages, blocks, background
    )
