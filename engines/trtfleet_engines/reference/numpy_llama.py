"""A Llama forward pass in numpy with in-flight batching and per-row multi-LoRA.

It runs the tiny reference model (``assets/tiny-llama``: HF ``config.json`` + ``model.safetensors``)
exactly as transformers' ``LlamaForCausalLM`` does (RMSNorm, rotate-half RoPE, grouped-query
attention, SwiGLU), in float32, and applies LoRA adapters given in TensorRT-LLM's runtime format
(``lora_weights`` [N, W] + ``lora_config`` [N, 3], see ``AdapterWeights.from_trtllm``).

``TinyLlama.step`` takes a mixed batch the way an in-flight batcher does: some rows prefill a whole
prompt, others decode one token. All new tokens are packed (no padding) for the dense projections;
each row's adapter is applied to that row's tokens only (rows sharing an adapter are gathered into
one segment, as SGMV multi-LoRA kernels do); attention runs per row against its own KV cache.
Decode rows share one padded, masked attention call.

Errors: every problem with a caller's input raises ``ValueError`` (texts modelled on TensorRT-LLM's
where one exists, e.g. ``lora_weights has to few values for attn_q`` [sic]); a model directory that
cannot be read raises ``FileNotFoundError`` / ``ValueError``. Nothing here does I/O after loading.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Final

import numpy as np
from numpy.typing import NDArray

from trtfleet_engines.reference.llama_weights import (
    ASSETS_DIR,
    SAMPLE_ADAPTER_NAMES,
    SAMPLE_ADAPTERS_DIR,
    TINY_LLAMA_DIR,
    LayerWeights,
    LlamaConfig,
    LlamaWeights,
)
from trtfleet_engines.reference.numpy_lora import (
    MODULE_NAMES,
    AdapterWeights,
    LoraLayerWeights,
    bfloat16_bits_to_float32,
)
from trtfleet_engines.reference.tokenizer import EOS_ID

__all__ = [
    "ASSETS_DIR",
    "MODULE_NAMES",
    "SAMPLE_ADAPTERS_DIR",
    "SAMPLE_ADAPTER_NAMES",
    "TINY_LLAMA_DIR",
    "AdapterWeights",
    "KvSlice",
    "LayerWeights",
    "LlamaConfig",
    "LlamaWeights",
    "LoraLayerWeights",
    "SequenceState",
    "StepRow",
    "TinyLlama",
    "bfloat16_bits_to_float32",
    "greedy_generate",
]

logger = logging.getLogger(__name__)

FloatArray = NDArray[np.float32]

_INITIAL_CACHE_TOKENS: Final = 64


class SequenceState:
    """One sequence's KV cache (per layer [kv_heads, capacity, head_dim]) and its length in tokens."""

    def __init__(self, config: LlamaConfig, capacity_tokens: int = _INITIAL_CACHE_TOKENS) -> None:
        self.config = config
        self.length = 0
        shape = (config.num_kv_heads, max(1, capacity_tokens), config.head_dim)
        self.keys = [np.zeros(shape, np.float32) for _ in range(config.num_layers)]
        self.values = [np.zeros(shape, np.float32) for _ in range(config.num_layers)]

    @property
    def position(self) -> int:
        """Position of the next token (= tokens already in the cache)."""
        return self.length

    @property
    def kv_cache_bytes(self) -> int:
        return sum(k.nbytes + v.nbytes for k, v in zip(self.keys, self.values, strict=True))

    def _reserve(self, tokens: int) -> None:
        needed = self.length + tokens
        if needed > self.config.max_position_embeddings:
            raise ValueError(
                f"sequence of {needed} tokens exceeds max_position_embeddings {self.config.max_position_embeddings}"
            )
        capacity = self.keys[0].shape[1]
        if needed <= capacity:
            return
        new_capacity = min(max(needed, 2 * capacity), self.config.max_position_embeddings)
        for cache in (self.keys, self.values):
            for i, old in enumerate(cache):
                grown = np.zeros((old.shape[0], new_capacity, old.shape[2]), np.float32)
                grown[:, : self.length] = old[:, : self.length]
                cache[i] = grown


@dataclass(frozen=True, eq=False)
class KvSlice:
    """K and V of consecutive positions, per layer [kv_heads, tokens, head_dim]."""

    keys: tuple[FloatArray, ...]
    values: tuple[FloatArray, ...]

    @property
    def tokens(self) -> int:
        return int(self.keys[0].shape[1])


@dataclass(frozen=True)
class StepRow:
    """One row of a step: ``tokens`` int32 1-D (a whole prompt on prefill, one token on decode, the last token
    and its draft when verifying a speculation); ``all_logits``: :meth:`TinyLlama.step_rows` returns the logits
    of every new token of the row, not only of its last."""

    state: SequenceState
    tokens: NDArray[Any]
    adapter: AdapterWeights | None = None
    all_logits: bool = False


def _rms_norm(x: FloatArray, weight: FloatArray, eps: float) -> FloatArray:
    variance = np.mean(x * x, axis=-1, keepdims=True)
    out: FloatArray = x / np.sqrt(variance + eps) * weight
    return out


def _silu(x: FloatArray) -> FloatArray:
    """x * sigmoid(x), with sigmoid via tanh so large |x| cannot overflow exp."""
    out: FloatArray = x * (0.5 + 0.5 * np.tanh(0.5 * x))
    return out


def _softmax_inplace(scores: FloatArray) -> FloatArray:
    scores -= scores.max(axis=-1, keepdims=True)
    np.exp(scores, out=scores)
    scores /= scores.sum(axis=-1, keepdims=True)
    return scores


class TinyLlama:
    """The forward pass; stateless apart from the read-only weights, so threads may share one instance."""

    def __init__(self, weights: LlamaWeights) -> None:
        self.weights = weights
        self.config = c = weights.config
        half = c.head_dim // 2
        inv_freq = 1.0 / (c.rope_theta ** (np.arange(0, c.head_dim, 2, dtype=np.float32) / c.head_dim))
        angles = np.arange(c.max_position_embeddings, dtype=np.float32)[:, None] * inv_freq[None, :half]
        self._cos = np.cos(angles).astype(np.float32)  # [positions, head_dim / 2]
        self._sin = np.sin(angles).astype(np.float32)
        self._scale = np.float32(1.0 / math.sqrt(c.head_dim))

    def new_sequence(self) -> SequenceState:
        return SequenceState(self.config)

    def export_kv(self, state: SequenceState, start: int, stop: int) -> KvSlice:
        """A copy of positions [start, stop) of ``state``'s cache (what a KV-cache block stores)."""
        if not 0 <= start < stop <= state.length:
            raise ValueError(f"positions [{start}, {stop}) are not all in a cache of {state.length} tokens")
        return KvSlice(
            tuple(k[:, start:stop].copy() for k in state.keys), tuple(v[:, start:stop].copy() for v in state.values)
        )

    def sequence_from(self, prefix: Sequence[KvSlice]) -> SequenceState:
        """A sequence whose cache already holds ``prefix`` (consecutive slices from position 0): its
        prefill computes only the tokens after them."""
        total = sum(piece.tokens for piece in prefix)
        state = SequenceState(self.config, max(total + 1, _INITIAL_CACHE_TOKENS))
        position = 0
        for piece in prefix:
            end = position + piece.tokens
            for layer in range(self.config.num_layers):
                state.keys[layer][:, position:end] = piece.keys[layer]
                state.values[layer][:, position:end] = piece.values[layer]
            position = end
        state.length = total
        return state

    def _rope(self, x: FloatArray, cos: FloatArray, sin: FloatArray) -> FloatArray:
        """Rotate-half RoPE on [T, heads, head_dim] with cos/sin [T, 1, head_dim / 2]."""
        half = self.config.head_dim // 2
        x1, x2 = x[..., :half], x[..., half:]
        return np.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], axis=-1)

    def step(self, rows: Sequence[StepRow]) -> FloatArray:
        """Run one in-flight batch; returns logits [len(rows), vocab] of each row's last new token."""
        if not rows:
            return np.zeros((0, self.config.vocab_size), np.float32)
        x, starts = self._forward(rows)
        return self._logits(x[starts[1:] - 1])

    def step_rows(self, rows: Sequence[StepRow]) -> list[FloatArray]:
        """Run one in-flight batch; per row, the logits [n, vocab] of its new tokens (``n`` = all of them for a
        row with ``all_logits``, else 1: its last). One forward pass either way: a speculation's draft is verified
        in the step that decodes its request's last token."""
        if not rows:
            return []
        x, starts = self._forward(rows)
        picked = [np.arange(starts[i], starts[i + 1]) if row.all_logits else np.array([starts[i + 1] - 1])
                  for i, row in enumerate(rows)]
        logits = self._logits(x[np.concatenate(picked)])
        bounds = np.cumsum([0, *(len(p) for p in picked)])
        return [logits[bounds[i]:bounds[i + 1]] for i in range(len(rows))]

    def _logits(self, hidden: FloatArray) -> FloatArray:
        out: FloatArray = _rms_norm(hidden, self.weights.final_norm, self.config.rms_norm_eps) @ self.weights.lm_head_t
        return out

    def _forward(self, rows: Sequence[StepRow]) -> tuple[FloatArray, NDArray[Any]]:
        """The final hidden states of every new token of the batch, and the rows' token offsets."""
        c = self.config
        counts = [int(np.asarray(r.tokens).size) for r in rows]
        if min(counts) < 1:
            raise ValueError("every row of a step needs at least one new token")
        if len({id(r.state) for r in rows}) != len(rows):
            raise ValueError("a sequence may appear only once per step")
        tokens = np.concatenate([np.asarray(r.tokens, dtype=np.int64).reshape(-1) for r in rows])
        if tokens.min() < 0 or tokens.max() >= c.vocab_size:
            raise ValueError(f"token id out of range [0, {c.vocab_size})")
        for row, n in zip(rows, counts, strict=True):
            row.state._reserve(n)
        starts = np.cumsum([0, *counts])
        positions = np.concatenate(
            [np.arange(r.state.length, r.state.length + n) for r, n in zip(rows, counts, strict=True)]
        )
        cos = self._cos[positions][:, None, :]
        sin = self._sin[positions][:, None, :]
        segments = self._adapter_segments(rows, starts)
        decode_rows = [i for i, n in enumerate(counts) if n == 1]
        verify_rows = [i for i, n in enumerate(counts) if n > 1 and rows[i].all_logits]
        total = int(starts[-1])

        x = self.weights.embed[tokens]
        for layer_idx, w in enumerate(self.weights.layers):
            h = _rms_norm(x, w.input_norm, c.rms_norm_eps)
            qkv = h @ w.qkv_t
            self._apply_lora(qkv, h, segments, layer_idx, "qkv")
            q = self._rope(qkv[:, : c.q_size].reshape(total, c.num_heads, c.head_dim), cos, sin)
            k = self._rope(qkv[:, c.q_size : c.q_size + c.kv_size].reshape(total, c.num_kv_heads, c.head_dim), cos, sin)
            v = qkv[:, c.q_size + c.kv_size :].reshape(total, c.num_kv_heads, c.head_dim)
            for i, row in enumerate(rows):
                s, e, start = starts[i], starts[i + 1], row.state.length
                row.state.keys[layer_idx][:, start : start + e - s] = k[s:e].transpose(1, 0, 2)
                row.state.values[layer_idx][:, start : start + e - s] = v[s:e].transpose(1, 0, 2)
            attn = np.empty((total, c.q_size), np.float32)
            self._attend_decode(attn, q, rows, starts, decode_rows, layer_idx)
            self._attend_verify(attn, q, rows, starts, counts, verify_rows, layer_idx)
            for i, n in enumerate(counts):
                if n > 1 and not rows[i].all_logits:
                    self._attend_prefill(attn, q, rows[i], int(starts[i]), n, layer_idx)
            o = attn @ w.o_t
            self._apply_lora(o, attn, segments, layer_idx, "o")
            x = x + o
            h = _rms_norm(x, w.post_norm, c.rms_norm_eps)
            gate_up = h @ w.gate_up_t
            self._apply_lora(gate_up, h, segments, layer_idx, "gate_up")
            act = _silu(gate_up[:, : c.intermediate_size]) * gate_up[:, c.intermediate_size :]
            down = act @ w.down_t
            self._apply_lora(down, act, segments, layer_idx, "down")
            x = x + down
        for row, n in zip(rows, counts, strict=True):
            row.state.length += n
        return x, starts

    @staticmethod
    def _adapter_segments(
        rows: Sequence[StepRow], starts: NDArray[Any]
    ) -> list[tuple[AdapterWeights, slice | NDArray[Any]]]:
        """Token indices of each distinct adapter in the batch (a slice when they are contiguous)."""
        by_adapter: dict[int, tuple[AdapterWeights, list[int]]] = {}
        for i, row in enumerate(rows):
            if row.adapter is not None:
                by_adapter.setdefault(id(row.adapter), (row.adapter, []))[1].append(i)
        segments: list[tuple[AdapterWeights, slice | NDArray[Any]]] = []
        for adapter, row_ids in by_adapter.values():
            if row_ids == list(range(row_ids[0], row_ids[-1] + 1)):
                segments.append((adapter, slice(int(starts[row_ids[0]]), int(starts[row_ids[-1] + 1]))))
            else:
                segments.append((adapter, np.concatenate([np.arange(starts[i], starts[i + 1]) for i in row_ids])))
        return segments

    @staticmethod
    def _apply_lora(
        y: FloatArray,
        x: FloatArray,
        segments: Sequence[tuple[AdapterWeights, slice | NDArray[Any]]],
        layer: int,
        group: str,
    ) -> None:
        for adapter, index in segments:
            fused = adapter.fused(layer, group)
            if fused is not None:
                y[index] += (x[index] @ fused.a_t) @ fused.b_t

    def _attend_decode(
        self,
        out: FloatArray,
        q: FloatArray,
        rows: Sequence[StepRow],
        starts: NDArray[Any],
        decode_rows: list[int],
        layer: int,
    ) -> None:
        """All one-token rows in one padded, masked batched attention."""
        if not decode_rows:
            return
        c = self.config
        group = c.num_heads // c.num_kv_heads
        lengths = np.array([rows[i].state.length + 1 for i in decode_rows])
        max_len = int(lengths.max())
        batch = len(decode_rows)
        keys = np.zeros((batch, c.num_kv_heads, max_len, c.head_dim), np.float32)
        values = np.zeros_like(keys)
        for b, i in enumerate(decode_rows):
            n = lengths[b]
            keys[b, :, :n] = rows[i].state.keys[layer][:, :n]
            values[b, :, :n] = rows[i].state.values[layer][:, :n]
        token_index = starts[decode_rows]
        qd = q[token_index].reshape(batch, c.num_kv_heads, group, c.head_dim)
        scores = np.matmul(qd, keys.transpose(0, 1, 3, 2)) * self._scale  # [B, kv, group, L]
        pad = np.arange(max_len)[None, :] >= lengths[:, None]
        scores[np.broadcast_to(pad[:, None, None, :], scores.shape)] = -np.inf
        probs = _softmax_inplace(scores)
        out[token_index] = np.matmul(probs, values).reshape(batch, c.q_size)

    def _attend_verify(
        self,
        out: FloatArray,
        q: FloatArray,
        rows: Sequence[StepRow],
        starts: NDArray[Any],
        counts: Sequence[int],
        verify_rows: list[int],
        layer: int,
    ) -> None:
        """Rows verifying a draft (a few new tokens each) in one padded, causally masked batched attention."""
        if not verify_rows:
            return
        c = self.config
        group = c.num_heads // c.num_kv_heads
        batch, width = len(verify_rows), max(counts[i] for i in verify_rows)
        past = np.array([rows[i].state.length for i in verify_rows])
        new = np.array([counts[i] for i in verify_rows])
        max_len = int((past + new).max())
        keys = np.zeros((batch, c.num_kv_heads, max_len, c.head_dim), np.float32)
        values = np.zeros_like(keys)
        queries = np.zeros((batch, width, c.num_heads, c.head_dim), np.float32)
        for b, i in enumerate(verify_rows):
            total = past[b] + new[b]
            keys[b, :, :total] = rows[i].state.keys[layer][:, :total]
            values[b, :, :total] = rows[i].state.values[layer][:, :total]
            queries[b, : new[b]] = q[starts[i] : starts[i] + new[b]].reshape(new[b], c.num_heads, c.head_dim)
        qr = queries.reshape(batch, width, c.num_kv_heads, group, c.head_dim).transpose(0, 2, 3, 1, 4)
        scores = np.matmul(qr, keys[:, :, None].transpose(0, 1, 2, 4, 3)) * self._scale  # [B, kv, group, w, L]
        allowed = np.arange(max_len)[None, None, :] <= (past[:, None, None] + np.arange(width)[None, :, None])
        scores[~np.broadcast_to(allowed[:, None, None], scores.shape)] = -np.inf
        probs = _softmax_inplace(scores)
        attended = np.matmul(probs, values[:, :, None]).transpose(0, 3, 1, 2, 4).reshape(batch, width, c.q_size)
        for b, i in enumerate(verify_rows):
            out[starts[i] : starts[i] + new[b]] = attended[b, : new[b]]

    def _attend_prefill(self, out: FloatArray, q: FloatArray, row: StepRow, start: int, n: int, layer: int) -> None:
        """Causal attention of a row's n new tokens against its cache (earlier tokens + themselves)."""
        c = self.config
        group = c.num_heads // c.num_kv_heads
        past = row.state.length
        total = past + n
        keys = row.state.keys[layer][:, :total]  # [kv, L, d]
        values = row.state.values[layer][:, :total]
        qr = q[start : start + n].reshape(n, c.num_kv_heads, group, c.head_dim).transpose(1, 2, 0, 3)
        scores = np.matmul(qr, keys[:, None].transpose(0, 1, 3, 2)) * self._scale  # [kv, group, n, L]
        future = np.arange(total)[None, :] > (past + np.arange(n))[:, None]
        scores[:, :, future] = -np.inf
        probs = _softmax_inplace(scores)
        attended = np.matmul(probs, values[:, None])  # [kv, group, n, d]
        out[start : start + n] = attended.transpose(2, 0, 1, 3).reshape(n, c.q_size)


def greedy_generate(
    model: TinyLlama,
    prompt_ids: Sequence[int],
    max_new_tokens: int,
    adapter: AdapterWeights | None = None,
    *,
    eos_id: int | None = None,
) -> list[int]:
    """Greedy decoding of one sequence; returns the new ids, stopping before ``eos_id`` (default: the
    tokenizer's EOS) or after ``max_new_tokens``."""
    stop = EOS_ID if eos_id is None else eos_id
    state = model.new_sequence()
    logits = model.step([StepRow(state, np.asarray(prompt_ids, np.int32), adapter)])
    generated: list[int] = []
    while len(generated) < max_new_tokens:
        token = int(np.argmax(logits[0]))
        if token == stop:
            break
        generated.append(token)
        if len(generated) == max_new_tokens:
            break
        logits = model.step([StepRow(state, np.asarray([token], np.int32), adapter)])
    return generated
