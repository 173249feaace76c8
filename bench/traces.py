"""Multi-LoRA request traces: seeded, pure, replayable by any client.

A trace is a list of :class:`TraceRequest` sorted by arrival time ``t_s``. On disk it is JSONL, one
request a line::

    {"t_s": 0.0123, "request_id": "r000000", "adapter": "a0007", "prompt_tokens": 212,
     "max_tokens": 64, "prompt": "..."}

``prompt`` is optional (``--with-text``): deterministic ASCII text of ``prompt_tokens`` bytes, which is
``prompt_tokens`` tokens for the reference engine's byte tokenizer (plus its two specials). A sibling
``<file>.meta.json`` records the :class:`TraceSpec` that produced it.

Shapes (all seeded with ``numpy.random.default_rng(seed)``; nothing reads the clock):

* **popularity** ``zipf``: adapter ``i`` (0-based) has weight ``1 / (i + 1) ** alpha``;
  ``gie-regression``: the Gateway API Inference Extension's multi-LoRA regression benchmark
  (``config/manifests/regression-testing/multi-lora-regression.yaml``): 15 adapters, traffic split
  5 x 12 %, 5 x 6 %, 5 x 2 %, swept over 20-200 req/s for 300 s each against 10 vLLM replicas of
  Llama-3.1-8B (``--max-loras 15``, rank 8) with prompts from Infinity-Instruct capped at 1024/1024
  tokens. We keep its split and its Poisson arrivals; lengths come from our lognormal model.
* **arrivals** ``poisson`` at ``rate_per_s``; ``onoff``: a Markov-modulated Poisson process that
  alternates exponential ON and OFF periods (mean ``burst_period_s``), ON at ``burst_factor`` times the
  rate of OFF, scaled so the long-run mean stays ``rate_per_s``.
* **shift**: at ``shift_at_fraction`` of the trace the popularity ranks are re-drawn (a random
  permutation), so yesterday's hot adapters go cold mid-trace.
* **lengths** lognormal (median, sigma) rounded and clipped to ``[min, max]`` (the engine limits).

Run ``python -m bench.traces --out DIR`` to write the standard set.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from numpy.typing import NDArray

GIE_REGRESSION_SPLIT: tuple[float, ...] = (0.12,) * 5 + (0.06,) * 5 + (0.02,) * 5
_WORDS = (
    "the quick brown fox jumps over a lazy dog while seven wizards quietly judge every box of "
    "mixed jam and pack my case with five dozen liquor jugs"
).split()


@dataclass(frozen=True, slots=True)
class TraceRequest:
    t_s: float
    request_id: str
    adapter: str
    prompt_tokens: int
    max_tokens: int
    blocks: tuple[int, ...] = ()  # chained KV block hashes of the prompt (bench/mooncake.py), else none


@dataclass(frozen=True, slots=True)
class LengthSpec:
    """Lognormal token count: ``round(median * exp(sigma * N(0,1)))`` clipped to ``[min, max]``."""

    median: float
    sigma: float
    min_tokens: int
    max_tokens: int


@dataclass(frozen=True, slots=True)
class TraceSpec:
    name: str
    num_adapters: int = 200
    popularity: str = "zipf"  # zipf | gie-regression
    zipf_alpha: float = 1.0
    rate_per_s: float = 10.0
    num_requests: int = 2000
    arrivals: str = "poisson"  # poisson | onoff
    burst_factor: float = 4.0
    burst_period_s: float = 5.0
    shift_at_fraction: float | None = None
    prompt: LengthSpec = LengthSpec(median=200, sigma=0.8, min_tokens=4, max_tokens=1024)
    output: LengthSpec = LengthSpec(median=128, sigma=0.7, min_tokens=1, max_tokens=1024)
    seed: int = 0
    adapter_prefix: str = "a"

    def adapter_names(self) -> list[str]:
        width = max(4, len(str(self.num_adapters - 1)))
        return [f"{self.adapter_prefix}{i:0{width}d}" for i in range(self.num_adapters)]


def zipf_weights(num_adapters: int, alpha: float) -> NDArray[np.float64]:
    """Normalised Zipf weights ``1 / rank ** alpha`` for ranks 1..n."""
    if num_adapters < 1:
        raise ValueError("a trace needs at least one adapter")
    weights = 1.0 / np.arange(1, num_adapters + 1, dtype=np.float64) ** alpha
    return weights / weights.sum()


def popularity_weights(spec: TraceSpec) -> NDArray[np.float64]:
    if spec.popularity == "zipf":
        return zipf_weights(spec.num_adapters, spec.zipf_alpha)
    if spec.popularity == "gie-regression":
        if spec.num_adapters != len(GIE_REGRESSION_SPLIT):
            raise ValueError(f"the GIE regression shape has {len(GIE_REGRESSION_SPLIT)} adapters")
        weights = np.asarray(GIE_REGRESSION_SPLIT, dtype=np.float64)
        return weights / weights.sum()
    raise ValueError(f"unknown popularity {spec.popularity!r}: zipf or gie-regression")


def poisson_arrivals(rate_per_s: float, count: int, rng: np.random.Generator) -> NDArray[np.float64]:
    """Arrival times (s) of ``count`` requests of a Poisson process starting at 0."""
    if rate_per_s <= 0:
        raise ValueError("rate_per_s must be positive")
    gaps = rng.exponential(1.0 / rate_per_s, size=count)
    gaps[0] = 0.0
    return np.cumsum(gaps)


def onoff_arrivals(
    rate_per_s: float, count: int, burst_factor: float, period_s: float, rng: np.random.Generator
) -> NDArray[np.float64]:
    """Markov-modulated Poisson: ON/OFF periods with exponential lengths (mean ``period_s`` each).

    The ON rate is ``burst_factor`` times the OFF rate; both are set so the mean rate is ``rate_per_s``
    (equal mean ON and OFF time: ``on + off = 2 * rate``).
    """
    if burst_factor < 1:
        raise ValueError("burst_factor must be >= 1")
    off_rate = 2.0 * rate_per_s / (1.0 + burst_factor)
    on_rate = burst_factor * off_rate
    times: list[float] = []
    t, on = 0.0, True
    while len(times) < count:
        end = t + rng.exponential(period_s)
        rate = on_rate if on else off_rate
        clock = t
        while True:
            clock += rng.exponential(1.0 / rate)
            if clock >= end or len(times) >= count:
                break
            times.append(clock)
        t, on = end, not on
    arrivals = np.asarray(times[:count]) - times[0]
    return arrivals


def lognormal_lengths(spec: LengthSpec, count: int, rng: np.random.Generator) -> NDArray[np.int64]:
    raw = spec.median * np.exp(spec.sigma * rng.standard_normal(count))
    return np.clip(np.rint(raw), spec.min_tokens, spec.max_tokens).astype(np.int64)


def generate(spec: TraceSpec) -> list[TraceRequest]:
    """The trace ``spec`` describes (same spec, same trace)."""
    rng = np.random.default_rng(spec.seed)
    names = spec.adapter_names()
    weights = popularity_weights(spec)
    if spec.arrivals == "poisson":
        times = poisson_arrivals(spec.rate_per_s, spec.num_requests, rng)
    elif spec.arrivals == "onoff":
        times = onoff_arrivals(
            spec.rate_per_s, spec.num_requests, spec.burst_factor, spec.burst_period_s, rng
        )
    else:
        raise ValueError(f"unknown arrivals {spec.arrivals!r}: poisson or onoff")
    ranks = rng.choice(spec.num_adapters, size=spec.num_requests, p=weights)
    if spec.shift_at_fraction is not None:
        # Re-map popularity ranks to other adapters from the shift on.
        permutation = rng.permutation(spec.num_adapters)
        start = int(spec.num_requests * spec.shift_at_fraction)
        ranks[start:] = permutation[ranks[start:]]
    prompts = lognormal_lengths(spec.prompt, spec.num_requests, rng)
    outputs = lognormal_lengths(spec.output, spec.num_requests, rng)
    width = max(6, len(str(spec.num_requests - 1)))
    return [
        TraceRequest(
            t_s=round(float(times[i]), 6),
            request_id=f"r{i:0{width}d}",
            adapter=names[int(ranks[i])],
            prompt_tokens=int(prompts[i]),
            max_tokens=int(outputs[i]),
        )
        for i in range(spec.num_requests)
    ]


@dataclass(frozen=True, slots=True)
class FleetLimits:
    """What one request may ask of the fleet a trace is replayed on: the engine's build limits.

    A request past them is answered 400 by the engine, so a trace that holds one measures the engine's
    input check, not the routing: replays refuse such traces (:func:`check_fits`).
    """

    max_input_tokens: int  # BaseModel spec.engine.maxInputLen
    max_seq_tokens: int  # spec.engine.maxSeqLen: prompt plus output
    prompt_overhead_tokens: int = 0  # tokens the serving format adds to the prompt text (special tokens)

    def fits(self, request: TraceRequest) -> bool:
        prompt = request.prompt_tokens + self.prompt_overhead_tokens
        return prompt <= self.max_input_tokens and prompt + request.max_tokens <= self.max_seq_tokens

    @property
    def max_prompt_tokens(self) -> int:
        """The longest prompt text (in tokens) a request may carry."""
        return self.max_input_tokens - self.prompt_overhead_tokens


def check_fits(trace: Sequence[TraceRequest], limits: FleetLimits, *, name: str) -> None:
    """Raise ``ValueError`` naming the first offender when any request of ``trace`` exceeds ``limits``."""
    over = [request for request in trace if not limits.fits(request)]
    if over:
        first = over[0]
        raise ValueError(
            f"trace {name}: {len(over)} of {len(trace)} requests exceed the fleet's limits (maxInputLen "
            f"{limits.max_input_tokens}, maxSeqLen {limits.max_seq_tokens}, {limits.prompt_overhead_tokens} "
            f"special tokens per prompt), e.g. {first.request_id}: prompt {first.prompt_tokens}, output "
            f"{first.max_tokens}; cap the trace's lengths at the fleet's limits"
        )


def prompt_text(request_id: str, num_tokens: int) -> str:
    """Deterministic ASCII text of exactly ``num_tokens`` bytes (tokens for a byte tokenizer)."""
    seed = sum((i + 1) * ord(c) for i, c in enumerate(request_id))
    words: list[str] = []
    size = 0
    state = seed
    while size <= num_tokens:
        state = (state * 1_103_515_245 + 12_345) % 2**31  # a small LCG: same id, same text
        word = _WORDS[(state >> 8) % len(_WORDS)]
        words.append(word)
        size += len(word) + 1
    return " ".join(words)[:num_tokens]


def offered_load(trace: Sequence[TraceRequest]) -> dict[str, float]:
    """Summary figures of a trace (request rate, token means, distinct adapters)."""
    if not trace:
        return {"requests": 0, "duration_s": 0.0, "rate_per_s": 0.0}
    duration = max(trace[-1].t_s, 1e-9)
    return {
        "requests": len(trace),
        "duration_s": duration,
        "rate_per_s": len(trace) / duration,
        "mean_prompt_tokens": float(np.mean([r.prompt_tokens for r in trace])),
        "mean_max_tokens": float(np.mean([r.max_tokens for r in trace])),
        "distinct_adapters": len({r.adapter for r in trace}),
    }


# -- files --------------------------------------------------------------------------------------------
def write_jsonl(trace: Iterable[TraceRequest], path: Path, *, with_text: bool = False) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", encoding="utf-8") as out:
        for request in trace:
            row = dataclasses.asdict(request)
            if not request.blocks:
                del row["blocks"]
            if with_text:
                row["prompt"] = prompt_text(request.request_id, request.prompt_tokens)
            out.write(json.dumps(row, separators=(",", ":")) + "\n")


def read_jsonl(path: Path) -> list[TraceRequest]:
    trace = []
    with path.open(encoding="utf-8") as source:
        for line in source:
            if line.strip():
                row = json.loads(line)
                trace.append(
                    TraceRequest(
                        t_s=float(row["t_s"]),
                        request_id=str(row["request_id"]),
                        adapter=str(row["adapter"]),
                        prompt_tokens=int(row["prompt_tokens"]),
                        max_tokens=int(row["max_tokens"]),
                    )
                )
    return trace


def spec_to_dict(spec: TraceSpec) -> dict[str, object]:
    return dataclasses.asdict(spec)


def spec_from_dict(data: dict[str, object]) -> TraceSpec:
    fields = dict(data)
    for key in ("prompt", "output"):
        if isinstance(fields.get(key), dict):
            fields[key] = LengthSpec(**fields[key])  # type: ignore[arg-type]
    return TraceSpec(**fields)  # type: ignore[arg-type]


def write_trace(spec: TraceSpec, out_dir: Path, *, with_text: bool = False) -> Path:
    path = out_dir / f"{spec.name}.jsonl"
    trace = generate(spec)
    write_jsonl(trace, path, with_text=with_text)
    meta = {"spec": spec_to_dict(spec), "summary": offered_load(trace)}
    path.with_suffix(".meta.json").write_text(json.dumps(meta, indent=2) + "\n", encoding="utf-8")
    return path


# -- the standard set ---------------------------------------------------------------------------------
def standard_specs(
    *, num_requests: int = 20_000, rate_per_s: float = 100.0, seed: int = 0
) -> list[TraceSpec]:
    """The grid: N in (50, 200, 1000) x alpha in (0.8, 1.0, 1.2), Poisson; bursty and shifted variants
    at N=200, alpha=1.0; and the GIE regression shape."""
    specs = [
        TraceSpec(
            name=f"zipf-n{n}-a{alpha:.1f}",
            num_adapters=n,
            zipf_alpha=alpha,
            rate_per_s=rate_per_s,
            num_requests=num_requests,
            seed=seed,
        )
        for n in (50, 200, 1000)
        for alpha in (0.8, 1.0, 1.2)
    ]
    base = TraceSpec(name="", num_adapters=200, rate_per_s=rate_per_s, num_requests=num_requests, seed=seed)
    specs.append(dataclasses.replace(base, name="onoff-n200-a1.0", arrivals="onoff"))
    specs.append(dataclasses.replace(base, name="shift-n200-a1.0", shift_at_fraction=0.5))
    specs.append(
        TraceSpec(
            name="gie-regression",
            num_adapters=len(GIE_REGRESSION_SPLIT),
            popularity="gie-regression",
            rate_per_s=rate_per_s,
            num_requests=num_requests,
            seed=seed,
        )
    )
    return specs


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.traces", description=__doc__.split("\n")[0])
    parser.add_argument("--out", type=Path, required=True, help="directory for <name>.jsonl + .meta.json")
    parser.add_argument("--requests", type=int, default=20_000)
    parser.add_argument("--rate", type=float, default=100.0, help="mean requests per second")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--with-text", action="store_true", help="add deterministic prompt text")
    args = parser.parse_args(argv)
    for spec in standard_specs(num_requests=args.requests, rate_per_s=args.rate, seed=args.seed):
        path = write_trace(spec, args.out, with_text=args.with_text)
        summary = offered_load(read_jsonl(path))
        print(
            f"{path}: {summary['requests']} requests over {summary['duration_s']:.1f} s, "
            f"{summary['distinct_adapters']} adapters"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

