"""The trace generator: seeded, shaped as specified, round-trips through JSONL."""

from __future__ import annotations

import dataclasses
from collections import Counter
from pathlib import Path

import numpy as np
import pytest

from bench import traces
from bench.traces import (
    GIE_REGRESSION_SPLIT,
    FleetLimits,
    LengthSpec,
    TraceRequest,
    TraceSpec,
    check_fits,
    generate,
)


def test_same_spec_same_trace() -> None:
    spec = TraceSpec(name="t", num_adapters=20, num_requests=500, seed=3)
    assert traces.generate(spec) == traces.generate(spec)
    assert traces.generate(spec) != traces.generate(dataclasses.replace(spec, seed=4))


def test_zipf_weights_are_normalised_and_decreasing() -> None:
    weights = traces.zipf_weights(100, 1.2)
    assert weights.sum() == pytest.approx(1.0)
    assert np.all(np.diff(weights) < 0)
    assert weights[0] / weights[1] == pytest.approx(2**1.2)


def test_zipf_popularity_is_observed() -> None:
    spec = TraceSpec(name="t", num_adapters=50, zipf_alpha=1.0, num_requests=20_000, seed=1)
    counts = Counter(r.adapter for r in traces.generate(spec))
    names = spec.adapter_names()
    expected = traces.zipf_weights(50, 1.0)
    assert counts[names[0]] / 20_000 == pytest.approx(expected[0], abs=0.01)
    assert counts[names[0]] > counts[names[10]] > counts[names[49]]


def test_gie_regression_split() -> None:
    assert sum(GIE_REGRESSION_SPLIT) == pytest.approx(1.0)
    spec = TraceSpec(name="g", num_adapters=15, popularity="gie-regression", num_requests=30_000, seed=2)
    counts = Counter(r.adapter for r in traces.generate(spec))
    names = spec.adapter_names()
    for name, share in zip(names, GIE_REGRESSION_SPLIT, strict=True):
        assert counts[name] / 30_000 == pytest.approx(share, abs=0.008)
    with pytest.raises(ValueError, match="15 adapters"):
        traces.popularity_weights(dataclasses.replace(spec, num_adapters=14))


@pytest.mark.parametrize("arrivals", ["poisson", "onoff"])
def test_arrivals_are_sorted_and_keep_the_mean_rate(arrivals: str) -> None:
    spec = TraceSpec(name="t", rate_per_s=50.0, num_requests=20_000, arrivals=arrivals, burst_period_s=2.0)
    trace = traces.generate(spec)
    times = [r.t_s for r in trace]
    assert times == sorted(times) and times[0] == 0.0
    assert traces.offered_load(trace)["rate_per_s"] == pytest.approx(50.0, rel=0.1)


def test_onoff_is_burstier_than_poisson() -> None:
    rng = np.random.default_rng(0)
    poisson = traces.poisson_arrivals(100.0, 20_000, rng)
    onoff = traces.onoff_arrivals(100.0, 20_000, 8.0, 1.0, rng)

    def dispersion(times: np.ndarray) -> float:  # variance/mean of counts per 0.5 s window
        counts = np.bincount((times / 0.5).astype(int))
        return float(counts.var() / counts.mean())

    assert dispersion(poisson) < 1.5 < 5 < dispersion(onoff)


def test_popularity_shift_changes_the_hot_set() -> None:
    spec = TraceSpec(name="s", num_adapters=100, zipf_alpha=1.2, num_requests=10_000, shift_at_fraction=0.5)
    trace = traces.generate(spec)
    first = Counter(r.adapter for r in trace[:5000]).most_common(1)[0][0]
    second = Counter(r.adapter for r in trace[5000:]).most_common(1)[0][0]
    assert first == spec.adapter_names()[0]
    assert second != first


def test_lengths_are_clipped_to_engine_limits() -> None:
    spec = TraceSpec(
        name="t",
        num_requests=5000,
        prompt=LengthSpec(median=200, sigma=2.0, min_tokens=8, max_tokens=256),
        output=LengthSpec(median=50, sigma=2.0, min_tokens=1, max_tokens=64),
    )
    trace = traces.generate(spec)
    assert min(r.prompt_tokens for r in trace) == 8 and max(r.prompt_tokens for r in trace) == 256
    assert min(r.max_tokens for r in trace) == 1 and max(r.max_tokens for r in trace) == 64


def test_jsonl_round_trip_with_text(tmp_path: Path) -> None:
    spec = TraceSpec(name="rt", num_adapters=5, num_requests=50)
    path = traces.write_trace(spec, tmp_path, with_text=True)
    assert traces.read_jsonl(path) == traces.generate(spec)
    first = path.read_text().splitlines()[0]
    assert '"prompt":' in first
    meta = path.with_suffix(".meta.json").read_text()
    assert traces.spec_from_dict(__import__("json").loads(meta)["spec"]) == spec


@pytest.mark.parametrize("size", [1, 7, 64, 300])
def test_prompt_text_has_exact_byte_length(size: int) -> None:
    text = traces.prompt_text("r000123", size)
    assert len(text.encode()) == size and text.isascii()
    assert text == traces.prompt_text("r000123", size)


def test_standard_set_covers_the_grid() -> None:
    names = [s.name for s in traces.standard_specs(num_requests=10)]
    assert "zipf-n1000-a1.2" in names and "gie-regression" in names
    assert "onoff-n200-a1.0" in names and "shift-n200-a1.0" in names
    assert len(names) == 12


def test_real_scenario_trace_fits_the_reference_engine() -> None:
    from bench.realscenario import RealScenario

    for scenario in (RealScenario(), RealScenario(adapters=200, duration_s=180.0)):
        limits = scenario.limits()
        assert (limits.max_input_tokens, limits.max_seq_tokens, limits.max_prompt_tokens) == (128, 256, 126)
        trace = generate(scenario.trace_spec())
        check_fits(trace, limits, name="real")
        # The cap binds: without it the same seed asks for longer prompts than the engine takes.
        assert max(r.prompt_tokens for r in trace) == limits.max_prompt_tokens


def test_check_fits_names_the_first_offender() -> None:
    limits = FleetLimits(max_input_tokens=128, max_seq_tokens=256, prompt_overhead_tokens=2)
    ok = TraceRequest(t_s=0.0, request_id="r0", adapter="a", prompt_tokens=126, max_tokens=64)
    long_prompt = TraceRequest(t_s=0.1, request_id="r1", adapter="a", prompt_tokens=127, max_tokens=4)
    long_sequence = TraceRequest(t_s=0.2, request_id="r2", adapter="a", prompt_tokens=100, max_tokens=155)
    check_fits([ok], limits, name="t")
    assert not limits.fits(long_sequence)
    with pytest.raises(ValueError, match=r"trace t: 2 of 3 requests exceed .* e\.g\. r1: prompt 127"):
        check_fits([ok, long_prompt, long_sequence], limits, name="t")
