"""Triton metrics and trtllm-serve JSON stats -> load signals."""

from __future__ import annotations

import json

import pytest
from trtfleet_router.upstream.scrape import ScrapedLoad, parse_pod_metrics, parse_triton_metrics, restarted

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


def _stats(active: int, queued: int, used: int, reused: int, missed: int) -> dict[str, object]:
    return {"iter": 3, "numActiveRequests": active, "numQueuedRequests": queued,
            "kvCacheStats": {"maxNumBlocks": 100, "usedNumBlocks": used, "tokensPerBlock": 32,
                             "reusedBlocks": reused, "missedBlocks": missed, "cacheHitRate": 0.5}}


@pytest.mark.parametrize(("body", "expected"), [
    pytest.param(json.dumps([_stats(1, 0, 10, 1, 1), _stats(4, 2, 25, 7, 9)]).encode(),
                 ScrapedLoad(4, 2, 0.25, 7, 9, kv_max_blocks=100, kv_tokens_per_block=32, iterations=3),
                 id="newest-iteration-wins"),
    pytest.param(b"[]", ScrapedLoad(0, 0, None, idle=True), id="no-iteration-since-last-scrape: idle"),
    pytest.param(b"[1]", ScrapedLoad(None, None, None), id="not-iteration-stats"),
    pytest.param(b"{}", ScrapedLoad(None, None, None), id="not-a-list"),
    pytest.param(b"[{]", ScrapedLoad(None, None, None), id="malformed-json"),
    pytest.param(TEXT.encode(), ScrapedLoad(5, 3, 0.25, 42, requests_total=12), id="triton-text"),
])
def test_parse_pod_metrics(body: bytes, expected: ScrapedLoad) -> None:
    assert parse_pod_metrics(body) == expected


SIZE = """nv_trt_llm_kv_cache_block_metrics{kv_cache_block_type="max",model="tensorrt_llm",version="1"} 288
nv_trt_llm_kv_cache_block_metrics{kv_cache_block_type="tokens_per",model="tensorrt_llm",version="1"} 64
"""


@pytest.mark.parametrize(("text", "router_block_tokens", "expected"), [
    pytest.param(TEXT + SIZE, 64, 288, id="same block size"),
    pytest.param(TEXT + SIZE, 32, 576, id="the engine's blocks twice the router's"),
    pytest.param(TEXT + SIZE.splitlines()[0] + "\n", 32, 288, id="no block size: the router's"),
    pytest.param(TEXT, 32, None, id="not exported"),
])
def test_the_engine_reports_its_kv_cache_size(text: str, router_block_tokens: int, expected: int | None) -> None:
    """Triton's ``max`` x ``tokens_per`` in the router's blocks: what sizes the pod in the prefix index."""
    assert parse_triton_metrics(text).kv_capacity_blocks(router_block_tokens) == expected


def test_trtllm_serve_reports_its_kv_cache_size() -> None:
    stats = {"numActiveRequests": 1, "numQueuedRequests": 0,
             "kvCacheStats": {"maxNumBlocks": 500, "usedNumBlocks": 5, "tokensPerBlock": 16}}
    assert parse_pod_metrics(json.dumps([stats]).encode()).kv_capacity_blocks(32) == 250


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
