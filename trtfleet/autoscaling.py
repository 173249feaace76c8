"""The autoscaling decision (pure): demand signals + ``spec.autoscaling`` + recent history -> replicas.

Shared by the operator (which writes ``spec.serving.replicas``) and ``trtfleet demo`` (which starts and
stops worker processes); no I/O and no clock of its own: ``now_s`` (seconds on any clock that the history
uses too) is passed in.

**Raw recommendation** (pods the signals ask for now; 0 only when there is no demand at all), the
largest of:

* requests: ``ceil(requests / targetRequestsPerPod)``, where requests is the larger of what the routers
  count (in flight, waiting for capacity, held for a pod) and what the pods count (running + queued):
  both see the same requests, from two sides, so they are not added;
* KV cache: ``ceil(ready_pods * kv_fraction / targetKvCacheFraction)`` (when the pods report it);
* adapter working set: ``ceil(active_adapter_pages / lora_pages_per_pod)``: enough pods that the LoRA
  cache pages the adapters in flight need at once fit in the pods' device tiers. The routers report
  those pages demand-weighted (:func:`working_set_pages`), not the pages of every adapter seen in the
  window: with thousands of adapters most are seen once a minute and need no page most of the time.

**Stabilisation** (as Kubernetes' HPA ``behavior``): a scale-up goes to the *lowest* recommendation of
the ``scaleUpStabilizationSeconds`` window (0: at once), a scale-down to the *highest* of the
``scaleDownStabilizationSeconds`` window, so a noisy signal never flaps the fleet. Time the history does
not cover (the first minutes) counts as the current replica count: nothing shrinks before a whole
window was seen.

**Zero.** Scale to zero (``minReplicas: 0``) only after the raw recommendation was 0 for
``scaleToZeroAfterSeconds``; until then at least one pod stays. From zero, any demand (a request held by
a router) scales up at once, whatever the up window says.

The history is a list of *changes* of the raw recommendation, ``(time_s, replicas)``, oldest first;
:func:`decide` returns it updated and pruned to what the windows need (at most ``HISTORY_MAX`` entries:
beyond, the two oldest merge into one with the larger count, which can only delay a scale-down).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Final

from trtfleet.api.autoscaling import AutoscalingSpec

HISTORY_MAX: Final = 256


class ScaleReason(StrEnum):
    """Why the decision came out as it did (the ``ScalingActive`` condition's reason)."""

    SCALED_UP = "ScaledUp"
    SCALED_DOWN = "ScaledDown"
    SCALED_TO_ZERO = "ScaledToZero"
    SCALED_FROM_ZERO = "ScaledFromZero"
    STEADY = "Steady"
    DOWNSCALE_STABILIZED = "ScaleDownStabilized"
    UPSCALE_STABILIZED = "ScaleUpStabilized"
    LIMITED = "ScalingLimited"
    NO_SIGNALS = "SignalsUnavailable"


CHANGES: Final = frozenset(
    {ScaleReason.SCALED_UP, ScaleReason.SCALED_DOWN, ScaleReason.SCALED_TO_ZERO, ScaleReason.SCALED_FROM_ZERO}
)


@dataclass(frozen=True, slots=True)
class DemandSignals:
    """One reading of demand for a base model, summed over router replicas and serving pods."""

    router_requests: float = 0.0
    """In the routers: at a pod, waiting for LoRA cache capacity, or held for want of a ready pod."""
    held_requests: float = 0.0
    """Of ``router_requests``, held for want of a ready pod (scale-from-zero demand)."""
    pod_requests: float = 0.0
    """In the pods: running plus queued (Triton's request metrics, trtllm-serve's iteration stats), as the
    routers scraped them."""
    kv_cache_fraction: float | None = None
    """Mean fraction of KV-cache blocks in use over the pods that reported it."""
    active_adapter_pages: int | None = None
    """LoRA cache pages the adapters in flight need at once (:func:`working_set_pages`), summed over routers."""
    ready_pods: int = 0

    @property
    def requests(self) -> float:
        return max(self.router_requests, self.pod_requests)

    @property
    def any_demand(self) -> bool:
        return self.requests > 0 or self.held_requests > 0 or bool(self.active_adapter_pages)


@dataclass(frozen=True, slots=True)
class Recommended:
    time_s: float
    replicas: int


@dataclass(frozen=True, slots=True)
class ScaleDecision:
    replicas: int
    reason: ScaleReason
    message: str
    raw: int | None
    """The raw recommendation (None without signals)."""
    history: tuple[Recommended, ...]

    @property
    def changed(self) -> bool:
        return self.reason in CHANGES


def working_set_pages(demand: Iterable[tuple[int, int]], in_flight: float) -> int:
    """Expected LoRA cache pages of the distinct adapters among ``in_flight`` requests (pure).

    ``demand`` is ``(requests in the window, pages)`` per adapter. With the in-flight requests drawn from
    the window's mix (a Poisson count per adapter, mean ``in_flight * share``), adapter ``a`` is in
    flight with probability ``1 - exp(-in_flight * requests_a / total)``: a hot adapter counts its
    pages whole, one seen once among thousands a small fraction. Rounded up; 0 with nothing in flight.
    """
    entries = [(count, pages) for count, pages in demand if count > 0 and pages > 0]
    total = sum(count for count, _ in entries)
    if total == 0 or in_flight <= 0:
        return 0
    expected = sum(pages * -math.expm1(-in_flight * count / total) for count, pages in entries)
    return math.ceil(expected - 1e-9)


def recommend(spec: AutoscalingSpec, signals: DemandSignals, lora_pages_per_pod: int | None) -> tuple[int, str]:
    """The raw recommendation and which signal drove it."""
    by: list[tuple[int, str]] = [
        (math.ceil(signals.requests / spec.target_requests_per_pod), f"{signals.requests:g} request(s)"),
    ]
    if signals.held_requests > 0:
        by.append((1, f"{signals.held_requests:g} held request(s)"))
    if spec.target_kv_cache_fraction is not None and signals.kv_cache_fraction is not None and signals.ready_pods:
        pods = math.ceil(signals.ready_pods * signals.kv_cache_fraction / spec.target_kv_cache_fraction - 1e-9)
        by.append((pods, f"KV cache {signals.kv_cache_fraction:.0%} used on {signals.ready_pods} pod(s)"))
    if spec.adapter_working_set and signals.active_adapter_pages and lora_pages_per_pod:
        pods = math.ceil(signals.active_adapter_pages / lora_pages_per_pod)
        by.append((pods, f"{signals.active_adapter_pages} LoRA page(s) of active adapters"))
    replicas, why = max(by, key=lambda item: item[0])
    return replicas, why


def _record(history: Sequence[Recommended], now_s: float, raw: int, keep_s: float) -> tuple[Recommended, ...]:
    kept = list(history)
    if not kept or kept[-1].replicas != raw:
        kept.append(Recommended(now_s, raw))
    horizon = now_s - keep_s
    while len(kept) > 1 and kept[1].time_s <= horizon:  # kept[0] stays while it is in effect at the horizon
        kept.pop(0)
    while len(kept) > HISTORY_MAX:
        kept[0:2] = [Recommended(kept[0].time_s, max(kept[0].replicas, kept[1].replicas))]
    return tuple(kept)


def _window(history: Sequence[Recommended], now_s: float, window_s: float, unknown: int) -> list[int]:
    """The recommendations in effect during ``[now - window, now]``; ``unknown`` for time before the history."""
    start = now_s - window_s
    values = [h.replicas for h in history if h.time_s > start]
    before = [h for h in history if h.time_s <= start]
    values.append(before[-1].replicas if before else unknown)
    return values


def _zero_for_s(history: Sequence[Recommended], now_s: float) -> float:
    """How long the raw recommendation has been 0 (0 when it is not)."""
    if not history or history[-1].replicas != 0:
        return 0.0
    return now_s - history[-1].time_s


def decide(
    spec: AutoscalingSpec,
    signals: DemandSignals | None,
    history: Sequence[Recommended],
    current: int,
    now_s: float,
    *,
    lora_pages_per_pod: int | None = None,
) -> ScaleDecision:
    """Replicas for the next interval, with the reason and the updated history (see the module docstring)."""
    low, high = spec.min_replicas, spec.max_replicas
    if signals is None:
        bounded = min(max(current, low), high)
        message = f"no router or pod metrics could be read: keeping {bounded} pod(s)"
        reason = ScaleReason.NO_SIGNALS if bounded == current else _direction(current, bounded)
        return ScaleDecision(bounded, reason, message, None, tuple(history))
    raw, why = recommend(spec, signals, lora_pages_per_pod)
    keep_s = max(spec.scale_up_stabilization_seconds, spec.scale_down_stabilization_seconds,
                 spec.scale_to_zero_after_seconds)
    history = _record(history, now_s, raw, keep_s)
    if current == 0 and signals.any_demand:
        target = min(max(raw, 1, low), high)
        return ScaleDecision(target, ScaleReason.SCALED_FROM_ZERO, f"{why}: 0 -> {target} pod(s)", raw, history)
    reason = ScaleReason.STEADY
    if raw > current:
        target = max(current, min(_window(history, now_s, spec.scale_up_stabilization_seconds, current)))
        reason = ScaleReason.UPSCALE_STABILIZED if target < raw else reason
    elif raw < current:
        target = min(current, max(_window(history, now_s, spec.scale_down_stabilization_seconds, current)))
        reason = ScaleReason.DOWNSCALE_STABILIZED if target > raw else reason
    else:
        target = current
    if target == 0 and _zero_for_s(history, now_s) < spec.scale_to_zero_after_seconds:
        target = 1 if current > 0 else 0
        reason = ScaleReason.DOWNSCALE_STABILIZED if current > 0 else reason
    bounded = min(max(target, low), high)
    if bounded != target:
        reason = ScaleReason.LIMITED
    if bounded != current:
        reason = _direction(current, bounded)
    message = f"{why} -> {raw} pod(s) recommended; {current} -> {bounded} pod(s) (between {low} and {high})"
    return ScaleDecision(bounded, reason, message, raw, history)


def _direction(current: int, target: int) -> ScaleReason:
    if target == 0:
        return ScaleReason.SCALED_TO_ZERO
    if current == 0:
        return ScaleReason.SCALED_FROM_ZERO
    return ScaleReason.SCALED_UP if target > current else ScaleReason.SCALED_DOWN
