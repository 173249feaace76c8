"""One LoRA adapter in the numpy forward's layout, parsed from TensorRT-LLM's request tensors.

``AdapterWeights.from_trtllm`` takes ``lora_weights`` [N, W] (or [1, N, W]; float16, float32, or
bfloat16 as raw uint16 / 2-byte void) and ``lora_config`` int32 [N, 3] rows [module_id, layer_idx, r],
row i of the weights being A (r x in, row-major) then B (out x r, row-major, already scaled),
zero-padded. Module in/out dimensions come from the ``LlamaConfig``. Per layer, modules that share an
input are stacked (q/k/v/qkv; gate/up/gate_up; o; down) so the forward applies each group with two
matmuls. TRT-LLM's fused ``mlp_gate_up`` (18) B rows are [up; gate].

Errors: ``ValueError`` with TRT-LLM-like texts (``lora_weights has to few values for attn_q`` [sic],
``Invalid low_rank``, ``Expected lora weights to be ...``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final

import numpy as np
from numpy.typing import NDArray

from trtfleet_engines.reference.llama_weights import LlamaConfig

FloatArray = NDArray[np.float32]

# TensorRT-LLM runtime LoRA module ids this forward understands (LoraManager.LORA_MODULE_IDS).
MODULE_NAMES: Final[dict[int, str]] = {
    0: "attn_qkv",
    1: "attn_q",
    2: "attn_k",
    3: "attn_v",
    4: "attn_dense",
    5: "mlp_h_to_4h",
    6: "mlp_4h_to_h",
    7: "mlp_gate",
    18: "mlp_gate_up",
}


@dataclass(frozen=True)
class LoraLayerWeights:
    """One (layer, module) of an adapter: ``a`` [r, in], ``b`` [out, r] already multiplied by the scale."""

    a: FloatArray
    b: FloatArray

    @property
    def rank(self) -> int:
        return int(self.a.shape[0])


@dataclass(frozen=True)
class FusedLora:
    """Modules sharing one input, stacked: ``delta = (x @ a_t) @ b_t`` covers all their outputs."""

    a_t: FloatArray  # [in, sum r]
    b_t: FloatArray  # [sum r, out of the dense projection]


@dataclass(frozen=True)
class LayerLora:
    qkv: FusedLora | None
    o: FusedLora | None
    gate_up: FusedLora | None
    down: FusedLora | None


def bfloat16_bits_to_float32(bits: NDArray[Any]) -> FloatArray:
    """Raw bfloat16 bit patterns (uint16 or 2-byte void) -> float32 (exact)."""
    raw = np.ascontiguousarray(bits).view(np.uint16)
    return (raw.astype(np.uint32) << 16).view(np.float32)


def _as_float32(weights: NDArray[Any]) -> FloatArray:
    if weights.dtype in (np.float16, np.float32, np.float64):
        return weights.astype(np.float32, copy=False)
    if weights.dtype == np.uint16 or (weights.dtype.kind == "V" and weights.dtype.itemsize == 2):
        return bfloat16_bits_to_float32(weights)
    raise ValueError(f"Expected lora weights to be float16, bfloat16 or float32, got {weights.dtype}")


class AdapterWeights:
    """One LoRA adapter keyed by (layer_idx, module_id); immutable after construction."""

    def __init__(self, config: LlamaConfig, modules: Mapping[tuple[int, int], LoraLayerWeights]) -> None:
        for (layer, module_id), weights in modules.items():
            if not 0 <= layer < config.num_layers:
                raise ValueError(f"lora layer {layer} out of range [0, {config.num_layers})")
            in_dim, out_dim = config.module_dims(module_id)
            r = weights.rank
            if weights.a.shape != (r, in_dim) or weights.b.shape != (out_dim, r):
                raise ValueError(
                    f"lora {MODULE_NAMES[module_id]} layer {layer}: A {weights.a.shape} / "
                    f"B {weights.b.shape} do not match in={in_dim} out={out_dim} r={r}"
                )
        self.config = config
        self.modules: Mapping[tuple[int, int], LoraLayerWeights] = dict(modules)
        self._layers = tuple(self._fuse_layer(layer) for layer in range(config.num_layers))

    @classmethod
    def from_trtllm(
        cls,
        lora_weights: NDArray[Any],
        lora_config: NDArray[Any],
        config: LlamaConfig,
        *,
        max_rank: int | None = None,
    ) -> AdapterWeights:
        """Parse TRT-LLM's request tensors: weights [N, W] (or [1, N, W]), config int32 [N, 3] (or [1, N, 3]).

        Row i of the weights is A (r x in, row-major) then B (out x r, row-major, scaled), zero-padded to W;
        row i of the config is [module_id, layer_idx, r]. bfloat16 may come as raw uint16 / 2-byte void.
        """
        weights = lora_weights[0] if lora_weights.ndim == 3 and lora_weights.shape[0] == 1 else lora_weights
        rows = lora_config[0] if lora_config.ndim == 3 and lora_config.shape[0] == 1 else lora_config
        if weights.ndim != 2:
            raise ValueError(f"Expected lora weights to be 2D [N, W], got shape {lora_weights.shape}")
        if rows.ndim != 2 or rows.shape[1] != 3:
            raise ValueError(
                f"Expected lora_config to be [N, 3] (module_id, layer_idx, adapter_size), got shape {lora_config.shape}"
            )
        if rows.shape[0] != weights.shape[0]:
            raise ValueError(f"lora_config has {rows.shape[0]} rows but lora_weights has {weights.shape[0]}")
        if rows.dtype.kind not in "iu":
            raise ValueError(f"Expected lora_config to be int32, got {rows.dtype}")
        values = _as_float32(weights)
        modules: dict[tuple[int, int], LoraLayerWeights] = {}
        for row, (module_id, layer, r) in zip(values, rows.tolist(), strict=True):
            if module_id not in MODULE_NAMES:
                raise ValueError(f"lora module id {module_id} is not supported by the reference engine")
            name = MODULE_NAMES[module_id]
            if r <= 0:
                raise ValueError(f"Invalid low_rank ({r}) for {name} layer {layer}")
            if max_rank is not None and r > max_rank:
                raise ValueError(f"Invalid low_rank ({r}). low_rank must be smaller than mMaxLoraRank ({max_rank})")
            in_dim, out_dim = config.module_dims(module_id)
            if values.shape[1] < r * (in_dim + out_dim):
                raise ValueError(f"lora_weights has to few values for {name}")
            if (layer, module_id) in modules:
                raise ValueError(f"lora_config repeats module {name} for layer {layer}")
            a = row[: r * in_dim].reshape(r, in_dim)
            b = row[r * in_dim : r * (in_dim + out_dim)].reshape(out_dim, r)
            modules[(layer, module_id)] = LoraLayerWeights(np.ascontiguousarray(a), np.ascontiguousarray(b))
        return cls(config, modules)

    def fused(self, layer: int, group: str) -> FusedLora | None:
        """The stacked LoRA of ``group`` (qkv, o, gate_up or down) in ``layer``, or None if untouched."""
        found: FusedLora | None = getattr(self._layers[layer], group)
        return found

    @property
    def max_rank(self) -> int:
        return max((w.rank for w in self.modules.values()), default=0)

    def _fuse(
        self,
        layer: int,
        parts: Sequence[tuple[int, Sequence[tuple[slice, slice]]]],
        in_dim: int,
        out_dim: int,
    ) -> FusedLora | None:
        """Stack modules sharing an input; each part maps B row ranges onto dense output columns."""
        present = [(self.modules[(layer, m)], spans) for m, spans in parts if (layer, m) in self.modules]
        if not present:
            return None
        total_rank = sum(w.rank for w, _ in present)
        a_t = np.zeros((in_dim, total_rank), np.float32)
        b_t = np.zeros((total_rank, out_dim), np.float32)
        offset = 0
        for w, spans in present:
            a_t[:, offset : offset + w.rank] = w.a.T
            for b_rows, out_cols in spans:
                b_t[offset : offset + w.rank, out_cols] += w.b[b_rows].T
            offset += w.rank
        return FusedLora(a_t, b_t)

    def _fuse_layer(self, layer: int) -> LayerLora:
        c = self.config
        q, kv, inter, hidden = c.q_size, c.kv_size, c.intermediate_size, c.hidden_size
        every = slice(None)
        qkv_parts = [
            (1, [(every, slice(0, q))]),
            (2, [(every, slice(q, q + kv))]),
            (3, [(every, slice(q + kv, q + 2 * kv))]),
            (0, [(every, slice(0, q + 2 * kv))]),
        ]
        # Dense gate_up columns are [gate | up]. TRT-LLM's fused mlp_gate_up B rows are [up ; gate]
        # (the converter swaps HF's [gate ; up] halves), so its halves land crosswise.
        gate_up_parts = [
            (5, [(every, slice(0, inter))]),
            (7, [(every, slice(inter, 2 * inter))]),
            (18, [(slice(0, inter), slice(inter, 2 * inter)), (slice(inter, 2 * inter), slice(0, inter))]),
        ]
        return LayerLora(
            qkv=self._fuse(layer, qkv_parts, hidden, q + 2 * kv),
            o=self._fuse(layer, [(4, [(every, slice(0, hidden))])], q, hidden),
            gate_up=self._fuse(layer, gate_up_parts, hidden, 2 * inter),
            down=self._fuse(layer, [(6, [(every, slice(0, hidden))])], inter, hidden),
        )
