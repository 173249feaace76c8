"""A paged KV cache with block reuse, as TRT-LLM's ``KVCacheManager`` keeps it (pure: no I/O, no clock).

A prompt is cut into blocks of ``tokens_per_block`` tokens. After a request's prefill, each of its *full*
prompt blocks is stored under a chained hash: the block's tokens, its parent's hash and the LoRA task id
(:func:`block_hash`, TRT-LLM's ``BlockKeyHasher::hash`` in ``cpp/tensorrt_llm/batch_manager/blockKey.cpp``
@ 0bd2980d; ``BlockKey`` in ``blockKey.h`` @ 0e14b465 holds tokens, ``loraTaskId``, ``cacheSaltID``), so a
block is found only by a request with the same task id and every token before it. A request without an
adapter hashes without a task id: its own key space. A later request takes its longest chain of cached
blocks (never the block holding its last prompt token: one token is always computed, as upstream only
matches ``promptLen - 1`` tokens), and the model starts from their K/V.

Capacity is ``max_blocks`` (what a router models). A request reserves the blocks of its prompt plus its
``max_new_tokens`` beyond the cached ones it shares (``GuaranteedNoEvict``); blocks no request holds stay
cached and are evicted least recently used first, descendants with them, when a reservation needs room.
Counters are cumulative like ``KvCacheStats``: ``reused_blocks`` (matched blocks, counted per request),
``missed_blocks`` (the prompt's other blocks), ``cache_hit_rate = reused / (reused + missed)``.
Partial reuse (``enable_partial_reuse``: matching the first tokens of a block) is not implemented.
"""

from __future__ import annotations

import math
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from trtfleet_engines.reference.kv_events import KvEventBuffer, StoredBlock

DEFAULT_TOKENS_PER_BLOCK = 32
"""``KvCacheConfig.tokens_per_block`` default (``tensorrt_llm/llmapi/llm_args.py`` @ fcd3f316)."""

_MASK64 = (1 << 64) - 1
_MASK32 = (1 << 32) - 1
_PARENT_MULTIPLIER = 0xBF58476D1CE4E5B9
_MIX32_MULTIPLIER = 0x045D9F3B
_MIX64_MULTIPLIER_1 = 0xBF58476D1CE4E5B9
_MIX64_MULTIPLIER_2 = 0x94D049BB133111EB
_GOLDEN = 0x9E3779B9


def _combine(seed: int, value: int) -> int:
    return (seed ^ ((value + (seed << 6) + (seed >> 2)) & _MASK64)) & _MASK64


def _mix32(token: int, seed: int) -> int:
    value = token & _MASK32
    value = (((value >> 16) ^ value) * _MIX32_MULTIPLIER) & _MASK32
    value = (((value >> 16) ^ value) * _MIX32_MULTIPLIER) & _MASK32
    value = ((value >> 16) ^ value) & _MASK32
    return _combine(seed, (value + _GOLDEN) & _MASK32)


def _mix64(number: int, seed: int) -> int:
    value = number & _MASK64
    value = ((value ^ (value >> 30)) * _MIX64_MULTIPLIER_1) & _MASK64
    value = ((value ^ (value >> 27)) * _MIX64_MULTIPLIER_2) & _MASK64
    value ^= value >> 31
    return _combine(seed, value + _GOLDEN)


def block_hash(tokens: Sequence[int], parent_hash: int, lora_task_id: int | None) -> int:
    """TRT-LLM's block hash (uint64): tokens, then the task id, seeded by the size and the parent's hash
    (0 for the first block). No extra ids, multimodal keys or cache salt: the reference engine has none."""
    seed = (len(tokens) ^ (parent_hash * _PARENT_MULTIPLIER)) & _MASK64
    for token in tokens:
        seed = _mix32(token, seed)
    if lora_task_id is not None:
        seed = _mix64(lora_task_id, seed)
    return seed


def chained_block_hashes(prompt: Sequence[int], tokens_per_block: int, lora_task_id: int | None) -> list[int]:
    """The hash of every full block of ``prompt``, each chained on the one before."""
    hashes: list[int] = []
    parent = 0
    for start in range(0, len(prompt) - tokens_per_block + 1, tokens_per_block):
        parent = block_hash(prompt[start : start + tokens_per_block], parent, lora_task_id)
        hashes.append(parent)
    return hashes


@dataclass(frozen=True)
class KvCacheSettings:
    max_blocks: int
    tokens_per_block: int = DEFAULT_TOKENS_PER_BLOCK
    enable_block_reuse: bool = True
    event_buffer_max_size: int = 0
    """0: no events (upstream's default)."""

    def __post_init__(self) -> None:
        if self.tokens_per_block < 1 or self.max_blocks < 1 or self.event_buffer_max_size < 0:
            raise ValueError(f"invalid KV cache settings {self}")


@dataclass(eq=False)
class CachedBlock:
    block_hash: int
    parent: CachedBlock | None
    tokens: tuple[int, ...]
    lora_task_id: int | None
    payload: Any
    """The model's K/V for these positions (opaque here)."""
    refs: int = 0
    children: set[int] = field(default_factory=set)


@dataclass(eq=False)
class Allocation:
    """One request's hold on the pool: the cached blocks it shares and the blocks reserved for the rest."""

    prompt: tuple[int, ...]
    lora_task_id: int | None
    shared: list[CachedBlock]
    private_blocks: int

    @property
    def reused_tokens(self) -> int:
        return sum(len(block.tokens) for block in self.shared)


@dataclass(frozen=True)
class KvCounters:
    reused_blocks: int = 0
    missed_blocks: int = 0
    alloc_total_blocks: int = 0
    alloc_new_blocks: int = 0

    @property
    def cache_hit_rate(self) -> float:
        looked_up = self.reused_blocks + self.missed_blocks
        return self.reused_blocks / looked_up if looked_up else 0.0


class BlockPool:
    """The pool; not thread-safe (the batcher calls it under its lock)."""

    def __init__(self, settings: KvCacheSettings, events: KvEventBuffer | None = None) -> None:
        self.settings = settings
        self.events = events
        self._cached: dict[int, CachedBlock] = {}
        self._roots: set[int] = set()
        self._idle: OrderedDict[int, CachedBlock] = OrderedDict()
        """Cached blocks no request holds, least recently used first."""
        self._private_blocks = 0
        self.counters = KvCounters()
        if events is not None:
            events.created(settings.max_blocks)

    # -- queries ---------------------------------------------------------------------------
    def blocks_for(self, tokens: int) -> int:
        return math.ceil(tokens / self.settings.tokens_per_block)

    @property
    def cached_blocks(self) -> int:
        return len(self._cached)

    @property
    def held_cached_blocks(self) -> int:
        return len(self._cached) - len(self._idle)

    def free_blocks(self) -> int:
        """Blocks a new reservation can have (idle cached blocks count: they are evicted on demand)."""
        return self.settings.max_blocks - self._private_blocks - self.held_cached_blocks

    def match(self, prompt: Sequence[int], lora_task_id: int | None) -> list[CachedBlock]:
        """The longest chain of cached blocks that starts ``prompt`` (no side effects)."""
        if not self.settings.enable_block_reuse:
            return []
        tpb = self.settings.tokens_per_block
        usable = (len(prompt) - 1) // tpb  # the last prompt token is always computed
        chain: list[CachedBlock] = []
        parent = 0
        for index in range(usable):
            tokens = tuple(prompt[index * tpb : (index + 1) * tpb])
            found = self._cached.get(block_hash(tokens, parent, lora_task_id))
            if found is None or found.tokens != tokens or found.lora_task_id != lora_task_id:
                break
            chain.append(found)
            parent = found.block_hash
        return chain

    # -- a request's life ------------------------------------------------------------------
    def allocate(self, prompt: Sequence[int], lora_task_id: int | None, max_new_tokens: int) -> Allocation | None:
        """Take the cached prefix and reserve the rest; None when the pool cannot hold it now."""
        shared = self.match(prompt, lora_task_id)
        private = self.blocks_for(len(prompt) + max_new_tokens) - len(shared)
        newly_held = sum(1 for block in shared if block.refs == 0)
        if private + newly_held > self.free_blocks():
            return None
        for block in shared:
            self._hold(block)
        self._make_room(private)
        self._private_blocks += private
        prompt_blocks = self.blocks_for(len(prompt))
        c = self.counters
        self.counters = KvCounters(
            reused_blocks=c.reused_blocks + len(shared),
            missed_blocks=c.missed_blocks + prompt_blocks - len(shared),
            alloc_total_blocks=c.alloc_total_blocks + prompt_blocks,
            alloc_new_blocks=c.alloc_new_blocks + prompt_blocks - len(shared),
        )
        return Allocation(tuple(prompt), lora_task_id, shared, private)

    def store(self, allocation: Allocation, payload: Callable[[int, int], Any]) -> None:
        """After prefill: cache the prompt's full blocks beyond the shared ones (``payload(start, stop)``
        gives their K/V); the request keeps holding them."""
        if not self.settings.enable_block_reuse:
            return
        tpb = self.settings.tokens_per_block
        prompt = allocation.prompt
        parent = allocation.shared[-1] if allocation.shared else None
        run: list[StoredBlock] = []
        run_parent: int | None = None
        for index in range(len(allocation.shared), len(prompt) // tpb):
            tokens = prompt[index * tpb : (index + 1) * tpb]
            key = block_hash(tokens, parent.block_hash if parent is not None else 0, allocation.lora_task_id)
            block = self._cached.get(key)
            if block is None:
                if not run:
                    run_parent = parent.block_hash if parent is not None else None
                kv = payload(index * tpb, (index + 1) * tpb)
                block = CachedBlock(key, parent, tokens, allocation.lora_task_id, kv)
                self._cached[key] = block
                (parent.children if parent is not None else self._roots).add(key)
                run.append(StoredBlock(key, tokens))
            else:  # another request cached this block meanwhile: share it, and end this event's run
                self._emit_stored(run_parent, run)
                run = []
            self._hold(block)
            allocation.shared.append(block)
            allocation.private_blocks -= 1
            self._private_blocks -= 1
            parent = block
        self._emit_stored(run_parent, run)

    def release(self, allocation: Allocation) -> None:
        """The request ended: free its reservation; its cached blocks stay, idle once nobody holds them."""
        self._private_blocks -= allocation.private_blocks
        allocation.private_blocks = 0
        for block in reversed(allocation.shared):  # leaves first: they are evicted before their parents
            block.refs -= 1
            if block.refs == 0:
                self._idle[block.block_hash] = block
        allocation.shared = []

    # -- internals -------------------------------------------------------------------------
    def _emit_stored(self, parent_hash: int | None, run: list[StoredBlock]) -> None:
        if self.events is not None and run:
            self.events.stored(parent_hash, run)

    def _hold(self, block: CachedBlock) -> None:
        block.refs += 1
        self._idle.pop(block.block_hash, None)

    def _make_room(self, blocks: int) -> None:
        while self._private_blocks + len(self._cached) + blocks > self.settings.max_blocks and self._idle:
            _, victim = self._idle.popitem(last=False)
            self._evict(victim)

    def _evict(self, block: CachedBlock) -> None:
        for child_hash in list(block.children):
            child = self._cached.get(child_hash)
            if child is not None:
                self._idle.pop(child_hash, None)
                self._evict(child)
        del self._cached[block.block_hash]
        (block.parent.children if block.parent is not None else self._roots).discard(block.block_hash)
        if self.events is not None:
            self.events.removed(block.block_hash)

