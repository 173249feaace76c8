"""The merge decision on a trace (pure, seconds): adapter shares against the advice, and what merging the
advised ones does to pods and per-request time, on the H100 Llama-3-8B step-time model.

``python -m bench.mergedecision`` prints the section of docs/benchmarks/merge.md ("Merge or hot-swap").

The trace: 4 hours of router readings, one a minute (the router's 60 s activity window, so each reading
is Poisson(rate x 60) / 60), for 200 adapters with Zipf(1.0) popularity over a total of 5 pods' worth of
requests, plus ``ramp`` (0 -> 0.8 of a pod from 1 h to 1.5 h, back to 0.1 from 2.5 h) and ``bursty``
(0.05 of a pod, with 2 minutes at 3 pods' worth every 30 minutes). Every reading goes through
:func:`trtfleet.mergedecision.decide` with the defaults of ``spec.merging`` (merge at 50 % of a pod,
back below 25 %, sustained 30 min); a naive rule (merged while the raw reading is at or above 50 %) is
shown beside it for the flips hysteresis saves. Pods: hot-swapped adapters share ``ceil(sum f (1 + o))``
pods, each merged one takes ``max(1, ceil(f))``; integrated over the trace.
"""

from __future__ import annotations

import argparse
import math
import random
import subprocess
from dataclasses import dataclass, field
from datetime import UTC, datetime

from bench.podsim import H100_LLAMA3_8B
from bench.profiles import h100_llama3_8b_fleet, pod_capacity_requests_per_s
from trtfleet.api import MergingSpec, Suggestion
from trtfleet.mergedecision import Costs, Memory, decide

MEAN_PROMPT_TOKENS = 1100.0  # the autoscaling section's trace (lognormal, median 800)
MEAN_OUTPUT_TOKENS = 510.0
SLO_FRACTION = 0.7  # a pod serves 70 % of its compute capacity within the TTFT SLO (Autoscaling section)
LORA_STEP_OVERHEAD = MergingSpec().lora_step_overhead
ADAPTERS = 200
TOTAL_PODS_OF_TRAFFIC = 5.0
READING_S = 60.0
HOURS = 4.0


@dataclass
class Track:
    name: str
    memory: Memory = field(default_factory=Memory)
    suggestions: list[Suggestion] = field(default_factory=list)
    fractions: list[float] = field(default_factory=list)
    naive_flips: int = 0
    first_merged_s: float | None = None


def rate_pods(name: str, t_s: float, zipf_share: float) -> float:
    """The adapter's true rate at ``t_s``, in pods."""
    if name == "ramp":
        if t_s < 3600:
            return 0.0
        if t_s < 5400:
            return 0.8 * (t_s - 3600) / 1800
        return 0.8 if t_s < 9000 else 0.1
    if name == "bursty":
        return 3.0 if t_s % 1800 < 120 else 0.05
    return zipf_share * TOTAL_PODS_OF_TRAFFIC


def run(seed: int = 7) -> tuple[list[Track], dict[str, float], float]:
    rng = random.Random(seed)
    spec = h100_llama3_8b_fleet(1)
    capacity = SLO_FRACTION * pod_capacity_requests_per_s(spec, MEAN_PROMPT_TOKENS, MEAN_OUTPUT_TOKENS)
    defaults = MergingSpec()
    costs = Costs(capacity, LORA_STEP_OVERHEAD, defaults.merge_above_pod_fraction,
                  defaults.unmerge_below_pod_fraction, float(defaults.sustain_seconds))
    harmonic = sum(1 / k for k in range(1, ADAPTERS + 1))
    shares = {f"zipf-{k:03d}": 1 / k / harmonic for k in range(1, ADAPTERS + 1)}
    shares |= {"ramp": 0.0, "bursty": 0.0}
    tracks = {name: Track(name) for name in shares}
    pod_s = {"all hot-swapped": 0.0, "merge as advised": 0.0}
    steps = int(HOURS * 3600 / READING_S)
    for step in range(steps):
        t_s = step * READING_S
        for name, track in tracks.items():
            true_rate = rate_pods(name, t_s, shares[name]) * capacity
            reading = _poisson(rng, true_rate * READING_S) / READING_S
            advice = decide(costs, track.memory, reading, t_s)
            track.memory = advice.memory
            track.suggestions.append(advice.suggestion)
            track.fractions.append(reading / capacity)
            naive_now = reading / capacity >= costs.merge_above
            naive_before = len(track.fractions) > 1 and track.fractions[-2] >= costs.merge_above
            track.naive_flips += naive_now != naive_before and len(track.fractions) > 1
            if advice.suggestion is Suggestion.MERGED and track.first_merged_s is None:
                track.first_merged_s = t_s
        true = {n: rate_pods(n, t_s, shares[n]) for n in tracks}
        pod_s["all hot-swapped"] += READING_S * math.ceil(sum(f * (1 + LORA_STEP_OVERHEAD) for f in true.values()))
        merged = {n for n, tr in tracks.items() if tr.suggestions[-1] is Suggestion.MERGED}
        shared = sum(f * (1 + LORA_STEP_OVERHEAD) for n, f in true.items() if n not in merged)
        pod_s["merge as advised"] += READING_S * (
            math.ceil(shared) + sum(max(1, math.ceil(true[n] - 1e-9)) for n in merged)
        )
    return list(tracks.values()), pod_s, capacity


def _poisson(rng: random.Random, mean: float) -> int:
    if mean <= 0:
        return 0
    if mean > 50:
        return max(0, round(rng.gauss(mean, math.sqrt(mean))))
    limit, k, product = math.exp(-mean), 0, rng.random()
    while product > limit:
        k += 1
        product *= rng.random()
    return k


def _flips(suggestions: list[Suggestion]) -> int:
    decided = [s for s in suggestions if s is not Suggestion.UNKNOWN]
    return sum(1 for a, b in zip(decided, decided[1:], strict=False) if a is not b)


def section(tracks: list[Track], pod_s: dict[str, float], capacity: float) -> str:
    model = H100_LLAMA3_8B
    prefill_s = model.step_s(1, int(MEAN_PROMPT_TOKENS), int(MEAN_PROMPT_TOKENS))
    batch = 64
    decode_s = model.step_s(batch, int(batch * (MEAN_PROMPT_TOKENS + MEAN_OUTPUT_TOKENS / 2)), 0)
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                            check=False).stdout.strip()
    shown = [t for t in tracks if t.name in ("zipf-001", "zipf-002", "zipf-003", "zipf-004", "ramp", "bursty")]
    rows = [
        "| adapter | mean share of a pod | last reading | advice at 4 h | first merged at | advice changes "
        "| naive flips |",
        "| --- | --- | --- | --- | --- | --- | --- |",
    ]
    for t in shown:
        first = "-" if t.first_merged_s is None else f"{t.first_merged_s / 60:.0f} min"
        rows.append(
            f"| {t.name} | {sum(t.fractions) / len(t.fractions):.0%} | {t.fractions[-1]:.0%} | "
            f"{t.suggestions[-1].value} | {first} | {_flips(t.suggestions)} | {t.naive_flips} |"
        )
    rest = [t for t in tracks if t not in shown]
    merged_rest = sum(1 for t in rest if Suggestion.MERGED in t.suggestions)
    before, after = pod_s["all hot-swapped"], pod_s["merge as advised"]
    return "\n".join([
        f"`python -m bench.mergedecision` (pure, {HOURS:.0f} h trace in about a second; machine: the 2-core "
        f"development VM; date {datetime.now(UTC):%Y-%m-%d}; commit {commit}).",
        "",
        f"Pod capacity: {capacity:.1f} requests/s (the H100 Llama-3-8B step-time model's "
        f"{capacity / SLO_FRACTION:.1f} at mean prompt {MEAN_PROMPT_TOKENS:.0f} / output "
        f"{MEAN_OUTPUT_TOKENS:.0f} tokens, at the {SLO_FRACTION:.0%} that meets the TTFT SLO); LoRA step "
        f"overhead {LORA_STEP_OVERHEAD:.0%}; {ADAPTERS} adapters Zipf(1.0) over {TOTAL_PODS_OF_TRAFFIC:.0f} "
        "pods of traffic, plus `ramp` and `bursty`; one reading a minute; spec.merging defaults.",
        "",
        *rows,
        "",
        f"The other {len(rest)} Zipf adapters: {merged_rest} ever advised "
        "merged. Pods over the trace (whole pods, LoRA overhead included): all hot-swapped "
        f"{before / 3600:.1f} pod-hours; merging as advised {after / 3600:.1f} pod-hours "
        f"({after / before - 1:+.1%}). Per request of a merged adapter the step-time model gives a prefill of "
        f"{prefill_s * 1e3:.1f} ms at {MEAN_PROMPT_TOKENS:.0f} prompt tokens and a decode step of "
        f"{decode_s * 1e3:.1f} ms at batch {batch}: merged saves about {LORA_STEP_OVERHEAD * prefill_s * 1e3:.1f} "
        f"ms of TTFT and {LORA_STEP_OVERHEAD * decode_s * 1e3:.2f} ms per output token, plus any cold load "
        "(a hot adapter rarely has one).",
    ])


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.mergedecision", description=__doc__.split("\n")[0])
    parser.add_argument("--seed", type=int, default=7)
    args = parser.parse_args()
    tracks, pod_s, capacity = run(args.seed)
    print(section(tracks, pod_s, capacity))


if __name__ == "__main__":
    main()
