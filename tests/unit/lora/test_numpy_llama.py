"""The numpy Llama against the real transformers model's committed outputs; in-flight batching invariants."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from trtfleet_engines.reference.numpy_llama import (
    AdapterWeights,
    LlamaConfig,
    LoraLayerWeights,
    StepRow,
    TinyLlama,
    greedy_generate,
)
from trtfleet_engines.reference.tokenizer import (
    BOS_ID,
    EOS_ID,
    PAD_ID,
    SEP_ID,
    VOCAB_SIZE,
    ByteTokenizer,
    prompt_ids,
)

# Base weights are float32 in both implementations: only summation order differs.
FP32_LOGITS_ATOL = 1e-4

# Two float32 computations of the same logits that differ only in summation order (batch shape, BLAS kernel,
# thread count) agree to a few units in the last place of the largest logit: 1.24e-5 (about 6.5 ulps at
# |logit| 18.7) was seen with 2 OpenBLAS threads on Haswell kernels. 64 ulps of the largest magnitude bounds that
# on any kernel; a real fault (a row paired with the wrong adapter or KV state) moves logits by 1e-2 or more.
FP32_REORDER_ULPS = 64


def assert_float32_equal(got: np.ndarray[Any, Any], want: np.ndarray[Any, Any]) -> None:
    """``got`` equals ``want`` up to float32 summation-order noise (see :data:`FP32_REORDER_ULPS`)."""
    scale = np.float32(max(float(np.max(np.abs(want))), 1.0))
    atol = FP32_REORDER_ULPS * float(np.spacing(scale))
    np.testing.assert_allclose(got, want, atol=atol, rtol=0)


def prefill_logits(model: TinyLlama, prompt: str, adapter: AdapterWeights | None = None) -> np.ndarray[Any, Any]:
    logits: np.ndarray[Any, Any] = model.step(
        [StepRow(model.new_sequence(), np.asarray(prompt_ids(prompt), np.int32), adapter)]
    )[0]
    return logits


def random_adapter(config: LlamaConfig, seed: int, rank: int = 4, scale: float = 0.3) -> AdapterWeights:
    rng = np.random.default_rng(seed)
    modules = {}
    for layer in range(config.num_layers):
        for module_id in (1, 2, 3, 4, 5, 6, 7):
            in_dim, out_dim = config.module_dims(module_id)
            a = rng.normal(0, scale, (rank, in_dim)).astype(np.float32)
            b = rng.normal(0, scale, (out_dim, rank)).astype(np.float32)
            modules[(layer, module_id)] = LoraLayerWeights(a, b)
    return AdapterWeights(config, modules)


def test_tokenizer_round_trip_and_prompt_format() -> None:
    tok = ByteTokenizer()
    assert (PAD_ID, BOS_ID, EOS_ID, SEP_ID, VOCAB_SIZE) == (256, 257, 258, 259, 260)
    assert tok.encode("hé") == [104, 0xC3, 0xA9]
    assert tok.decode([BOS_ID, 104, 0xC3, 0xA9, EOS_ID, PAD_ID]) == "hé"
    assert tok.decode([104, 0xC3]) == "h\ufffd"
    assert prompt_ids("ab") == [BOS_ID, 97, 98, SEP_ID] == tok.prompt_ids("ab")


def test_config_matches_tiny_llama_dimensions(tiny: TinyLlama) -> None:
    from trtfleet_engines.modeldims import TINY_LLAMA_DIMENSIONS as dims

    c = tiny.config
    assert (c.hidden_size, c.intermediate_size, c.num_layers, c.num_heads, c.num_kv_heads, c.head_dim) == (
        dims.hidden_size,
        dims.intermediate_size,
        dims.num_layers,
        dims.num_attention_heads,
        dims.num_kv_heads,
        dims.head_size,
    )
    assert c.vocab_size == dims.vocab_size == VOCAB_SIZE


def test_base_logits_match_transformers(tiny: TinyLlama, expected_outputs: dict[str, Any]) -> None:
    for prompt, want in zip(
        expected_outputs["logit_prompts"], expected_outputs["models"]["base"]["logits"], strict=True
    ):
        got = prefill_logits(tiny, prompt)
        np.testing.assert_allclose(got, np.asarray(want, np.float32), atol=FP32_LOGITS_ATOL, rtol=0)


def test_base_greedy_outputs_match_transformers(tiny: TinyLlama, expected_outputs: dict[str, Any]) -> None:
    base = expected_outputs["models"]["base"]
    for prompt, want_ids, want_text in zip(
        expected_outputs["prompts"], base["output_ids"], base["outputs"], strict=True
    ):
        got = greedy_generate(tiny, prompt_ids(prompt), expected_outputs["max_new_tokens"])
        assert got == want_ids
        assert ByteTokenizer().decode(got) == want_text == prompt  # the base model echoes


def test_mixed_batch_equals_sequences_run_alone(tiny: TinyLlama) -> None:
    """Prefill and decode rows with different adapters in one step give each row's solo result."""
    adapter_a, adapter_b = random_adapter(tiny.config, 1), random_adapter(tiny.config, 2, rank=8)
    prompts = ["hello world", "abc", "kubernetes operator", "x"]
    adapters = [adapter_a, None, adapter_b, adapter_a]  # adapter_a on rows 0 and 3: non-contiguous segment

    solo = []
    for prompt, adapter in zip(prompts, adapters, strict=True):
        state = tiny.new_sequence()
        first = tiny.step([StepRow(state, np.asarray(prompt_ids(prompt), np.int32), adapter)])[0]
        second = tiny.step([StepRow(state, np.asarray([int(first.argmax())], np.int32), adapter)])[0]
        solo.append((first, second))

    states = [tiny.new_sequence() for _ in prompts]
    # Step 1: rows 0 and 1 prefill. Step 2: rows 0, 1 decode while rows 2, 3 prefill. Step 3: 2, 3 decode.
    first01 = tiny.step([StepRow(states[i], np.asarray(prompt_ids(prompts[i]), np.int32), adapters[i]) for i in (0, 1)])
    mixed = tiny.step(
        [
            StepRow(states[0], np.asarray([int(first01[0].argmax())], np.int32), adapters[0]),
            StepRow(states[2], np.asarray(prompt_ids(prompts[2]), np.int32), adapters[2]),
            StepRow(states[1], np.asarray([int(first01[1].argmax())], np.int32), adapters[1]),
            StepRow(states[3], np.asarray(prompt_ids(prompts[3]), np.int32), adapters[3]),
        ]
    )
    last23 = tiny.step(
        [StepRow(states[i], np.asarray([int(mixed[j].argmax())], np.int32), adapters[i]) for i, j in ((2, 1), (3, 3))]
    )
    assert_float32_equal(first01[0], solo[0][0])
    assert_float32_equal(first01[1], solo[1][0])
    assert_float32_equal(mixed[0], solo[0][1])
    assert_float32_equal(mixed[1], solo[2][0])
    assert_float32_equal(mixed[2], solo[1][1])
    assert_float32_equal(mixed[3], solo[3][0])
    assert_float32_equal(last23[0], solo[2][1])
    assert_float32_equal(last23[1], solo[3][1])
    assert [s.position for s in states] == [len(prompt_ids(p)) + 1 for p in prompts]
    assert not np.allclose(solo[0][0], prefill_logits(tiny, prompts[0]))  # the adapter changed something


def test_chunked_prefill_equals_whole_prefill(tiny: TinyLlama) -> None:
    ids = np.asarray(prompt_ids("the quick brown fox jumps"), np.int32)
    whole = tiny.step([StepRow(tiny.new_sequence(), ids)])[0]
    state = tiny.new_sequence()
    tiny.step([StepRow(state, ids[:10])])
    chunked = tiny.step([StepRow(state, ids[10:])])[0]
    assert_float32_equal(chunked, whole)


def test_kv_cache_grows_past_its_initial_capacity(tiny: TinyLlama) -> None:
    state = tiny.new_sequence()
    initial = state.keys[0].shape[1]
    ids = np.asarray(prompt_ids("a" * (initial + 20)), np.int32)
    logits = tiny.step([StepRow(state, ids)])[0]
    assert state.position == ids.size > initial
    assert_float32_equal(logits, tiny.step([StepRow(tiny.new_sequence(), ids)])[0])


def test_step_rejects_bad_rows(tiny: TinyLlama) -> None:
    state = tiny.new_sequence()
    with pytest.raises(ValueError, match="at least one new token"):
        tiny.step([StepRow(state, np.asarray([], np.int32))])
    with pytest.raises(ValueError, match="only once per step"):
        tiny.step([StepRow(state, np.asarray([1], np.int32)), StepRow(state, np.asarray([2], np.int32))])
    with pytest.raises(ValueError, match="token id out of range"):
        tiny.step([StepRow(state, np.asarray([VOCAB_SIZE], np.int32))])
    with pytest.raises(ValueError, match="max_position_embeddings"):
        tiny.step([StepRow(state, np.zeros(tiny.config.max_position_embeddings + 1, np.int32))])
    assert state.position == 0
    assert tiny.step([]).shape == (0, VOCAB_SIZE)


def test_from_trtllm_parses_rows_and_rejects_bad_tensors(tiny: TinyLlama) -> None:
    config = tiny.config
    rng = np.random.default_rng(0)
    rank = 2
    in_dim, out_dim = config.module_dims(1)
    a = rng.normal(size=(rank, in_dim)).astype(np.float16)
    b = rng.normal(size=(out_dim, rank)).astype(np.float16)
    row = np.concatenate([a.reshape(-1), b.reshape(-1), np.zeros(5, np.float16)])
    weights, rows = row[None, None, :], np.asarray([[[1, 1, rank]]], np.int32)
    parsed = AdapterWeights.from_trtllm(weights, rows, config)
    np.testing.assert_array_equal(parsed.modules[(1, 1)].a, a.astype(np.float32))
    np.testing.assert_array_equal(parsed.modules[(1, 1)].b, b.astype(np.float32))
    assert parsed.max_rank == rank

    with pytest.raises(ValueError, match="lora_weights has to few values for attn_q"):
        AdapterWeights.from_trtllm(row[None, : rank * in_dim + 3], rows, config)
    with pytest.raises(ValueError, match=r"\[N, 3\]"):
        AdapterWeights.from_trtllm(weights, np.asarray([[1, 1, rank, 0]], np.int32), config)
    with pytest.raises(ValueError, match="not supported"):
        AdapterWeights.from_trtllm(weights, np.asarray([[13, 0, rank]], np.int32), config)
    with pytest.raises(ValueError, match="out of range"):
        AdapterWeights.from_trtllm(weights, np.asarray([[1, config.num_layers, rank]], np.int32), config)
    with pytest.raises(ValueError, match="mMaxLoraRank"):
        AdapterWeights.from_trtllm(weights, rows, config, max_rank=1)
    with pytest.raises(ValueError, match="rows"):
        AdapterWeights.from_trtllm(np.concatenate([weights[0], weights[0]]), rows, config)


def test_fused_modules_equal_their_parts(tiny: TinyLlama) -> None:
    """attn_qkv (0) = q|k|v stacked; mlp_gate_up (18) holds B as [up; gate] (TRT-LLM order)."""
    config = tiny.config
    parts = random_adapter(config, 5, rank=3)
    fused_modules = {}
    for layer in range(config.num_layers):
        q, k, v = (parts.modules[(layer, m)] for m in (1, 2, 3))
        gate, up = parts.modules[(layer, 5)], parts.modules[(layer, 7)]
        fused_modules[(layer, 0)] = LoraLayerWeights(np.concatenate([q.a, k.a, v.a]), _block_diag([q.b, k.b, v.b]))
        fused_modules[(layer, 18)] = LoraLayerWeights(np.concatenate([up.a, gate.a]), _block_diag([up.b, gate.b]))
        for module_id in (4, 6):
            fused_modules[(layer, module_id)] = parts.modules[(layer, module_id)]
    fused = AdapterWeights(config, fused_modules)
    assert_float32_equal(prefill_logits(tiny, "fused", fused), prefill_logits(tiny, "fused", parts))


def _block_diag(blocks: list[np.ndarray[Any, Any]]) -> np.ndarray[Any, Any]:
    out = np.zeros((sum(b.shape[0] for b in blocks), sum(b.shape[1] for b in blocks)), np.float32)
    row = col = 0
    for block in blocks:
        out[row : row + block.shape[0], col : col + block.shape[1]] = block
        row, col = row + block.shape[0], col + block.shape[1]
    return out
