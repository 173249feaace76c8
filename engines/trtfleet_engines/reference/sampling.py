"""Token sampling of the reference engine: greedy, or seeded temperature / top-k / top-p.

Pure: every request owns its own ``numpy.random.Generator`` seeded from its ``seed`` input (TRT-LLM's
``random_seed``, default 0), so a request samples the same tokens whether it runs alone or in a batch.
Greedy decoding is used when ``temperature`` is 0, ``top_k`` is 1, or neither ``top_k`` nor ``top_p`` is
set (TRT-LLM's default sampling config).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
from numpy.typing import NDArray

DEFAULT_SEED = 0
"""TRT-LLM's default ``random_seed``."""


@dataclass(frozen=True)
class SamplingParams:
    """Sampling inputs of a request (``temperature``, ``runtime_top_k``, ``runtime_top_p``, ``seed``)."""

    temperature: float = 1.0
    top_k: int = 0
    top_p: float = 0.0
    seed: int = DEFAULT_SEED

    @property
    def greedy(self) -> bool:
        return self.temperature <= 0.0 or self.top_k == 1 or (self.top_k <= 0 and self.top_p <= 0.0)

    def new_generator(self) -> np.random.Generator:
        return np.random.default_rng(self.seed)


def sample_token(logits: NDArray[Any], params: SamplingParams, rng: np.random.Generator) -> int:
    """The next token for one row of ``logits`` [vocab]."""
    if params.greedy:
        return int(np.argmax(logits))
    scores = np.asarray(logits, dtype=np.float64) / params.temperature
    order = np.argsort(-scores, kind="stable")
    if params.top_k > 0:
        order = order[: params.top_k]
    kept = scores[order]
    probs = np.exp(kept - kept.max())
    probs /= probs.sum()
    if 0.0 < params.top_p < 1.0:
        cumulative = np.cumsum(probs)
        keep = int(np.searchsorted(cumulative, params.top_p) + 1)
        order, probs = order[:keep], probs[:keep] / probs[:keep].sum()
    return int(order[rng.choice(len(order), p=probs)])
