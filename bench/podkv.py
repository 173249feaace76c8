"""A simulated pod's KV-cache block reuse: what TensorRT-LLM's ``enable_block_reuse`` gives a request.

Blocks are the request's chained block hashes (the trace's prefix ids cut to ``tokens_per_block`` and keyed
by the adapter's task id, :mod:`bench.mooncake`), so a block is found only for the same adapter and the same
leading tokens, as TRT-LLM's ``BlockKey`` (tokens + LoRA task id) does. At admission the leading blocks the
pod holds are reused (their prefill is skipped: the step is charged for the uncached tokens only), then all
of the request's blocks become the most recently used, first block last, and the least recently used blocks
beyond the pod's capacity are evicted (leaves before their parents, as TRT-LLM evicts). Blocks of running
requests are not pinned: the reservation of ``prompt + max_tokens`` tokens per request in
:class:`bench.podsim.SimPod` already keeps the batch within the pod's KV capacity. Counters mirror
trtllm-serve's ``kvCacheStats{reusedBlocks, missedBlocks}``.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence


class PodKvBlocks:
    __slots__ = ("blocks", "capacity_blocks", "missed_total", "reused_total")

    def __init__(self, capacity_blocks: int) -> None:
        self.capacity_blocks = capacity_blocks
        self.blocks: OrderedDict[int, None] = OrderedDict()
        self.reused_total = 0
        self.missed_total = 0

    def cached_prefix(self, hashes: Sequence[int]) -> int:
        """Leading blocks of ``hashes`` held now."""
        held = 0
        blocks = self.blocks
        for block in hashes:
            if block not in blocks:
                break
            held += 1
        return held

    def admit(self, hashes: Sequence[int]) -> int:
        """A request with these blocks joins the batch: its reused blocks (counted), then it holds them all."""
        reused = self.cached_prefix(hashes)
        self.reused_total += reused
        self.missed_total += len(hashes) - reused
        blocks = self.blocks
        for block in reversed(hashes):
            if block in blocks:
                blocks.move_to_end(block)
            else:
                blocks[block] = None
        while len(blocks) > self.capacity_blocks:
            blocks.popitem(last=False)
        return reused
