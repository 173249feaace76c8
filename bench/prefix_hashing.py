"""What computing a request's KV block hashes adds per request (front-end cost), in microseconds.

    .venv/bin/python -m bench.prefix_hashing

For 1k / 8k / 32k-character prompts: character chunks (no tokenizer; 128 characters a block) and exact token
blocks of the reference runtime's byte tokenizer (32 bytes a block), the median of ``repeats`` timed calls of
``BaseModelEntry.prompt_blocks``' two paths. Printed, never asserted.
"""

from __future__ import annotations

import statistics
import time

from trtfleet_router.routing.prefix import payload_block_hashes, reference_prompt_payload, text_block_hashes


def median_us(fn: object, repeats: int) -> float:
    samples = []
    for _ in range(repeats):
        began = time.perf_counter()
        fn()  # type: ignore[operator]
        samples.append(time.perf_counter() - began)
    return statistics.median(samples) * 1e6


def main() -> int:
    print("chars   blocks(chars)  chunks us   blocks(tokens)  exact us")
    for chars in (1_000, 8_000, 32_000):
        text = ("The quick brown fox jumps over the lazy dog. " * (chars // 45 + 1))[:chars]
        chunks = text_block_hashes(text, 7, 32)
        exact = payload_block_hashes(reference_prompt_payload(text), 7, 32)
        chunk_us = median_us(lambda text=text: text_block_hashes(text, 7, 32), 200)
        exact_us = median_us(lambda text=text: payload_block_hashes(reference_prompt_payload(text), 7, 32), 200)
        print(f"{chars:>6} {len(chunks.hashes):>13} {chunk_us:>10.1f} {len(exact.hashes):>15} {exact_us:>9.1f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
