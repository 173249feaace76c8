"""Byte-level tokenizer of the tiny reference Llama.

Ids 0-255 are the UTF-8 bytes of the text; four specials follow: ``PAD_ID`` 256, ``BOS_ID`` 257,
``EOS_ID`` 258 and ``SEP_ID`` 259 (``VOCAB_SIZE`` 260). The model was trained on the prompt format
``<bos> prompt-bytes <sep>``, after which it writes its answer and ``<eos>``; ``prompt_ids`` builds
exactly that. Nothing here can fail: every string encodes, and ``decode`` drops specials and replaces
invalid UTF-8 (a byte sequence cut in the middle of a character) with U+FFFD.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Final

BYTE_VOCAB_SIZE: Final = 256
PAD_ID: Final = 256
BOS_ID: Final = 257
EOS_ID: Final = 258
SEP_ID: Final = 259
VOCAB_SIZE: Final = 260

SPECIAL_TOKENS: Final[dict[int, str]] = {PAD_ID: "<pad>", BOS_ID: "<bos>", EOS_ID: "<eos>", SEP_ID: "<sep>"}


class ByteTokenizer:
    """Stateless byte tokenizer; one instance can be shared by any number of threads."""

    pad_id: Final = PAD_ID
    bos_id: Final = BOS_ID
    eos_id: Final = EOS_ID
    sep_id: Final = SEP_ID
    vocab_size: Final = VOCAB_SIZE

    def encode(self, text: str) -> list[int]:
        """The UTF-8 bytes of ``text`` as ids, no specials added."""
        return list(text.encode("utf-8"))

    def decode(self, ids: Sequence[int]) -> str:
        """Text of the byte ids in ``ids``; special ids are skipped, invalid UTF-8 becomes U+FFFD."""
        return bytes(int(i) for i in ids if 0 <= int(i) < BYTE_VOCAB_SIZE).decode("utf-8", errors="replace")

    def prompt_ids(self, text: str) -> list[int]:
        """The exact prompt format the model was trained on: ``<bos>`` + bytes + ``<sep>``."""
        return prompt_ids(text)


def encode(text: str) -> list[int]:
    return ByteTokenizer().encode(text)


def decode(ids: Sequence[int]) -> str:
    return ByteTokenizer().decode(ids)


def prompt_ids(text: str) -> list[int]:
    """``<bos>`` + the UTF-8 bytes of ``text`` + ``<sep>``: what the model expects before its answer."""
    return [BOS_ID, *text.encode("utf-8"), SEP_ID]
