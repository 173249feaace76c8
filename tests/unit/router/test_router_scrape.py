"""Triton metrics -> load signals."""

from __future__ import annotations

from trtfleet_router.upstream.scrape import parse_triton_metrics

TEXT = """# HELP nv_trt_llm_request_metrics TRT LLM request metrics
# TYPE nv_trt_llm_request_metrics gauge
nv_trt_llm_request_metrics{model="tensorrt_llm",request_type="waiting",version="1"} 3
nv_trt_llm_request_metrics{model="tensorrt_llm",request_type="active",version="1"} 5
nv_trt_llm_request_metrics{model="tensorrt_llm",request_type="max",version="1"} 64
nv_trt_llm_kv_cache_block_metrics{kv_cache_block_type="fraction",model="tensorrt_llm",version="1"} 0.25
nv_trt_llm_kv_cache_block_metrics{kv_cache_block_type="used",model="tensorrt_llm",version="1"} 10
nv_trt_llm_kv_cache_block_metrics{kv_cache_block_type="reused",model="tensorrt_llm",version="1"} 42
nv_inference_request_success{model="ensemble",version="1"} 12
"""


def test_parse() -> None:
    load = parse_triton_metrics(TEXT)
    assert (load.active, load.waiting, load.kv_fraction, load.reused_blocks) == (5, 3, 0.25, 42)


def test_parse_without_trtllm_metrics() -> None:
    load = parse_triton_metrics('nv_inference_request_success{model="x"} 1\n')
    assert (load.active, load.waiting, load.kv_fraction, load.reused_blocks) == (None, None, None, None)
