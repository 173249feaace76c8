"""Text <-> token helpers shared by the reference preprocessing, postprocessing and BLS models (pure)."""

from __future__ import annotations

import codecs
from collections.abc import Iterable, Sequence

import numpy as np
from numpy.typing import NDArray

from trtfleet_engines.reference.tokenizer import BYTE_VOCAB_SIZE, ByteTokenizer, prompt_ids

_TOKENIZER = ByteTokenizer()


def encode_prompt(text: str) -> list[int]:
    """The prompt ids the tiny model expects for a user text (``<bos> bytes <sep>``)."""
    return prompt_ids(text)


def word_list(words: Iterable[str]) -> NDArray[np.int32]:
    """TRT-LLM's word-list tensor [2, L] for stop/bad words: concatenated ids, then end offsets (-1 padded).

    No words gives ``[[0], [-1]]``, as NVIDIA's preprocessing writes for an empty list.
    """
    ids: list[int] = []
    offsets: list[int] = []
    for word in words:
        encoded = _TOKENIZER.encode(word)
        if encoded:
            ids += encoded
            offsets.append(len(ids))
    if not ids:
        return np.array([[0], [-1]], dtype=np.int32)
    width = max(len(ids), len(offsets))
    table = np.full((2, width), -1, dtype=np.int32)
    table[0, :] = 0
    table[0, : len(ids)] = ids
    table[1, : len(offsets)] = offsets
    return table


def stack_word_lists(tables: Sequence[NDArray[np.int32]]) -> NDArray[np.int32]:
    """[batch, 2, L] from per-sequence [2, L_i] word lists (ids padded with 0, offsets with -1)."""
    width = max(table.shape[1] for table in tables)
    out = np.zeros((len(tables), 2, width), dtype=np.int32)
    out[:, 1, :] = -1
    for i, table in enumerate(tables):
        out[i, :, : table.shape[1]] = table
    return out


class IncrementalDecoder:
    """Decodes a token stream chunk by chunk without splitting multi-byte UTF-8 characters."""

    def __init__(self) -> None:
        self._decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")

    def feed(self, ids: Sequence[int]) -> str:
        return str(self._decoder.decode(bytes(int(i) for i in ids if 0 <= int(i) < BYTE_VOCAB_SIZE)))

    def flush(self) -> str:
        return str(self._decoder.decode(b"", final=True))
