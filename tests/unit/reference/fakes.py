"""Test doubles for the reference engine's unit tests: a model implementing the real ``step`` protocol.

``FakeModel`` predicts ``(last token + 1 + adapter.shift) % period`` (``period`` defaults to ``VOCAB``) for every
row, so outputs are easy to reason about, and it records the rows of every step, so tests can see how batches
were formed; ``step_rows`` predicts the same for every token of a row that asks for all its logits (drafts).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from google.protobuf import json_format, text_format
from numpy.typing import NDArray
from tritonclient.grpc import model_config_pb2
from trtfleet_engines.reference.adapters import AdapterStore, LoraCacheSettings
from trtfleet_engines.reference.numpy_llama import StepRow
from trtfleet_engines.reference.scheduler import BatchLimits, GenerationRequest, InflightBatcher, LoraInputs

from trtfleet.api.basemodel import LoraModule, ModelDimensions

VOCAB = 300

DIMS = ModelDimensions(
    hidden_size=8, intermediate_size=16, num_layers=2, num_attention_heads=2, num_kv_heads=1, vocab_size=VOCAB
)
"""q: 8 -> 8, v: 8 -> 4. Rank 4, sizes 4: page_width 12, 24 slots a page, a rank-4 adapter = 1 page."""
TARGETS = (LoraModule.ATTN_Q, LoraModule.ATTN_V)
PAGE_BYTES = 24 * 12 * 2


@dataclass(frozen=True)
class FakeAdapter:
    shift: int


@dataclass
class FakeState:
    length: int = 0


@dataclass
class FakeModel:
    steps: list[list[tuple[int, int, Any]]] = field(default_factory=list)
    period: int = VOCAB

    def new_sequence(self) -> FakeState:
        return FakeState()

    def _next(self, token: int, adapter: Any) -> int:
        return (token + 1 + (0 if adapter is None else adapter.shift)) % self.period

    def step(self, rows: Sequence[StepRow]) -> NDArray[np.float32]:
        return np.stack([row_logits[-1] for row_logits in self.step_rows(rows)]) if rows else np.zeros((0, VOCAB))

    def step_rows(self, rows: Sequence[StepRow]) -> list[NDArray[np.float32]]:
        self.steps.append([(id(r.state), int(np.asarray(r.tokens).size), r.adapter) for r in rows])
        out = []
        for row in rows:
            tokens = [int(t) for t in np.asarray(row.tokens).reshape(-1)]
            picked = tokens if row.all_logits else tokens[-1:]
            logits = np.zeros((len(picked), VOCAB), np.float32)
            for i, token in enumerate(picked):
                logits[i, self._next(token, row.adapter)] = 1.0
            row.state.length += len(tokens)
            out.append(logits)
        return out


@dataclass
class CountingParser:
    calls: list[int] = field(default_factory=list)

    def __call__(self, weights: NDArray[Any], config: NDArray[Any]) -> FakeAdapter:
        shift = int(round(float(weights.reshape(-1)[0])))
        self.calls.append(shift)
        return FakeAdapter(shift)


def lora_settings(host_pages: int, device_pages: int, **overrides: Any) -> LoraCacheSettings:
    values: dict[str, Any] = dict(
        target_modules=TARGETS,
        max_lora_rank=4,
        optimal_adapter_size=4,
        max_adapter_size=4,
        host_bytes=host_pages * PAGE_BYTES,
        device_bytes=device_pages * PAGE_BYTES,
    )
    values.update(overrides)
    return LoraCacheSettings(**values)


def adapter_store(host_pages: int = 3, device_pages: int = 3) -> tuple[AdapterStore, CountingParser]:
    parser = CountingParser()
    return AdapterStore(DIMS, lora_settings(host_pages, device_pages), parser), parser


def lora(
    task_id: int | None,
    shift: int = 0,
    *,
    weights: bool = True,
    rank: int = 4,
    modules: tuple[int, ...] = (1, 3),
    dtype: Any = np.float16,
) -> LoraInputs:
    """LoRA tensors as Triton hands them over: weights [1, N, W], config int32 [1, N, 3]."""
    if not weights:
        return LoraInputs(task_id)
    rows = [[m, layer, rank] for layer in range(DIMS.num_layers) for m in modules]
    config = np.array([rows], np.int32)
    w = np.zeros((1, len(rows), rank * 16), dtype)
    w[0, 0, 0] = shift
    return LoraInputs(task_id, w, config)


def limits(**overrides: int) -> BatchLimits:
    values = dict(max_batch_size=4, max_num_tokens=64, max_input_len=32, max_seq_len=64, max_queue_size=0)
    values.update(overrides)
    return BatchLimits(**values)


def request(prompt: Sequence[int], max_new_tokens: int = 4, **fields: Any) -> GenerationRequest:
    return GenerationRequest(prompt=tuple(prompt), max_new_tokens=max_new_tokens, **fields)


def run_until_idle(batcher: InflightBatcher[str], max_steps: int = 200) -> list[Any]:
    """Step until nothing is queued or active; returns every response in order."""
    out: list[Any] = []
    for _ in range(max_steps):
        if not batcher.has_work():
            return out
        out += batcher.step()
    raise AssertionError(f"batcher still busy after {max_steps} steps")


def triton_model_config(config_path: Path) -> dict[str, Any]:
    """A ``config.pbtxt`` as Triton hands it to a Python model's ``initialize`` (JSON form of ModelConfig)."""
    message = text_format.Parse(config_path.read_text(), model_config_pb2.ModelConfig())
    return json_format.MessageToDict(message, preserving_proto_field_name=True)
