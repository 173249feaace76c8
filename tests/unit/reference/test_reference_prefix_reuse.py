"""Block reuse really skips prefill and changes nothing: the tiny Llama from cached K/V equals a full prefill.

Float32 throughout; equality is to summation-order noise (``FP32_REORDER_ULPS`` in
``tests/unit/lora/test_numpy_llama.py``: a full prefill and a shorter one run their matrix products in
different shapes). A row on the wrong K/V moves logits by far more (see the last assertion).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from trtfleet_engines.reference.kv_blocks import BlockPool, KvCacheSettings
from trtfleet_engines.reference.numpy_llama import TINY_LLAMA_DIR, AdapterWeights, LlamaWeights, StepRow, TinyLlama
from trtfleet_engines.reference.scheduler import BatchLimits, GenerationRequest, InflightBatcher

from tests.unit.lora.test_numpy_llama import assert_float32_equal, random_adapter

TPB = 8
PROMPT = [257, *range(60, 100), 259]  # 42 tokens: 5 full blocks of 8 and 2 more tokens
DECODE_STEPS = 6


@pytest.fixture(scope="module")
def tiny() -> TinyLlama:
    return TinyLlama(LlamaWeights.load(TINY_LLAMA_DIR))


def run(model: TinyLlama, state: Any, first: list[int], adapter: AdapterWeights | None) -> list[np.ndarray[Any, Any]]:
    """Logits of the prefill of ``first`` and of ``DECODE_STEPS`` greedy steps after it."""
    logits = [model.step([StepRow(state, np.asarray(first, np.int32), adapter)])[0]]
    for _ in range(DECODE_STEPS):
        token = int(np.argmax(logits[-1]))
        logits.append(model.step([StepRow(state, np.asarray([token], np.int32), adapter)])[0])
    return logits


@pytest.mark.parametrize("with_adapter", [pytest.param(False, id="base"), pytest.param(True, id="adapter")])
def test_prefill_from_cached_blocks_equals_a_full_prefill(tiny: TinyLlama, with_adapter: bool) -> None:
    adapter = random_adapter(tiny.config, seed=5) if with_adapter else None
    donor = tiny.new_sequence()
    tiny.step([StepRow(donor, np.asarray(PROMPT, np.int32), adapter)])
    blocks = [tiny.export_kv(donor, start, start + TPB) for start in range(0, 40, TPB)]

    full = run(tiny, tiny.new_sequence(), PROMPT, adapter)
    resumed_state = tiny.sequence_from(blocks)
    assert resumed_state.length == 40
    resumed = run(tiny, resumed_state, PROMPT[40:], adapter)  # 2 positions computed instead of 42
    for got, want in zip(resumed, full, strict=True):
        assert_float32_equal(got, want)
    other = random_adapter(tiny.config, seed=6)
    wrong = run(tiny, tiny.sequence_from(blocks), PROMPT[40:], other if with_adapter else random_adapter(
        tiny.config, seed=7))
    assert float(np.max(np.abs(wrong[0] - full[0]))) > 1e-2  # K/V of another adapter would show


def generate_twice(tiny: TinyLlama, pool: BlockPool | None) -> tuple[list[tuple[int, ...]], InflightBatcher[str]]:
    limits = BatchLimits(max_batch_size=4, max_num_tokens=512, max_input_len=200, max_seq_len=256)
    batcher: InflightBatcher[str] = InflightBatcher(tiny, limits, None, pool)
    second = [*PROMPT, *range(100, 120), 259]  # a second turn: the first prompt and more
    outputs: list[tuple[int, ...]] = []
    for prompt in (PROMPT, second):
        batcher.submit(GenerationRequest(tuple(prompt), max_new_tokens=8, exclude_input_in_output=True), "h")
        while batcher.has_work():
            outputs += [r.output_ids for r in batcher.step() if r.final]
    return outputs, batcher


def test_the_batcher_skips_reused_positions_and_answers_the_same(tiny: TinyLlama) -> None:
    without, plain = generate_twice(tiny, None)
    pool = BlockPool(KvCacheSettings(max_blocks=128, tokens_per_block=TPB))
    with_reuse, reusing = generate_twice(tiny, pool)
    assert with_reuse == without and all(len(out) == 8 for out in without)
    second_len = len(PROMPT) + 21
    assert plain.stats().prefill_tokens_computed == len(PROMPT) + second_len
    stats = reusing.stats()
    assert stats.prompt_tokens == len(PROMPT) + second_len
    assert stats.prefill_tokens_computed == len(PROMPT) + second_len - 40  # the 5 cached blocks were not computed
    assert (stats.kv_reused_blocks, stats.kv_missed_blocks) == (5, 6 + 3)
    assert stats.kv_used_blocks == 0 and stats.kv_max_blocks == 128 and stats.kv_tokens_per_block == TPB
