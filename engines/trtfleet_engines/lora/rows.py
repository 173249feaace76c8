"""A converted adapter as data: its rows (module, layer, rank, shapes) and its TRT-LLM arrays.

Shared by the converter, which makes it, and the manifest, which records it; neither imports the other
for it (the import-linter contract ``lora-layers`` keeps ``manifest`` below ``convert``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
from numpy.typing import NDArray

from trtfleet.api.basemodel import LORA_MODULE_IDS, Dtype, LoraModule


@dataclass(frozen=True)
class LoraRow:
    module: LoraModule
    layer: int
    rank: int
    in_dim: int
    out_dim: int

    @property
    def module_id(self) -> int:
        return LORA_MODULE_IDS[self.module]

    @property
    def elements(self) -> int:
        return self.rank * (self.in_dim + self.out_dim)


@dataclass(frozen=True)
class ConvertedAdapter:
    weights: NDArray[Any]  # [1, N, W] float16, or |V2 bfloat16 bit patterns
    config: NDArray[np.int32]  # [1, N, 3]
    rows: tuple[LoraRow, ...]
    dtype: Dtype
