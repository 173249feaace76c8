"""The pure parts of bench.peer_overhead: the minimal upstream's answers and the percentile/ratio maths."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from aiohttp.test_utils import TestClient, TestServer

from bench import peer_overhead as peer


def test_completion_response_is_an_openai_text_completion() -> None:
    body = peer.completion_response("m")
    assert body["object"] == "text_completion" and body["model"] == "m"
    (choice,) = body["choices"]
    assert choice == {"index": 0, "text": peer.COMPLETION_TEXT, "logprobs": None, "finish_reason": "length"}
    usage = body["usage"]
    assert usage["total_tokens"] == usage["prompt_tokens"] + usage["completion_tokens"]
    assert peer.models_response("m")["data"][0]["id"] == "m"


def test_upstream_app_serves_what_vllm_router_calls() -> None:
    async def scenario() -> None:
        async with TestClient(TestServer(peer.upstream_app("m"))) as client:
            health = await client.get("/health")
            assert health.status == 200
            models = await client.get("/v1/models")
            assert (await models.json())["data"][0]["id"] == "m"
            completion = await client.post("/v1/completions", json={"model": "m", "prompt": "hi", "max_tokens": 4})
            assert completion.status == 200
            assert (await completion.json()) == peer.completion_response("m")
            assert (await client.get("/v1/completions")).status == 405

    asyncio.run(scenario())


def test_side_percentiles_in_ms() -> None:
    samples = [i / 1000.0 for i in range(1, 101)]  # 1 .. 100 ms
    result = peer.side(samples)
    assert result.p50_ms == pytest.approx(51.0)
    assert result.p99_ms == pytest.approx(100.0)


def test_added_is_per_percentile_difference_and_ratio_guards_zero() -> None:
    delta = peer.added(peer.Side(1.0, 2.0), peer.Side(1.5, 5.0))
    assert delta.p50_ms == pytest.approx(0.5) and delta.p99_ms == pytest.approx(3.0)
    assert peer.ratio(3.0, 1.5) == pytest.approx(2.0)
    assert peer.ratio(1.0, 0.0) is None and peer.ratio(1.0, -0.1) is None


def _results() -> dict[str, Any]:
    latency = {
        "trtfleet direct": {"p50_ms": 0.4, "p99_ms": 1.0},
        "trtfleet router": {"p50_ms": 1.0, "p99_ms": 3.0},
        "vllm-router direct": {"p50_ms": 0.4, "p99_ms": 0.6},
        "vllm-router router": {"p50_ms": 0.6, "p99_ms": 1.6},
    }
    throughput = {
        "trtfleet direct": {"rps": 9000.0},
        "trtfleet router": {"rps": 2000.0, "cpu_us_per_request": 250.0},
        "vllm-router direct": {"rps": 18000.0},
        "vllm-router router": {"rps": 6000.0, "cpu_us_per_request": 50.0},
    }
    return {
        "cores": 2,
        "load_avg_start": 1.0,
        "load_avg_end": 1.5,
        "load_generator": "wrk",
        "latency": latency,
        "throughput": throughput,
    }


def test_summary_and_table() -> None:
    rows = peer.summary(_results())
    assert rows["trtfleet"]["added"].p50_ms == pytest.approx(0.6)
    assert rows["vllm-router"]["added"].p99_ms == pytest.approx(1.0)
    assert rows["ratio_p50"] == pytest.approx(3.0)
    assert rows["ratio_p99"] == pytest.approx(2.0)
    text = peer.table(_results())
    assert "| trtfleet | 0.40 / 1.00 | 1.00 / 3.00 | +0.60 / +2.00 | 9000 | 2000 | 250 |" in text
    assert "| vllm-router | 0.40 / 0.60 | 0.60 / 1.60 | +0.20 / +1.00 | 18000 | 6000 | 50 |" in text
    assert "p50 3.0x, p99 2.0x" in text


def test_wrk_latency_rows_when_measured() -> None:
    results = _results()
    assert "wrk, 1 connection" not in peer.table(results)
    results["wrk_latency"] = {
        "trtfleet direct": {"p50_ms": 0.16, "p99_ms": 0.4},
        "trtfleet router": {"p50_ms": 0.43, "p99_ms": 1.0},
        "vllm-router direct": {"p50_ms": 0.15, "p99_ms": 0.3},
        "vllm-router router": {"p50_ms": 0.24, "p99_ms": 0.5},
    }
    rows = peer.summary(results)
    assert rows["trtfleet"]["wrk_added"].p50_ms == pytest.approx(0.27)
    assert rows["wrk_ratio_p50"] == pytest.approx(3.0)
    assert "trtfleet added +0.270 / +0.600 ms (p50 / p99), vllm-router +0.090 / +0.200 ms; p50 ratio 3.0x" in (
        peer.table(results)
    )
