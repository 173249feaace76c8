"""Speculation counters as pods report them -> acceptance, tokens per step, steps per second and MBU (pure), and
what the router exports from a scrape."""

from __future__ import annotations

import json
import math

import pytest
from trtfleet_router.metrics import RouterMetrics, SpeculationScrape
from trtfleet_router.upstream.acceptance import PodSpeculation, SpecSample
from trtfleet_router.upstream.scrape import parse_pod_metrics

ADAPTER = 'trtfleet_reference_spec_decode_adapter_metrics{{lora_task_id="{task}",spec_decode_type="{kind}"}} {value}\n'
TRITON = """nv_trt_llm_request_metrics{model="tensorrt_llm",request_type="active",version="1"} 2
nv_trt_llm_general_metrics{general_type="iteration_counter",model="tensorrt_llm",version="1"} 40
trtfleet_reference_spec_decode_metrics{model="tensorrt_llm",spec_decode_type="draft_tokens",version="1"} 100
trtfleet_reference_spec_decode_metrics{model="tensorrt_llm",spec_decode_type="accepted_tokens",version="1"} 60
trtfleet_reference_spec_decode_metrics{model="tensorrt_llm",spec_decode_type="draft_steps",version="1"} 30
""" + "".join(ADAPTER.format(task=task, kind=kind, value=value) for task, kind, value in (
    (0, "draft_tokens", 80), (0, "accepted_tokens", 56), (7, "draft_tokens", 20), (7, "accepted_tokens", 4)))


def _entry(iteration: int, drafted: int, accepted: int, steps: int) -> dict[str, object]:
    return {"iter": iteration, "numActiveRequests": 1, "numQueuedRequests": 0,
            "specDecodingStats": {"numDraftTokens": drafted, "numAcceptedTokens": accepted,
                                  "numRequestsWithDraftTokens": steps, "acceptanceLength": 1.0},
            "trtfleetReferenceSpecDecodingByAdapter": [{"loraId": 3, "numDraftTokens": 9, "numAcceptedTokens": 3}]}


def test_triton_text_gives_cumulative_counts_per_adapter() -> None:
    load = parse_pod_metrics(TRITON.encode())
    assert load.spec == SpecSample(100, 60, 30, True, ((0, 80, 56), (7, 20, 4)))
    assert load.iterations == 40


def test_trtllm_serve_entries_are_summed() -> None:
    load = parse_pod_metrics(json.dumps([_entry(5, 8, 6, 2), _entry(6, 4, 0, 1)]).encode())
    assert load.spec == SpecSample(12, 6, 3, False, ((3, 9, 3),))
    assert load.iterations == 6
    assert parse_pod_metrics(json.dumps([{"iter": 1, "numActiveRequests": 0}]).encode()).spec is None


def test_consecutive_samples_give_the_last_intervals_figures() -> None:
    pod = PodSpeculation()
    assert pod.observe(SpecSample(100, 60, 30, True), 40, now_s=10.0) == (100, 60)
    assert pod.current is not None and pod.current.acceptance_rate == pytest.approx(0.6)
    assert pod.current.tokens_per_step == pytest.approx(3.0)
    assert pod.observe(SpecSample(140, 70, 50, True), 60, now_s=12.0) == (40, 10)
    assert (pod.current.acceptance_rate, pod.current.tokens_per_step) == (pytest.approx(0.25), pytest.approx(1.5))
    assert pod.steps_per_s == pytest.approx(10.0)
    assert pod.observe(SpecSample(140, 70, 50, True), 60, now_s=13.0) == (0, 0)
    assert pod.current.acceptance_rate == pytest.approx(0.25), "an interval without drafts keeps the last figure"
    assert pod.observe(SpecSample(10, 10, 5, True), 5, now_s=14.0) == (10, 10), "a restarted pod counts afresh"


def test_json_deltas_add_up() -> None:
    pod = PodSpeculation()
    pod.observe(SpecSample(12, 6, 3, False), None, 0.0)
    pod.observe(SpecSample(8, 8, 2, False), None, 1.0)
    assert pod.total == (20, 14, 5)
    assert pod.current is not None and pod.current.tokens_per_step == pytest.approx(5.0)


def test_per_adapter_acceptance() -> None:
    pod = PodSpeculation()
    pod.observe(SpecSample(0, 0, 0, True, ((0, 80, 56), (7, 20, 4))), None, 0.0)
    assert pod.by_adapter[0].acceptance_rate == pytest.approx(0.7)
    assert pod.by_adapter[7].acceptance_rate == pytest.approx(0.2)


def test_model_bandwidth_utilization() -> None:
    pod = PodSpeculation()
    assert pod.bandwidth_utilization(16_000_000_000, 131072, 10_000, 3.35e12) is None, "no steps per second yet"
    pod.observe(None, 100, 0.0)
    pod.observe(None, 150, 1.0)
    # (16 GB of weights + 10,000 tokens x 128 KiB) x 50 steps/s / 3.35 TB/s
    expected = (16_000_000_000 + 131072 * 10_000) * 50 / 3.35e12
    assert pod.bandwidth_utilization(16_000_000_000, 131072, 10_000, 3.35e12) == pytest.approx(expected)
    assert pod.bandwidth_utilization(0, 131072, 10_000, 3.35e12) is None


def test_the_router_exports_a_pods_figures_and_forgets_them() -> None:
    metrics = RouterMetrics()
    pod = PodSpeculation()
    pod.observe(SpecSample(100, 60, 30, True, ((0, 80, 56), (7, 20, 4))), 40, 10.0)
    pod.observe(SpecSample(140, 70, 50, True, ((0, 100, 60), (7, 40, 10))), 60, 12.0)
    current = pod.current
    assert current is not None
    metrics.observe_pod_speculation("m", "p0", SpeculationScrape(
        40, 10, current.acceptance_rate, current.tokens_per_step, pod.steps_per_s, 0.42,
        {"base" if task == 0 else "sql": found.acceptance_rate for task, found in pod.by_adapter.items()}))
    text = metrics.exposition().decode()
    assert 'trtfleet_router_pod_spec_decode_tokens_per_step{base_model="m",pod="p0"} 1.5' in text
    assert 'trtfleet_router_pod_model_bandwidth_utilization_ratio{base_model="m",pod="p0"} 0.42' in text
    assert 'trtfleet_router_spec_decode_draft_tokens_total{base_model="m"} 40.0' in text
    assert 'trtfleet_router_adapter_spec_decode_acceptance_ratio{adapter="sql",base_model="m"} 0.3' in text
    assert 'trtfleet_router_base_model_spec_decode_tokens_per_step{base_model="m"} 1.5' in text
    metrics.forget_pod_speculation("m", "p0")
    text = metrics.exposition().decode()
    assert 'pod="p0"' not in text and "base_model_spec_decode_tokens_per_step{" not in text
    assert math.isfinite(pod.steps_per_s or math.nan)
