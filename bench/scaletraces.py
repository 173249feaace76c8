"""Traces whose demand changes over the run, for the autoscaling benchmark (``bench/autoscale.py``).

Pure and seeded (``numpy.random.default_rng(seed)``, no clock). Arrivals are a non-homogeneous Poisson
process drawn by thinning: candidates at the peak rate, each kept with probability ``rate(t) / peak``.
Adapters are Zipf over ``num_adapters`` (weight of rank ``i`` is ``1 / (i + 1) ** alpha``), lengths
lognormal as in :mod:`bench.traces`.

Shapes (``rate(t)`` in requests per second, ``T`` the duration):

* ``diurnal``: one day squeezed into the run, ``low + (peak - low) * (1 - cos(2 pi t / T)) / 2``: starts
  and ends at ``low``, peaks at ``T / 2``;
* ``bursty``: idle (rate 0) until ``burst_start_fraction * T``, ``peak`` until ``burst_end_fraction * T``,
  idle again: the scale-to-zero and scale-from-zero case;
* ``shift``: a constant ``shift_rate_fraction * peak``; at ``shift_at_fraction * T`` the popularity ranks
  are re-drawn (a random permutation), so the hot adapter set changes while the load does not.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from bench.traces import LengthSpec, TraceRequest, lognormal_lengths, zipf_weights

SHAPES = ("diurnal", "bursty", "shift")


@dataclass(frozen=True, slots=True)
class ScaleTraceSpec:
    name: str
    shape: str  # one of SHAPES
    peak_rate_per_s: float
    duration_s: float
    num_adapters: int = 5000
    zipf_alpha: float = 1.0
    low_fraction: float = 0.1  # diurnal: the trough as a fraction of the peak
    burst_start_fraction: float = 0.2
    burst_end_fraction: float = 0.55
    shift_rate_fraction: float = 0.6
    shift_at_fraction: float = 0.5
    prompt: LengthSpec = LengthSpec(median=800, sigma=0.8, min_tokens=4, max_tokens=4096)
    output: LengthSpec = LengthSpec(median=400, sigma=0.7, min_tokens=1, max_tokens=2048)
    seed: int = 0

    def __post_init__(self) -> None:
        if self.shape not in SHAPES:
            raise ValueError(f"unknown shape {self.shape!r}: one of {', '.join(SHAPES)}")
        if self.peak_rate_per_s <= 0 or self.duration_s <= 0:
            raise ValueError("peak_rate_per_s and duration_s must be positive")


def rate_at(spec: ScaleTraceSpec, t_s: float) -> float:
    """The offered rate (requests/s) at ``t_s`` seconds into the run."""
    peak = spec.peak_rate_per_s
    fraction = t_s / spec.duration_s
    if spec.shape == "diurnal":
        low = spec.low_fraction * peak
        return low + (peak - low) * (1.0 - math.cos(2.0 * math.pi * fraction)) / 2.0
    if spec.shape == "bursty":
        return peak if spec.burst_start_fraction <= fraction < spec.burst_end_fraction else 0.0
    return spec.shift_rate_fraction * peak


def mean_rate(spec: ScaleTraceSpec, samples: int = 10_000) -> float:
    """The rate averaged over the run (midpoint rule)."""
    step = spec.duration_s / samples
    return sum(rate_at(spec, (i + 0.5) * step) for i in range(samples)) / samples


def arrival_times(spec: ScaleTraceSpec, rng: np.random.Generator) -> list[float]:
    """Arrival times (s) in ``[0, duration_s)`` by thinning a Poisson process at the peak rate."""
    expected = spec.peak_rate_per_s * spec.duration_s
    gaps = rng.exponential(1.0 / spec.peak_rate_per_s, size=int(expected + 6 * math.sqrt(expected) + 16))
    candidates = np.cumsum(gaps)
    candidates = candidates[candidates < spec.duration_s]
    keep = rng.random(candidates.size)
    return [float(t) for t, u in zip(candidates, keep, strict=True)
            if u * spec.peak_rate_per_s < rate_at(spec, float(t))]


def generate_scale_trace(spec: ScaleTraceSpec) -> list[TraceRequest]:
    """The trace ``spec`` describes (same spec, same trace), sorted by arrival."""
    rng = np.random.default_rng(spec.seed)
    times = arrival_times(spec, rng)
    count = len(times)
    ranks = rng.choice(spec.num_adapters, size=count, p=zipf_weights(spec.num_adapters, spec.zipf_alpha))
    if spec.shape == "shift":
        permutation = rng.permutation(spec.num_adapters)
        shifted = np.asarray(times) >= spec.shift_at_fraction * spec.duration_s
        ranks[shifted] = permutation[ranks[shifted]]
    prompts = lognormal_lengths(spec.prompt, count, rng)
    outputs = lognormal_lengths(spec.output, count, rng)
    width = max(4, len(str(spec.num_adapters - 1)))
    return [
        TraceRequest(
            t_s=round(times[i], 6), request_id=f"r{i:07d}", adapter=f"a{int(ranks[i]):0{width}d}",
            prompt_tokens=int(prompts[i]), max_tokens=int(outputs[i]),
        )
        for i in range(count)
    ]
