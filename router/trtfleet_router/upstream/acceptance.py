"""Speculative decoding and bandwidth use as a pod reports them: parsed counters, and per pod what they mean now.

What the pods say (pure parsers, read by :mod:`.scrape`):

* trtllm-serve's JSON ``/metrics`` entries carry ``specDecodingStats {numDraftTokens, numAcceptedTokens,
  numRequestsWithDraftTokens}`` when the pod speculates: each entry one iteration upstream (the reference engine's
  one interval), so the counts since the last scrape are their sums; ``iter`` counts iterations. The reference
  engine adds its cumulative counts per LoRA id (``trtfleetReferenceSpecDecodingByAdapter``); upstream says
  nothing per adapter.
* A Triton pod's metrics text has no speculative family upstream; the reference engine's own
  ``trtfleet_reference_spec_decode_metrics{spec_decode_type=draft_tokens|accepted_tokens|draft_steps}`` and
  ``..._adapter_metrics{lora_task_id, ...}`` are cumulative; ``nv_trt_llm_general_metrics{general_type=
  "iteration_counter"}`` counts iterations.

:class:`PodSpeculation` turns consecutive samples of one pod into the numbers the router exports and prices
with: the acceptance rate (accepted / drafted draft tokens) and tokens per step of a request that drafted
(``1 + accepted / steps with drafts``) over the last interval that drafted anything, per adapter too; decode
steps per second; and model bandwidth utilisation, ``(weight bytes + KV bytes in use) x steps per second / peak
bandwidth``: every step reads the weights and the KV cache of the requests in the batch once.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

SPEC_FAMILY = "trtfleet_reference_spec_decode_metrics"
SPEC_ADAPTER_FAMILY = "trtfleet_reference_spec_decode_adapter_metrics"
ITERATION_FAMILY = "nv_trt_llm_general_metrics"


@dataclass(frozen=True, slots=True)
class SpecSample:
    """Speculation counts of one scrape: cumulative (Triton text), or since the last scrape (JSON entries)."""

    drafted: int
    accepted: int
    steps: int
    cumulative: bool
    by_adapter: tuple[tuple[int, int, int], ...] = ()
    """Cumulative (LoRA id, 0 for the base model; drafted; accepted), where the pod says it."""


def _number(value: object) -> float | None:
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else None


def spec_from_trtllm_serve(entries: Sequence[Mapping[str, object]]) -> SpecSample | None:
    """The ``specDecodingStats`` of JSON iteration entries, summed (None: the pod does not speculate)."""
    drafted = accepted = steps = 0
    seen = False
    by_adapter: tuple[tuple[int, int, int], ...] = ()
    for entry in entries:
        stats = entry.get("specDecodingStats")
        if not isinstance(stats, Mapping):
            continue
        seen = True
        drafted += int(_number(stats.get("numDraftTokens")) or 0)
        accepted += int(_number(stats.get("numAcceptedTokens")) or 0)
        steps += int(_number(stats.get("numRequestsWithDraftTokens")) or 0)
        adapters = entry.get("trtfleetReferenceSpecDecodingByAdapter")
        if isinstance(adapters, list):
            by_adapter = tuple(
                (int(_number(a.get("loraId")) or 0), int(_number(a.get("numDraftTokens")) or 0),
                 int(_number(a.get("numAcceptedTokens")) or 0))
                for a in adapters if isinstance(a, Mapping)
            )
    return SpecSample(drafted, accepted, steps, False, by_adapter) if seen else None


def iterations_from_trtllm_serve(entries: Sequence[Mapping[str, object]]) -> int | None:
    """The newest entry's ``iter`` (iterations since the server started)."""
    for entry in reversed(entries):
        value = _number(entry.get("iter"))
        if value is not None:
            return int(value)
    return None


@dataclass
class TritonSpecLines:
    """Accumulates the speculative lines of a Triton metrics text (fed line by line by the scrape parser)."""

    totals: dict[str, float] = field(default_factory=dict)
    adapters: dict[int, dict[str, float]] = field(default_factory=dict)
    iterations: int | None = None

    def feed(self, name: str, labels: Mapping[str, str], value: float) -> None:
        kind = labels.get("spec_decode_type", "")
        if name == SPEC_FAMILY:
            self.totals[kind] = self.totals.get(kind, 0.0) + value
        elif name == SPEC_ADAPTER_FAMILY:
            try:
                task = int(labels.get("lora_task_id", ""))
            except ValueError:
                return
            per = self.adapters.setdefault(task, {})
            per[kind] = per.get(kind, 0.0) + value
        elif name == ITERATION_FAMILY and labels.get("general_type") == "iteration_counter":
            self.iterations = (self.iterations or 0) + int(value)

    def sample(self) -> SpecSample | None:
        if "draft_tokens" not in self.totals:
            return None
        by_adapter = tuple(sorted((task, int(v.get("draft_tokens", 0)), int(v.get("accepted_tokens", 0)))
                                  for task, v in self.adapters.items()))
        return SpecSample(int(self.totals["draft_tokens"]), int(self.totals.get("accepted_tokens", 0)),
                          int(self.totals.get("draft_steps", 0)), True, by_adapter)


@dataclass(frozen=True, slots=True)
class Acceptance:
    acceptance_rate: float
    tokens_per_step: float


def _acceptance(drafted: int, accepted: int, steps: int) -> Acceptance | None:
    if drafted <= 0:
        return None
    per_step = 1.0 + accepted / steps if steps > 0 else math.nan
    return Acceptance(accepted / drafted, per_step)


@dataclass
class PodSpeculation:
    """One pod's speculation and bandwidth figures, from its consecutive scrapes (not thread-safe; pure)."""

    total: tuple[int, int, int] = (0, 0, 0)
    """Cumulative drafted, accepted, steps with drafts (JSON deltas are added up)."""
    adapters: dict[int, tuple[int, int]] = field(default_factory=dict)
    current: Acceptance | None = None
    by_adapter: dict[int, Acceptance] = field(default_factory=dict)
    steps_per_s: float | None = None
    _iterations: tuple[float, int] | None = None

    def observe(self, sample: SpecSample | None, iterations: int | None, now_s: float) -> tuple[int, int]:
        """Fold one scrape in; returns the (drafted, accepted) tokens it added (for the router's counters)."""
        if iterations is not None:
            if self._iterations is not None and now_s > self._iterations[0] and iterations >= self._iterations[1]:
                self.steps_per_s = (iterations - self._iterations[1]) / (now_s - self._iterations[0])
            self._iterations = (now_s, iterations)
        if sample is None:
            return (0, 0)
        before = self.total
        if sample.cumulative:
            now = (sample.drafted, sample.accepted, sample.steps)
            if now[0] < before[0]:
                before = (0, 0, 0)  # the pod restarted
        else:
            now = (before[0] + sample.drafted, before[1] + sample.accepted, before[2] + sample.steps)
        self.total = now
        found = _acceptance(now[0] - before[0], now[1] - before[1], now[2] - before[2])
        if found is not None:
            self.current = found if not math.isnan(found.tokens_per_step) else Acceptance(
                found.acceptance_rate, self.current.tokens_per_step if self.current else math.nan)
        for task, drafted, accepted in sample.by_adapter:
            old = self.adapters.get(task, (0, 0))
            if drafted < old[0]:
                old = (0, 0)
            if drafted > old[0]:
                self.by_adapter[task] = Acceptance((accepted - old[1]) / (drafted - old[0]), math.nan)
            self.adapters[task] = (drafted, accepted)
        return (now[0] - before[0], now[1] - before[1])

    def bandwidth_utilization(self, weights_bytes: int, kv_bytes_per_token: int, kv_tokens_in_use: int | None,
                              peak_bytes_per_s: float) -> float | None:
        """MBU: bytes one step reads (weights + the KV cache in use) x steps per second / peak bandwidth."""
        if self.steps_per_s is None or peak_bytes_per_s <= 0 or weights_bytes <= 0:
            return None
        read = weights_bytes + kv_bytes_per_token * (kv_tokens_in_use or 0)
        return read * self.steps_per_s / peak_bytes_per_s
