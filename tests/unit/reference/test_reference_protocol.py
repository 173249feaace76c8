"""TRT-LLM tensors <-> requests, sampling, text helpers and metric names of the reference engine."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from numpy.typing import NDArray
from trtfleet_engines.reference.errors import EnqueueRejected
from trtfleet_engines.reference.metrics import FAMILIES, metric_values
from trtfleet_engines.reference.protocol import (
    is_stop_request,
    output_tensors,
    parse_request,
    parse_stop_words,
)
from trtfleet_engines.reference.sampling import SamplingParams, sample_token
from trtfleet_engines.reference.scheduler import BatcherStats
from trtfleet_engines.reference.text import IncrementalDecoder, stack_word_lists, word_list


def _getter(tensors: dict[str, NDArray[Any]]) -> Any:
    return tensors.get


def test_parse_request_reads_the_real_tensor_layout() -> None:
    weights = np.zeros((1, 4, 16), np.float16)
    config = np.zeros((1, 4, 3), np.int32)
    tensors = {
        "input_ids": np.array([[257, 104, 105, 259, 0, 0]], np.int32),  # padded by the batcher
        "input_lengths": np.array([[4]], np.int32),
        "request_output_len": np.array([[7]], np.int32),
        "end_id": np.array([[258]], np.int32),
        "streaming": np.array([[True]]),
        "temperature": np.array([[0.5]], np.float32),
        "runtime_top_k": np.array([[3]], np.int32),
        "seed": np.array([[42]], np.uint64),
        "lora_task_id": np.array([[17]], np.uint64),
        "lora_weights": weights,
        "lora_config": config,
    }
    parsed = parse_request(_getter(tensors), user_id="abc", exclude_input_default=True)
    assert parsed.prompt == (257, 104, 105, 259)
    assert (parsed.max_new_tokens, parsed.end_id, parsed.pad_id, parsed.streaming) == (7, 258, None, True)
    assert parsed.sampling == SamplingParams(temperature=0.5, top_k=3, top_p=0.0, seed=42)
    assert parsed.exclude_input_in_output and parsed.user_id == "abc"
    assert parsed.lora is not None and parsed.lora.task_id == 17 and parsed.lora.weights is weights


def test_parse_request_refuses_what_the_backend_refuses() -> None:
    with pytest.raises(EnqueueRejected, match="request_output_len"):
        parse_request(_getter({"input_ids": np.array([[1]], np.int32)}), user_id="", exclude_input_default=False)
    batch = {
        "input_ids": np.array([[1], [2]], np.int32),
        "request_output_len": np.array([[1], [1]], np.int32),
    }
    with pytest.raises(EnqueueRejected, match="batch size 1"):
        parse_request(_getter(batch), user_id="", exclude_input_default=False)


def test_stop_request_and_stop_words() -> None:
    assert is_stop_request(_getter({"stop": np.array([[True]])}))
    assert not is_stop_request(_getter({}))
    table = np.array([[[10, 11, 12, 0], [2, 3, -1, -1]]], np.int32)  # words [10, 11] and [12]
    assert parse_stop_words(table) == ((10, 11), (12,))
    assert parse_stop_words(word_list(["ab", "c"])[None]) == ((97, 98), (99,))
    assert word_list([]).tolist() == [[0], [-1]]
    assert stack_word_lists([word_list(["ab"]), word_list([])]).shape == (2, 2, 2)


def test_output_tensors_have_the_backend_shapes() -> None:
    tensors = output_tensors(
        (5, 6, 7), ["output_ids", "sequence_length", "cum_log_probs", "num_input_tokens"], num_input_tokens=4
    )
    assert tensors["output_ids"].shape == (1, 1, 3) and tensors["output_ids"].dtype == np.int32
    assert tensors["sequence_length"].tolist() == [[3]]
    assert tensors["num_input_tokens"].tolist() == [[4]]
    assert tensors["cum_log_probs"].shape == (1, 1)
    empty = output_tensors((), ["output_ids"])
    assert empty["output_ids"].shape == (1, 1, 0) and empty["sequence_length"].tolist() == [[0]]


@pytest.mark.parametrize(
    ("params", "greedy"),
    [
        (SamplingParams(), True),  # neither top_k nor top_p: TRT-LLM's greedy default
        (SamplingParams(temperature=0.0, top_k=50), True),
        (SamplingParams(top_k=1, top_p=0.9), True),
        (SamplingParams(top_k=50), False),
        (SamplingParams(top_p=0.9), False),
    ],
)
def test_greedy_rules(params: SamplingParams, greedy: bool) -> None:
    assert params.greedy is greedy


def test_seeded_sampling_is_reproducible_and_respects_top_k() -> None:
    logits = np.array([0.0, 5.0, 4.9, 4.8, -10.0])
    params = SamplingParams(temperature=1.0, top_k=2, seed=3)
    first = [sample_token(logits, params, params.new_generator()) for _ in range(3)]
    rng = params.new_generator()
    draws = [sample_token(logits, params, rng) for _ in range(200)]
    assert len(set(first)) == 1
    assert set(draws) == {1, 2}
    assert sample_token(logits, SamplingParams(), np.random.default_rng()) == 1


def test_incremental_decoder_keeps_multibyte_characters_whole() -> None:
    data = list("é!".encode())
    decoder = IncrementalDecoder()
    assert [decoder.feed([data[0]]), decoder.feed([data[1]]), decoder.feed([data[2], 258])] == ["", "é", "!"]


def test_metric_names_and_labels_match_the_trtllm_backend() -> None:
    stats = BatcherStats(
        active_requests=3,
        max_active_requests=8,
        scheduled_requests=2,
        context_requests=1,
        generation_requests=1,
        waiting_requests=4,
        paused_requests=0,
        context_tokens=12,
        iterations=9,
        kv_max_blocks=10,
        kv_used_blocks=4,
    )
    values = metric_values(stats, now_us=1)
    assert {k for k in values if k[0] == "nv_trt_llm_request_metrics"} == {
        ("nv_trt_llm_request_metrics", t) for t in ("active", "max", "scheduled", "context", "waiting")
    }
    assert {k[1] for k in values if k[0] == "nv_trt_llm_kv_cache_block_metrics"} == {
        "max",
        "free",
        "used",
        "tokens_per",
        "reused",
        "fraction",
    }
    assert values[("nv_trt_llm_request_metrics", "waiting")] == 4
    assert values[("nv_trt_llm_kv_cache_block_metrics", "fraction")] == pytest.approx(0.4)
    assert FAMILIES["nv_trt_llm_inflight_batcher_metrics"][0] == "inflight_batcher_specific_metric"
