"""TRT-LLM's KV-cache events, as trtllm-serve's ``POST /kv_cache_events`` returns them (pure).

Shapes follow ``KVCacheEventSerializer`` (``tensorrt_llm/_utils.py`` @ ed53795b): each event is
``{"event_id", "data", "window_size"}`` with ``data`` one of

* ``{"type": "created", "num_blocks_per_cache_level": [primary, secondary]}`` (once, when the pool is made);
* ``{"type": "stored", "parent_hash": int | None, "blocks": [{"type": "stored_block", "block_hash",
  "tokens": [{"type": "unique_token", "token_id", "token_extra_id"}], "cache_level", "priority"}]}``;
* ``{"type": "removed", "block_hashes": [...]}`` (consecutive removals share one event);

``lora_id`` is not serialised upstream (the field is commented out there); the task id is inside the block
hash. ``updated`` events (priority / level changes) never happen here: one cache level, one priority.
The buffer keeps at most ``event_buffer_max_size`` events and drops the oldest first, as the C++
``KVCacheEventManager`` does (``cpp/tensorrt_llm/batch_manager/kvCacheEventManager.cpp`` @ 05843b0a).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

PRIMARY_CACHE_LEVEL = 0
"""``kPrimaryLevel``: GPU memory (the reference engine has no secondary, host-offload level)."""
DEFAULT_RETENTION_PRIORITY = 35
"""``KvCacheRetentionConfig::kDefaultRetentionPriority``."""


@dataclass(frozen=True)
class StoredBlock:
    block_hash: int
    tokens: tuple[int, ...]


class KvEventBuffer:
    """Events in upstream's JSON, numbered from 0, bounded; :meth:`drain` hands them out once."""

    def __init__(self, max_size: int, window_size: int) -> None:
        if max_size < 1:
            raise ValueError("event_buffer_max_size must be at least 1 to keep events")
        self._events: deque[dict[str, Any]] = deque(maxlen=max_size)
        self._window_size = window_size
        self._next_id = 0

    def created(self, primary_blocks: int) -> None:
        self._append({"type": "created", "num_blocks_per_cache_level": [primary_blocks, 0]})

    def stored(self, parent_hash: int | None, blocks: Sequence[StoredBlock]) -> None:
        if not blocks:
            return
        self._append({
            "type": "stored",
            "parent_hash": parent_hash,
            "blocks": [
                {
                    "type": "stored_block",
                    "block_hash": block.block_hash,
                    "tokens": [
                        {"type": "unique_token", "token_id": token, "token_extra_id": 0} for token in block.tokens
                    ],
                    "cache_level": PRIMARY_CACHE_LEVEL,
                    "priority": DEFAULT_RETENTION_PRIORITY,
                }
                for block in blocks
            ],
        })

    def removed(self, block_hash: int) -> None:
        last = self._events[-1] if self._events else None
        if last is not None and last["data"]["type"] == "removed":
            last["data"]["block_hashes"].append(block_hash)
            return
        self._append({"type": "removed", "block_hashes": [block_hash]})

    def drain(self) -> list[dict[str, Any]]:
        out = list(self._events)
        self._events.clear()
        return out

    def _append(self, data: dict[str, Any]) -> None:
        self._events.append({"event_id": self._next_id, "data": data, "window_size": self._window_size})
        self._next_id += 1
