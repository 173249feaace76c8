"""Per-policy summaries of a simulation run (:mod:`bench.simulate`): hit rates, loads, latency percentiles."""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from bench.simulate import SimResult


def percentile(values: Sequence[float], q: float) -> float:
    if not values:
        return math.nan
    ordered = sorted(values)
    position = (len(ordered) - 1) * q / 100.0
    low = math.floor(position)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (position - low)


def summarize(result: SimResult, since_s: float = 0.0) -> dict[str, float | int | str]:
    """The per-policy row: hit rate, loads, weight bytes, TTFT/e2e p50/p99, tokens/s, errors, over the clients'
    requests that arrived at ``since_s`` or later; the placement's prefetches (background records) arriving then
    are counted apart (``background_*``)."""
    background = [r for r in result.records if r.background and r.arrival_s >= since_s]
    records = [r for r in result.records if not r.background and r.arrival_s >= since_s]
    served = [r for r in records if r.error is None and r.e2e_s is not None]
    errors = Counter(r.error for r in records if r.error is not None)
    ttft = [r.ttft_s for r in served if r.ttft_s is not None]
    e2e = [r.e2e_s for r in served if r.e2e_s is not None]
    first = min((r.arrival_s for r in records), default=0.0)
    last = max((r.arrival_s + (r.e2e_s or 0.0) for r in records), default=0.0)
    tokens = sum(r.output_tokens for r in served)
    loads = sum(r.loads for r in records)
    requests = len(records)
    return {
        "policy": result.policy,
        "requests": requests,
        "hit_rate": sum(r.hit for r in records) / requests if requests else 0.0,
        "effective_hit_rate": 1.0 - (loads + sum(errors.values())) / requests if requests else 0.0,
        "loads": loads,
        "misses": sum(r.misses for r in records),
        "weights_bytes": sum(r.weights_bytes for r in records),
        "background_requests": len(background),
        "background_bytes": sum(r.weights_bytes for r in background),
        "background_errors": sum(r.error is not None for r in background),
        "ttft_p50_s": percentile(ttft, 50),
        "ttft_p99_s": percentile(ttft, 99),
        "e2e_p50_s": percentile(e2e, 50),
        "e2e_p99_s": percentile(e2e, 99),
        "output_tokens_per_s": tokens / (last - first) if last > first else 0.0,
        "errors": sum(errors.values()),
        "error_kinds": ",".join(f"{k}:{v}" for k, v in sorted(errors.items())) or "-",
        "decision_p50_us": percentile(result.decision_times_s, 50) * 1e6,
        "decision_p99_us": percentile(result.decision_times_s, 99) * 1e6,
        "wall_s": result.wall_s,
    }
