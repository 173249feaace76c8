"""Mooncake-format traces (``timestamp`` ms, ``input_length``, ``output_length``, ``hash_ids``) as multi-LoRA,
prefix-sharing traces for the simulator and the real fleet.

Format (kvcache-ai/Mooncake ``FAST25-release/traces``): one JSON object per line; ``hash_ids`` holds one id
per 512-token block of the prompt, equal ids meaning equal leading tokens (a reusable KV prefix).

What this module makes of it, every rule stated and seeded:

* **Scaling** (:class:`MooncakeScale`): token counts times ``length_factor`` (a 512-token block becomes
  ``512 x length_factor`` tokens, at least 1 token of output), times in ``time_factor`` of the original;
  prompts longer than ``max_input_tokens`` are cut to it (their leading blocks kept), outputs to
  ``max_output_tokens``. The count of requests cut is reported.
* **Adapters per conversation** (:func:`assign_adapters`): a conversation is the set of requests whose first
  block id is the same (multi-turn requests extend the same prefix). Conversations, in order of first
  appearance, draw their adapter from a Zipf(``zipf_alpha``) popularity over ``num_adapters`` adapters with
  ``numpy.random.default_rng(seed)``; every turn of a conversation uses its adapter.
* **Blocks**: each prefix block id is cut into ``512 x length_factor / tokens_per_block`` router blocks and the
  chain hashed with :mod:`trtfleet_router.routing.prefix` from the adapter's task id (the index of the adapter's
  name in sorted order + 1, as ``bench.simulate.adapter_refs`` numbers them), so equal ids under the same adapter
  give equal hashes and the same ids under another adapter do not. Only full blocks of the scaled prompt count.
"""

from __future__ import annotations

import json
import math
from collections import OrderedDict
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from trtfleet_router.routing.prefix import chain_hash, root_hash

from bench.traces import TraceRequest, zipf_weights

MOONCAKE_BLOCK_TOKENS = 512


@dataclass(frozen=True, slots=True)
class MooncakeRow:
    timestamp_ms: float
    input_length: int
    output_length: int
    hash_ids: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class MooncakeScale:
    length_factor: float = 0.125  # a 512-token block -> 64 tokens
    time_factor: float = 0.004  # 1,022 s of trace in 4.1 s (about 980 req/s on 64 pods)
    max_input_tokens: int = 8000
    max_output_tokens: int = 1024
    tokens_per_block: int = 32
    num_adapters: int = 50
    zipf_alpha: float = 1.0
    seed: int = 21

    @property
    def router_blocks_per_id(self) -> int:
        return max(1, round(MOONCAKE_BLOCK_TOKENS * self.length_factor) // self.tokens_per_block)


def read_mooncake(path: Path) -> list[MooncakeRow]:
    """The rows of a Mooncake JSONL file; a malformed line raises ``ValueError`` naming it."""
    rows = []
    with path.open(encoding="utf-8") as lines:
        for number, line in enumerate(lines, 1):
            if not line.strip():
                continue
            try:
                rows.append(_row(json.loads(line)))
            except (ValueError, KeyError, TypeError) as exc:
                raise ValueError(f"{path}:{number}: not a Mooncake trace row ({exc})") from exc
    return rows


def _row(item: Any) -> MooncakeRow:
    """One parsed line as a row; a missing field, a negative length, a time that is not a finite number or block
    ids that are not a list of integers raise."""
    timestamp = float(item["timestamp"])
    lengths = int(item["input_length"]), int(item["output_length"])
    blocks = item["hash_ids"]
    if not math.isfinite(timestamp):
        raise ValueError(f"timestamp {timestamp} is not a finite number")
    if min(lengths) < 0:
        raise ValueError(f"negative length {min(lengths)}")
    if not isinstance(blocks, list) or not all(isinstance(h, int) and not isinstance(h, bool) for h in blocks):
        raise ValueError("hash_ids is not a list of integers")
    return MooncakeRow(timestamp, lengths[0], lengths[1], tuple(blocks))


def assign_adapters(rows: list[MooncakeRow], num_adapters: int, zipf_alpha: float, seed: int) -> list[str]:
    """One adapter name per row: conversations (same first block id) draw one Zipf adapter each, in order."""
    width = max(4, len(str(num_adapters - 1)))
    names = [f"a{i:0{width}d}" for i in range(num_adapters)]
    rng = np.random.default_rng(seed)
    weights = zipf_weights(num_adapters, zipf_alpha)
    chosen: dict[int, str] = {}
    out = []
    for row in rows:
        root = row.hash_ids[0] if row.hash_ids else -1 - len(chosen)
        if root not in chosen:
            chosen[root] = names[int(rng.choice(num_adapters, p=weights))]
        out.append(chosen[root])
    return out


def mooncake_trace(
    rows: list[MooncakeRow], scale: MooncakeScale, *, blocks: bool = True
) -> tuple[list[TraceRequest], int]:
    """(the scaled trace, requests whose prompt was cut to ``max_input_tokens``); its requests carry their prefix
    blocks unless ``blocks`` is False (adapters are drawn by conversation either way)."""
    adapters = assign_adapters(rows, scale.num_adapters, scale.zipf_alpha, scale.seed)
    task_ids = {name: index + 1 for index, name in enumerate(sorted(set(adapters)))}
    per_id = scale.router_blocks_per_id
    start_ms = min((row.timestamp_ms for row in rows), default=0.0)
    cut = 0
    trace = []
    for index, (row, adapter) in enumerate(zip(rows, adapters, strict=True)):
        prompt = max(1, round(row.input_length * scale.length_factor))
        if prompt > scale.max_input_tokens:
            prompt, cut = scale.max_input_tokens, cut + 1
        output = min(scale.max_output_tokens, max(1, round(row.output_length * scale.length_factor)))
        full = prompt // scale.tokens_per_block
        hashes: list[int] = []
        parent = root_hash(task_ids[adapter])
        for block_id in row.hash_ids if blocks else ():
            for part in range(per_id):
                if len(hashes) >= full:
                    break
                parent = chain_hash(parent, block_id.to_bytes(8, "little") + part.to_bytes(2, "little"))
                hashes.append(parent)
        trace.append(TraceRequest((row.timestamp_ms - start_ms) / 1000.0 * scale.time_factor, f"m{index:06d}",
                                  adapter, prompt, output, tuple(hashes)))
    trace.sort(key=lambda request: request.t_s)
    return trace, cut


def reusable_blocks(trace: list[TraceRequest], capacity_blocks: int | None = None) -> list[int]:
    """Per request, its leading blocks that an earlier request of the trace already had (what one pod with an
    unbounded cache serving everything could reuse): the "possible" of "reused / possible".

    With ``capacity_blocks``, what one cache of that many blocks could reuse, evicting the least recently used
    block first and touching a request's last block first (as the engines keep a prefix longer than its tails).
    With the fleet's combined KV cache, an estimate of what routing can reuse on that fleet, not a bound: pods
    that each keep their own conversations can keep more than one shared LRU."""
    seen: OrderedDict[int, None] = OrderedDict()
    out = []
    for request in trace:
        count = 0
        for block in request.blocks:
            if block not in seen:
                break
            count += 1
        out.append(count)
        for block in reversed(request.blocks):
            seen[block] = None
            seen.move_to_end(block)
        while capacity_blocks is not None and len(seen) > capacity_blocks:
            seen.popitem(last=False)
    return out


def ttft_floor_s(trace: list[TraceRequest], reused: list[int], block_tokens: int, step_s: float,
                 prefill_s_per_token: float) -> float:
    """Mean first-token time with no queueing at all: one step plus the prefill of each prompt's tokens outside
    its ``reused`` leading blocks (at least one token is computed), as the reference engine charges it."""
    total = sum(step_s + max(1, r.prompt_tokens - n * block_tokens) * prefill_s_per_token
                for r, n in zip(trace, reused, strict=True))
    return total / len(trace) if trace else 0.0
