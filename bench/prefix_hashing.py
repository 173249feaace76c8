"""What computing a request's KV block hashes adds per request (front-end cost), in microseconds, before and after
hashing became lazy.

    .venv/bin/python -m bench.prefix_hashing

For 1k / 8k / 32k-character prompts and both ways a front end cuts blocks (``BaseModelEntry.prompt_blocks``:
character chunks of 128 characters where the router has no tokenizer; exact 32-token blocks of the reference
runtime's byte tokenizer), the median of ``repeats`` timed calls of:

* **before**: the hashes computed at the front end for every request, whatever the policy, with the chain as it
  was (an int <-> bytes conversion per block; kept here as :func:`chain_before`, checked equal to the new one);
* **after, policy without prefixes**: what the front end does now, a lazy :class:`PromptBlocks` nobody reads
  (``round-robin``, ``least-load``, ``chwbl``, ``gie-lora-affinity``, ``adapter-affinity``);
* **after, pricing policy**: the lazy blocks read twice, by the decision and by the booking, as ``trtfleet``
  (and the prefix baselines) do: hashed once.

Printed, never asserted.
"""

from __future__ import annotations

import hashlib
import statistics
import time
from collections.abc import Callable

from trtfleet_router.chat import chat_renderer
from trtfleet_router.models_registry import (
    BYTES_PER_TOKEN_DEFAULT,
    BYTES_PER_TOKEN_REFERENCE,
    BaseModelEntry,
    EngineLimits,
)
from trtfleet_router.routing.prefix import (
    payload_block_hashes,
    reference_prompt_payload,
    root_hash,
    text_block_hashes,
)


def chain_before(root: int, data: bytes, block_bytes: int) -> tuple[int, ...]:
    """The chain of routing/prefix.py before this change: parent kept as an int, converted every block."""
    hashes: list[int] = []
    parent = root
    blake = hashlib.blake2b
    for start in range(0, len(data) // block_bytes * block_bytes, block_bytes):
        digest = blake(parent.to_bytes(8, "little") + data[start : start + block_bytes], digest_size=8).digest()
        parent = int.from_bytes(digest, "little")
        hashes.append(parent)
    return tuple(hashes)


def median_us(fn: Callable[[], object], repeats: int) -> float:
    samples = []
    for _ in range(repeats):
        began = time.perf_counter()
        fn()
        samples.append(time.perf_counter() - began)
    return statistics.median(samples) * 1e6


def entry(bytes_per_token: float) -> BaseModelEntry:
    return BaseModelEntry("m", "reference", EngineLimits(1 << 20, 1 << 20), chat_renderer("reference"),
                          bytes_per_token=bytes_per_token)


def main(repeats: int = 200) -> int:
    ways: list[tuple[str, BaseModelEntry, Callable[[str], object]]] = [
        ("chunks", entry(BYTES_PER_TOKEN_DEFAULT),
         lambda text: chain_before(root_hash(7, b"chr"), text.encode("ascii"), 128)),
        ("exact", entry(BYTES_PER_TOKEN_REFERENCE),
         lambda text: chain_before(root_hash(7), reference_prompt_payload(text), 128)),
    ]
    sample = "The quick brown fox jumps over the lazy dog. " * 30
    if ways[0][2](sample) != text_block_hashes(sample, 7, 32).hashes or ways[1][2](sample) != payload_block_hashes(
        reference_prompt_payload(sample), 7, 32
    ).hashes:
        raise AssertionError("chain_before no longer computes the router's hashes")
    print(f"{'chars':>6} {'cut':>7} {'blocks':>7} {'before us':>10} {'after, no prefix us':>20} "
          f"{'after, pricing us':>18}")
    for chars in (1_000, 8_000, 32_000):
        text = ("The quick brown fox jumps over the lazy dog. " * (chars // 45 + 1))[:chars]
        for name, base, eager in ways:
            blocks = len(base.prompt_blocks(text, 7).hashes)
            before = median_us(lambda text=text, eager=eager: eager(text), repeats)  # type: ignore[misc]
            unread = median_us(lambda text=text, base=base: base.prompt_blocks(text, 7), repeats)  # type: ignore[misc]

            def priced(text: str = text, base: BaseModelEntry = base) -> object:
                lazy = base.prompt_blocks(text, 7)
                return lazy.hashes, lazy.hashes  # the decision's match, then the booking

            read = median_us(priced, repeats)
            print(f"{chars:>6} {name:>7} {blocks:>7} {before:>10.1f} {unread:>20.2f} {read:>18.1f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
