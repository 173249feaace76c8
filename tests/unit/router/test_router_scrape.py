"""Triton metrics -> load signals."""

from __future__ import annotations

import pytest
from trtfleet_router.upstream.scrape import parse_triton_metrics, restarted

TEXT = """# HELP nv_trt_llm_request_metrics TRT LLM request metrics
# TYPE nv_trt_llm_request_metrics gauge
nv_trt_llm_request_metrics{model="tensorrt_llm",request_type="waiting",version="1"} 3
nv_trt_llm_request_metrics{model="tensorrt_llm",request_type="active",version="1"} 5
nv_trt_llm_request_metrics{model="tensorrt_llm",request_type="max",version="1"} 64
nv_trt_llm_kv_cache_block_metrics{kv_cache_block_type="fraction",model="tensorrt_llm",version="1"} 0.25
nv_trt_llm_kv_cache_block_metrics{kv_cache_block_type="used",model="tensorrt_llm",version="1"} 10
nv_inference_request_success{model="ensemble",version="1"} 12
"""


def test_parse() -> None:
    load = parse_triton_metrics(TEXT)
    assert (load.active, load.waiting, load.kv_fraction) == (5, 3, 0.25)


def test_parse_without_trtllm_metrics() -> None:
    load = parse_triton_metrics('nv_inference_request_success{model="x"} 1\n')
    assert (load.active, load.waiting, load.kv_fraction) == (None, None, None)


def test_parse_sums_the_request_counters() -> None:
    text = TEXT + 'nv_inference_request_failure{model="ensemble",version="1"} 2\n'
    assert parse_triton_metrics(text).requests_total == 14
    assert parse_triton_metrics('nv_trt_llm_request_metrics{request_type="active"} 1\n').requests_total is None


@pytest.mark.parametrize(
    ("previous", "now", "expected"),
    [
        pytest.param(None, 5, False, id="first scrape"),
        pytest.param(5, None, False, id="counters gone from the page"),
        pytest.param(5, 5, False, id="idle"),
        pytest.param(5, 9, False, id="more requests"),
        pytest.param(9, 2, True, id="went back: Triton restarted"),
    ],
)
def test_a_restart_shows_as_counters_going_back(previous: int | None, now: int | None, expected: bool) -> None:
    assert restarted(previous, now) is expected
