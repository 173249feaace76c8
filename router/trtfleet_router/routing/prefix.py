"""A request's KV-cache blocks as the router sees them: chained block hashes keyed by the adapter.

TensorRT-LLM caches KV state in blocks of ``tokens_per_block`` tokens (32 by default) and finds reusable
blocks by walking a radix tree from the first block; a block's key holds its tokens and the request's LoRA
task id (``cpp/include/tensorrt_llm/batch_manager/kvCacheManager.h``, ``BlockKey``), so block ``i`` is
reusable only where every block before it is cached for the same adapter. The router mirrors that with a
chain of 64-bit hashes: ``h_0 = H(seed(task id, kind) || block_0)``, ``h_i = H(h_{i-1} || block_i)``
(``H`` = BLAKE2b-64, the same on every replica and every run). Only full blocks count: a partial last block
is never reused by TRT-LLM's full-block reuse either.

Two ways to cut a prompt into blocks:

* **exact tokens** (:func:`token_block_hashes`): the token ids themselves. The router has them only for
  the reference runtime, whose byte-level tokenizer is ``<bos>`` + the prompt's UTF-8 bytes + ``<sep>``
  (:func:`reference_prompt_payload`); KV-cache events also carry token ids, so hashes computed from events
  (:mod:`~trtfleet_router.routing.kvevents`) equal the router's own.
* **character chunks** (:func:`text_block_hashes`): where the router has no tokenizer, blocks of
  ``round(block_tokens x chars_per_token)`` characters of the rendered prompt
  (:data:`CHARS_PER_TOKEN_DEFAULT` = 4, the usual figure for English text with Llama-3 and GPT tokenizers).
  An approximation: two prompts that share a character prefix share its chunks, so *which pods hold a
  prefix* is right, while *how many tokens* it covers is an estimate (chunks x block_tokens).
  These hashes never match event hashes (a different seed kind): a pod of such a base model is modelled
  from routing and corrected by its counters, never from events.

The cost is one BLAKE2b call per block (see ``bench/prefix_hashing.py`` for microseconds per prompt), paid
only when a policy that prices prefixes reads them (:meth:`PromptBlocks.lazy`).
"""

from __future__ import annotations

import hashlib
import sys
from array import array
from collections.abc import Callable, Sequence
from typing import Final

BLOCK_TOKENS_DEFAULT: Final = 32  # TensorRT-LLM's tokens_per_block default (KvCacheConfig)
CHARS_PER_TOKEN_DEFAULT: Final = 4.0
REFERENCE_BOS_ID: Final = 257  # engines' reference tokenizer: ids 0-255 are bytes, then PAD 256, BOS 257,
REFERENCE_SEP_ID: Final = 259  # EOS 258, SEP 259 (checked against the engine by a unit test)
_KIND_TOKENS: Final = b"tok"
_KIND_CHARS: Final = b"chr"
_HASH_BYTES: Final = 8


class PromptBlocks:
    """A request's full KV blocks: their chained hashes and the tokens each stands for.

    Lazy when made by :meth:`lazy`: the hashes are computed on the first read of :attr:`hashes` and kept, so a
    request whose policy never prices prefixes costs no hashing, and one that does hashes its prompt once
    however often routing, booking and retries read them.
    """

    __slots__ = ("_compute", "_hashes", "block_tokens", "exact")

    def __init__(self, hashes: tuple[int, ...], block_tokens: int, exact: bool) -> None:
        self._hashes: tuple[int, ...] | None = hashes
        self._compute: Callable[[], tuple[int, ...]] | None = None
        self.block_tokens = block_tokens
        self.exact = exact  # True: cut from token ids; False: character chunks (token counts are estimates)

    @classmethod
    def lazy(cls, compute: Callable[[], tuple[int, ...]], block_tokens: int, exact: bool) -> PromptBlocks:
        blocks = cls((), block_tokens, exact)
        blocks._hashes, blocks._compute = None, compute
        return blocks

    @property
    def hashes(self) -> tuple[int, ...]:
        hashes = self._hashes
        if hashes is None:
            assert self._compute is not None
            hashes = self._hashes = self._compute()
            self._compute = None
        return hashes

    @property
    def computed(self) -> bool:
        """Whether the hashes exist yet (a lazy request's prompt was hashed)."""
        return self._hashes is not None

    @property
    def tokens(self) -> int:
        return len(self.hashes) * self.block_tokens

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, PromptBlocks):
            return NotImplemented
        return (self.block_tokens, self.exact, self.hashes) == (other.block_tokens, other.exact, other.hashes)

    def __hash__(self) -> int:
        return hash((self.block_tokens, self.exact, self.hashes))

    def __repr__(self) -> str:
        shown = f"{len(self._hashes)} hashes" if self._hashes is not None else "not hashed yet"
        return f"PromptBlocks({shown}, block_tokens={self.block_tokens}, exact={self.exact})"


NO_BLOCKS: Final = PromptBlocks((), BLOCK_TOKENS_DEFAULT, False)


def _h(data: bytes) -> int:
    return int.from_bytes(hashlib.blake2b(data, digest_size=_HASH_BYTES).digest(), "little")


def root_hash(task_id: int, kind: bytes = _KIND_TOKENS) -> int:
    """The chain's seed: the adapter's task id (0 = base model) and how blocks were cut."""
    return _h(b"trtfleet-kv/" + kind + b"/" + task_id.to_bytes(8, "little", signed=False))


def chain_hash(parent: int, payload: bytes) -> int:
    """The hash of a block whose predecessor's hash is ``parent``."""
    return _h(parent.to_bytes(_HASH_BYTES, "little") + payload)


def token_payload(tokens: Sequence[int]) -> bytes:
    """Token ids as little-endian uint32 (the bytes a block's hash covers)."""
    return array("I", tokens).tobytes()


def _chain(root: int, data: bytes, block_bytes: int, limit: int) -> tuple[int, ...]:
    """The chain over ``data``'s full blocks: digests are chained as bytes and turned into ints once, at the end
    (one array conversion instead of two int <-> bytes conversions per block: 40 % less time)."""
    digests: list[bytes] = []
    parent = root.to_bytes(_HASH_BYTES, "little")
    blake = hashlib.blake2b
    for start in range(0, min(len(data) // block_bytes, limit) * block_bytes, block_bytes):
        parent = blake(parent + data[start : start + block_bytes], digest_size=_HASH_BYTES).digest()
        digests.append(parent)
    words = array("Q", b"".join(digests))
    if sys.byteorder != "little":
        words.byteswap()
    return tuple(words)


def token_block_hashes(
    tokens: Sequence[int], task_id: int, block_tokens: int, max_blocks: int = 1 << 20
) -> PromptBlocks:
    """Exact blocks of a token sequence (full blocks only, at most ``max_blocks``)."""
    return payload_block_hashes(token_payload(tokens), task_id, block_tokens, max_blocks)


def payload_block_hashes(payload: bytes, task_id: int, block_tokens: int, max_blocks: int = 1 << 20) -> PromptBlocks:
    """Exact blocks of tokens already laid out as :func:`token_payload` bytes."""
    if block_tokens < 1:
        raise ValueError("block_tokens must be at least 1")
    return PromptBlocks(_chain(root_hash(task_id), payload, 4 * block_tokens, max_blocks), block_tokens, True)


def reference_prompt_payload(prompt: str) -> bytes:
    """The reference engine's prompt ids ``<bos>`` + UTF-8 bytes + ``<sep>`` as :func:`token_payload` bytes
    (each byte widened to uint32 by one slice assignment, no per-byte Python loop)."""
    data = prompt.encode("utf-8")
    out = bytearray(4 * (len(data) + 2))
    out[0:4] = REFERENCE_BOS_ID.to_bytes(4, "little")
    out[4 : 4 * (len(data) + 1) : 4] = data
    out[4 * (len(data) + 1) :] = REFERENCE_SEP_ID.to_bytes(4, "little")
    return bytes(out)


def text_block_hashes(
    text: str,
    task_id: int,
    block_tokens: int,
    chars_per_token: float = CHARS_PER_TOKEN_DEFAULT,
    max_blocks: int = 1 << 20,
) -> PromptBlocks:
    """Character-chunk blocks: ``round(block_tokens x chars_per_token)`` characters each."""
    if block_tokens < 1 or chars_per_token <= 0:
        raise ValueError("block_tokens must be at least 1 and chars_per_token positive")
    chars = max(1, round(block_tokens * chars_per_token))
    count = min(len(text) // chars, max_blocks)
    root = root_hash(task_id, _KIND_CHARS)
    if text.isascii():  # one byte per character: cut the encoded bytes directly
        return PromptBlocks(_chain(root, text[: count * chars].encode("ascii"), chars, count), block_tokens, False)
    hashes: list[int] = []
    parent = root
    for index in range(count):
        parent = chain_hash(parent, text[index * chars : (index + 1) * chars].encode("utf-8"))
        hashes.append(parent)
    return PromptBlocks(tuple(hashes), block_tokens, False)
