"""The simulator's ``pytorch`` runtime: the pod reads cold adapters, never misses, and holds what finds no room.

Same small fleet and seeded traces as ``test_bench_simulate.py``, with ``runtime="pytorch"``.
"""

from __future__ import annotations

import dataclasses
import math

import pytest
from trtfleet_router.routing import policy_names

from bench.podsim import PodSpec, SimPod, SimRequest, StepTimeModel
from bench.simstats import summarize
from bench.simulate import FleetSpec, simulate
from bench.traces import TraceRequest
from tests.unit.bench.test_bench_simulate import small_fleet, small_trace

FLAT = StepTimeModel("flat", fixed_s=0.01, per_seq_s=0.0, per_context_token_s=0.0, per_prefill_token_s=0.0)
READING_POD = PodSpec(host_pages=2, device_pages=2, page_bytes=1000, max_batch_size=4, max_queue_size=8,
                      kv_capacity_tokens=10_000, read_bytes_per_s=1e6)


def torch_fleet(pods: int = 3, host_pages: int = 3) -> FleetSpec:
    return dataclasses.replace(small_fleet(pods, host_pages), runtime="pytorch", pod_read_bytes_per_s=2e8)


def reading(key: int, task_id: int, weights_bytes: int = 1000) -> SimRequest:
    return SimRequest(key, task_id, prompt_tokens=10, max_tokens=1, with_weights=False, pages=1,
                      weights_bytes=weights_bytes)


def test_pod_reads_one_adapter_at_a_time_and_never_misses() -> None:
    pod = SimPod("p", READING_POD, FLAT)
    first, second, same = reading(0, 1), reading(1, 2, weights_bytes=3000), reading(2, 1)
    assert pod.arrive(first, 0.0) == pytest.approx(0.001)  # 1000 bytes at 1 MB/s
    assert pod.arrive(second, 0.0) == pytest.approx(0.004)  # after the first read
    assert pod.arrive(same, 0.0005) == pytest.approx(0.001)  # waits for the read under way, no second read
    assert (first.loaded, second.loaded, same.loaded) == (True, True, False) and pod.load_bytes_total == 4000
    assert pod.start_step(0.0) == 0.0 and pod.active == 0  # nothing read yet: idle
    assert pod.start_step(0.001) > 0 and pod.active == 1  # FIFO: the head is read, the second is not


def test_full_host_tier_holds_the_request_in_the_pod() -> None:
    pod = SimPod("p", READING_POD, FLAT)
    pod.arrive(reading(0, 1), 0.0)
    pod.arrive(reading(1, 2), 0.0)
    third = reading(2, 3)
    assert pod.arrive(third, 0.0) == math.inf and pod.queue_depth == 3  # both pages pinned: it waits
    assert pod.unblock(0.0) == []
    duration = pod.start_step(0.002)
    assert duration > 0 and len(pod.end_step(0.002 + duration)) == 2
    ready = pod.unblock(0.02)  # adapter 1 released and evicted: adapter 3 is read now
    assert ready == [pytest.approx(0.021)] and third.loaded and pod.loads_total == 3


def test_cold_load_costs_the_pods_read_not_a_transfer() -> None:
    trace = [TraceRequest(float(i), f"r{i}", "solo", 100, 5) for i in range(3)]
    spec = dataclasses.replace(torch_fleet(pods=1), one_way_latency_s=0.001, pod_read_bytes_per_s=1e7,
                               artifact_fetch_latency_s=5.0, link_bytes_per_s=1.0)  # unused on pytorch
    result = simulate(trace, "ttft-cost", spec)
    row = summarize(result)
    assert row["loads"] == 1 and row["errors"] == 0 and row["weights_bytes"] == 0
    assert result.fleet_counters["artifact_fetches"] == 0
    step = spec.model.step_s(0, 0, 100)
    copy_s = spec.pod.page_bytes / spec.pod.host_to_device_bytes_per_s
    read_s = spec.adapter_weights_bytes / spec.pod_read_bytes_per_s  # 1 MB at 10 MB/s
    assert result.records[0].ttft_s == pytest.approx(0.001 + read_s + copy_s + step + 0.001)
    assert result.records[1].ttft_s == pytest.approx(0.001 + step + 0.001)


@pytest.mark.parametrize("policy", policy_names())
def test_pytorch_fleet_serves_every_request(policy: str) -> None:
    trace = small_trace(11)
    result = simulate(trace, policy, torch_fleet(host_pages=2), seed=3)
    row = summarize(result)
    assert row["errors"] == 0 and row["misses"] == 0 and row["weights_bytes"] == 0
    assert result.fleet_counters["open_tickets"] == 0
    assert 0 < result.pod_loads == sum(r.loads for r in result.records)
    assert all(r.ttft_s is not None and r.output_tokens == trace[r.key].max_tokens for r in result.records)
