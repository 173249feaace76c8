"""Merge or hot-swap, per adapter (pure): a rate reading + what the last readings left -> advice.

Units: a pod is the unit of cost (one serving pod of the BaseModel, whatever GPUs it holds). An adapter with
smoothed request rate ``r`` on a BaseModel whose pod sustains ``C`` requests/s keeps ``f = r / C`` of a pod
busy. Hot-swapped it costs ``f * (1 + o)`` pods of the shared pool, ``o`` the LoRA step overhead (its
tokens run the LoRA matmuls; cold loads come on top); merged it costs ``max(1, ceil(f))`` pods of its own,
with neither. Merging pays for itself outright once ``f * (1 + o) >= ceil(f)``; below that it buys lower
latency (no LoRA step time, no cold load) for ``ceil(f) - f * (1 + o)`` pods of idle headroom. The policy
is a band on ``f``: suggest merged once ``f >= merge_above`` has held for ``sustain_s``, dynamic again once
``f < unmerge_below`` has held as long; in between nothing changes (hysteresis). The rate is an
exponentially weighted moving average with half-life ``sustain_s / 4``, so one busy minute is not a
sustained share. Derivation and numbers: docs/concepts.md, "When to merge, when to hot-swap".

Speculative decoding (:func:`speculation_after_merge`): a merged Adapter's pods serve with the BaseModel's
``spec.speculative`` and LoRA off. Merging changes no shape, so every draft still loads; whether it still
*fits* is its acceptance on the merged model, which the advice says when it suggests merging.

No clock of its own: times are seconds since the epoch, passed in.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from enum import StrEnum

from trtfleet.api.merging import Suggestion
from trtfleet.api.speculative import MODEL_FREE_MODES, SpeculativeMode, SpeculativeSpec

HALF_LIFE_PER_SUSTAIN = 0.25
"""EWMA half-life as a fraction of the sustain window: after one window a step is 94 % through."""


class Reason(StrEnum):
    MERGE_PAYS = "MergePays"
    SHARED_POOL_CHEAPER = "SharedPoolCheaper"
    CROSSING = "Crossing"
    NO_DEMAND_SIGNAL = "NoDemandSignal"
    NO_POD_CAPACITY = "NoPodCapacity"
    INSUFFICIENT_DATA = "InsufficientData"


@dataclass(frozen=True, slots=True)
class Costs:
    """The BaseModel's side (``spec.merging``)."""

    pod_requests_per_s: float | None
    lora_step_overhead: float = 0.08
    merge_above: float = 0.5
    unmerge_below: float = 0.25
    sustain_s: float = 1800.0
    speculation: str | None = None
    """What merging does to the BaseModel's speculative decoding (:func:`speculation_after_merge`)."""


@dataclass(frozen=True, slots=True)
class Memory:
    """What the readings so far left (``status.merge``); the empty memory is the start."""

    rate_per_s: float | None = None
    sampled_at_s: float | None = None
    observing_since_s: float | None = None
    crossing_since_s: float | None = None
    decided: Suggestion | None = None


@dataclass(frozen=True, slots=True)
class Advice:
    suggestion: Suggestion
    reason: Reason
    message: str
    memory: Memory
    pod_fraction: float | None


def smooth(
    previous: float | None, previous_at_s: float | None, sample: float, now_s: float, half_life_s: float
) -> float:
    """EWMA over irregular readings: the old value's weight halves every ``half_life_s``."""
    if previous is None or previous_at_s is None or half_life_s <= 0:
        return sample
    weight: float = math.pow(0.5, max(now_s - previous_at_s, 0.0) / half_life_s)
    return weight * previous + (1.0 - weight) * sample


def _minutes(seconds: float) -> str:
    return f"{seconds / 60:.0f} min" if seconds >= 60 else f"{seconds:.0f} s"


def economics(fraction: float, overhead: float) -> str:
    """The pods each way, in words (the reason string's numbers)."""
    shared = fraction * (1.0 + overhead)
    merged = max(1, math.ceil(fraction - 1e-9))
    net = merged - shared
    verdict = f"+{net:.2f} pod of headroom" if net > 0 else f"saves {-net:.2f} pod"
    return (
        f"hot-swapped it costs {shared:.2f} pod ({fraction:.2f} + {overhead:.0%} LoRA step overhead), merged "
        f"{merged} pod ({verdict}, no LoRA step time or cold loads on its requests)"
    )


def speculation_after_merge(speculative: SpeculativeSpec | None) -> str | None:
    """What a merged Deployment keeps of ``speculative`` (None: no speculation), in words for the advice.

    Upstream takes a ``speculative_config`` with any checkpoint, and a merged checkpoint runs without LoRA, so
    the LoRA x speculation caveats (untested combinations, drafts that never see the adapter) do not apply to
    it. What can break is acceptance: a draft trained on the base model proposes the base's tokens.
    """
    if speculative is None:
        return None
    mode = speculative.mode
    if mode in MODEL_FREE_MODES:
        return (f"speculation kept: {mode.value} drafts from the request's own text, so it fits the merged model "
                "as it fits the base")
    if mode is SpeculativeMode.MTP and speculative.draft is None:
        return ("speculation kept with the checkpoint's MTP layers, which merging leaves as trained on the base: "
                "watch the merged fleet's acceptance")
    return (f"speculation kept: the {mode.value} draft loads on the merged model (merging changes no shape) and "
            "runs without LoRA, but it was trained on the base model's outputs, so its acceptance falls as far "
            "as the adapter moves them; watch the merged fleet's acceptance and drop spec.speculative there if it "
            "falls below what pays")


def decide(costs: Costs, memory: Memory, rate_per_s: float | None, now_s: float) -> Advice:
    """One reading (``rate_per_s`` None: no router answered) -> the advice and the memory to keep."""
    if rate_per_s is None:
        message = "no router answered with its demand view (GET /fleet/v1/demand on the peer port): nothing to weigh"
        return Advice(Suggestion.UNKNOWN, Reason.NO_DEMAND_SIGNAL, message, memory, None)
    sustain = max(costs.sustain_s, 0.0)
    rate = smooth(memory.rate_per_s, memory.sampled_at_s, max(rate_per_s, 0.0), now_s, sustain * HALF_LIFE_PER_SUSTAIN)
    since = memory.observing_since_s if memory.observing_since_s is not None else now_s
    state = replace(memory, rate_per_s=rate, sampled_at_s=now_s, observing_since_s=since)
    capacity = costs.pod_requests_per_s
    if capacity is None or capacity <= 0:
        message = (
            f"{rate:.3g} requests/s, but no pod capacity to weigh it against: set the BaseModel's "
            "spec.merging.podRequestsPerSecond (docs/concepts.md, 'When to merge, when to hot-swap')"
        )
        return Advice(Suggestion.UNKNOWN, Reason.NO_POD_CAPACITY, message, replace(state, crossing_since_s=None), None)
    fraction = rate / capacity
    share = f"{rate:.3g} requests/s, {fraction:.0%} of a pod ({capacity:.3g} requests/s)"
    base = memory.decided or Suggestion.DYNAMIC
    if base is Suggestion.DYNAMIC and fraction >= costs.merge_above:
        target: Suggestion | None = Suggestion.MERGED
    elif base is Suggestion.MERGED and fraction < costs.unmerge_below:
        target = Suggestion.DYNAMIC
    else:
        target = None
    crossing = (memory.crossing_since_s if memory.crossing_since_s is not None else now_s) if target else None
    if target is not None and crossing is not None and now_s - crossing >= sustain:
        base, crossing = target, None
    state = replace(state, crossing_since_s=crossing)
    if memory.decided is None and now_s - since < sustain and base is Suggestion.DYNAMIC:
        message = f"{share}; {_minutes(now_s - since)} of the {_minutes(sustain)} needed observed"
        return Advice(Suggestion.UNKNOWN, Reason.INSUFFICIENT_DATA, message, state, fraction)
    state = replace(state, decided=base)
    held = _minutes(now_s - crossing) if crossing is not None else ""
    if base is Suggestion.MERGED:
        if crossing is not None:
            why = f"below {costs.unmerge_below:.0%} for {held} of {_minutes(sustain)}; merged until then"
        else:
            why = (
                f"held {costs.merge_above:.0%} of a pod for {_minutes(sustain)}, merged until below "
                f"{costs.unmerge_below:.0%} as long"
            )
        message = f"sustained {share}: {why}; {economics(fraction, costs.lora_step_overhead)}"
        if costs.speculation is not None:
            message = f"{message}; {costs.speculation}"
        return Advice(Suggestion.MERGED, Reason.CROSSING if crossing else Reason.MERGE_PAYS, message, state, fraction)
    if crossing is not None:
        why = f"at or above {costs.merge_above:.0%} for {held} of {_minutes(sustain)}; dynamic until then"
    else:
        why = f"below the {costs.merge_above:.0%} of a pod that merging asks for"
    message = f"{share}: {why}; {economics(fraction, costs.lora_step_overhead)}"
    reason = Reason.CROSSING if crossing else Reason.SHARED_POOL_CHEAPER
    return Advice(Suggestion.DYNAMIC, reason, message, state, fraction)
