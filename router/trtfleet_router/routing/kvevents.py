"""TensorRT-LLM KV-cache events -> the prefix index (pure: parse, then apply).

trtllm-serve answers ``POST /kv_cache_events`` with the events since the last call, a JSON list serialised
by ``KVCacheEventSerializer`` (``tensorrt_llm/_utils.py`` at ed53795b33fc139493f762a1c6c53f691cf52d38)::

    {"event_id": 7, "window_size": 4096, "data": {"type": "stored", "parent_hash": 123 | null,
      "blocks": [{"type": "stored_block", "block_hash": 456, "tokens": [{"type": "unique_token",
                  "token_id": 257, "token_extra_id": 0}, ...], "cache_level": 0, "priority": 35,
                  "lora_id": 3}]}}
    {"data": {"type": "removed", "block_hashes": [456, ...]}}
    {"data": {"type": "created", "num_blocks_per_cache_level": [...]}}
    {"data": {"type": "updated", ...}}   # cache level / priority changes: nothing to do here

``lora_id`` is commented out of the serializer at that commit (a to-do says to enable its serialization),
and the reference engine follows upstream. The task id is part of the engine's block key but not of the
event, so a chain's first block without ``lora_id`` cannot be keyed: it is skipped with its descendants
(counted as skipped). Blocks whose parent is known inherit the parent's key, so nothing is guessed. Until
an engine publishes ``lora_id``, the index of such a pod is the router's own model of it, corrected by
the reuse counters; events then only remove blocks (``removed``) and clear the pod (``created``).

The engine's ``block_hash`` is its own; the router re-hashes each stored block from its token ids with
its own chain (:mod:`~trtfleet_router.routing.prefix`), keeping per pod a map ``engine hash -> router hash``
so a child block finds its parent and a ``removed`` event finds what to drop. A stored block whose parent
the router never saw (events lost, or published before the router started) is skipped, with its
descendants in the same event: the index only ever holds chains it can prove.

Errors: :class:`KvEventError` (a :class:`~trtfleet_router.routing.types.RoutingError`) for a payload that
is not this format; nothing of a bad batch is applied.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from trtfleet_router.routing.prefix import chain_hash, root_hash, token_payload
from trtfleet_router.routing.prefixindex import PrefixIndex
from trtfleet_router.routing.types import RoutingError


class KvEventError(RoutingError):
    """A KV-cache event payload the router cannot read."""


@dataclass(frozen=True, slots=True)
class StoredBlock:
    block_hash: int
    tokens: tuple[int, ...]
    lora_id: int | None


@dataclass(frozen=True, slots=True)
class Stored:
    parent_hash: int | None
    blocks: tuple[StoredBlock, ...]


@dataclass(frozen=True, slots=True)
class Removed:
    block_hashes: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class Created:
    """The pod's KV cache was (re)created: it holds nothing."""


KvEvent = Stored | Removed | Created


def _int(value: Any, what: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise KvEventError(f"KV-cache event: {what} must be an integer, got {value!r}")
    return value


def parse_events(payload: Any) -> list[KvEvent]:
    """The events of one ``/kv_cache_events`` answer (a JSON list), in order; ``updated`` ones dropped."""
    if not isinstance(payload, list):
        raise KvEventError(f"KV-cache events must be a JSON list, got {type(payload).__name__}")
    events: list[KvEvent] = []
    for item in payload:
        data = item.get("data") if isinstance(item, Mapping) else None
        if not isinstance(data, Mapping):
            raise KvEventError(f"KV-cache event without a data object: {item!r:.200}")
        kind = data.get("type")
        if kind == "stored":
            parent = data.get("parent_hash")
            blocks = data.get("blocks")
            if not isinstance(blocks, list):
                raise KvEventError("KV-cache event 'stored' needs a list of blocks")
            events.append(Stored(None if parent is None else _int(parent, "parent_hash"),
                                 tuple(_stored_block(block) for block in blocks)))
        elif kind == "removed":
            hashes = data.get("block_hashes")
            if not isinstance(hashes, list):
                raise KvEventError("KV-cache event 'removed' needs a list of block_hashes")
            events.append(Removed(tuple(_int(h, "block_hashes[]") for h in hashes)))
        elif kind == "created":
            events.append(Created())
        elif kind != "updated":
            raise KvEventError(f"unknown KV-cache event type {kind!r}")
    return events


def _stored_block(block: Any) -> StoredBlock:
    if not isinstance(block, Mapping):
        raise KvEventError(f"KV-cache stored block must be an object, got {block!r:.200}")
    tokens = block.get("tokens")
    if not isinstance(tokens, list):
        raise KvEventError("KV-cache stored block needs a list of tokens")
    ids = tuple(_int(t.get("token_id") if isinstance(t, Mapping) else t, "token_id") for t in tokens)
    lora = block.get("lora_id")
    return StoredBlock(_int(block.get("block_hash"), "block_hash"), ids,
                       None if lora is None else _int(lora, "lora_id"))


class PodEventState:
    """Per pod: engine block hash -> router block hash, for the blocks the pod holds."""

    __slots__ = ("router_hash",)

    def __init__(self) -> None:
        self.router_hash: dict[int, int] = {}


def apply_events(
    index: PrefixIndex, pod_id: str, state: PodEventState, events: Sequence[KvEvent]
) -> tuple[int, int]:
    """Apply ``events`` of ``pod_id`` in order; (blocks stored, stored blocks skipped for a missing parent)."""
    stored = skipped = 0
    mapping = state.router_hash
    for event in events:
        if isinstance(event, Stored):
            parent: int | None
            if event.parent_hash is None:
                parent = None
            else:
                parent = mapping.get(event.parent_hash)
                if parent is None:
                    skipped += len(event.blocks)
                    continue
            if parent is None and event.blocks and event.blocks[0].lora_id is None:
                skipped += len(event.blocks)  # a chain's root with no task id: its key is unknown
                continue
            new: list[int] = []
            for block in event.blocks:
                base = parent if parent is not None else root_hash(block.lora_id or 0)
                parent = chain_hash(base, token_payload(block.tokens))
                mapping[block.block_hash] = parent
                new.append(parent)
            index.store(pod_id, reversed(new))  # first blocks most recent, as record() does
            stored += len(new)
        elif isinstance(event, Removed):
            gone = [mapping.pop(h) for h in event.block_hashes if h in mapping]
            index.remove(pod_id, gone)
        else:
            mapping.clear()
            index.forget(pod_id)
    return stored, skipped
