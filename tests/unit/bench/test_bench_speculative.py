"""Speculative decoding in the simulator's pod (fewer steps at the adapter's acceptance, draft tokens priced in the
step) and the acceptance rate the benchmark derives from a published speed-up."""

from __future__ import annotations

import dataclasses

import pytest
from trtfleet_engines.speculation import tokens_per_step

from bench.podsim import PodSpec, SimPod, SimRequest, SpeculationModel, StepTimeModel
from bench.speculative import acceptance_for_speedup

STEP = StepTimeModel(name="flat", fixed_s=0.01, per_seq_s=0.0, per_context_token_s=0.0, per_prefill_token_s=0.001)
POD = PodSpec(host_pages=4, device_pages=4, page_bytes=1000, max_batch_size=4, max_queue_size=4,
              kv_capacity_tokens=10_000, host_to_device_bytes_per_s=1e18)


def _finish(pod: SimPod, task_id: int, max_tokens: int) -> tuple[int, float]:
    request = SimRequest(0, task_id, prompt_tokens=1, max_tokens=max_tokens, with_weights=True, pages=1)
    pod.arrive(request)
    now_s, steps = 0.0, 0
    while (duration := pod.start_step()) > 0:
        now_s += duration
        steps += 1
        pod.end_step(now_s)
    assert request.finished_s == pytest.approx(now_s)
    return steps, now_s


def test_a_request_needs_fewer_steps_at_its_adapters_acceptance() -> None:
    model = SpeculationModel(draft_len=3, acceptance=1.0, adapter_acceptance=((2, 0.0),))
    plain_steps, _ = _finish(SimPod("p", POD, STEP), 1, 13)
    fast_steps, fast_s = _finish(SimPod("p", dataclasses.replace(POD, speculation=model), STEP), 1, 13)
    slow_steps, _ = _finish(SimPod("p", dataclasses.replace(POD, speculation=model), STEP), 2, 13)
    assert plain_steps == 13 and slow_steps == 13, "the prefill gives one token, then one a step"
    assert fast_steps == 1 + 3, "12 more tokens at 4 a step"
    # the prefill step, then 3 decode steps each verifying 3 draft tokens at a prefill token's price
    assert fast_s == pytest.approx(0.01 + 0.001 + 3 * (0.01 + 3 * 0.001))


def test_the_pod_reports_its_running_requests_tokens_per_step() -> None:
    model = SpeculationModel(draft_len=4, acceptance=0.5)
    pod = SimPod("p", dataclasses.replace(POD, speculation=model), STEP)
    assert pod.tokens_per_step() is None
    pod.arrive(SimRequest(0, 1, prompt_tokens=1, max_tokens=50, with_weights=True, pages=1))
    pod.start_step()
    assert pod.tokens_per_step() == pytest.approx(tokens_per_step(0.5, 4))
    assert SimPod("p", POD, STEP).tokens_per_step() is None


@pytest.mark.parametrize("draft_len", [1, 3, 5])
def test_the_derived_acceptance_gives_the_published_speedup(draft_len: int) -> None:
    rate = acceptance_for_speedup(2.16, draft_len)
    if draft_len == 1:  # at most 2 tokens a step: even every draft accepted falls short
        assert rate == pytest.approx(1.0)
    else:
        assert tokens_per_step(rate, draft_len) == pytest.approx(2.16, abs=1e-9)
