"""The policy framework: filters -> weighted scorers -> a picker (the registry is ``policies/__init__.py``).

Modelled on the Gateway API Inference Extension's endpoint picker: a :class:`Filter` narrows the
candidate pods, each :class:`Scorer` gives every remaining pod a score in [0, 1], a
:class:`Profile` sums the scores with their weights, and a :class:`Picker` chooses one pod.
Policies whose decision is a procedure rather than a weighted sum (``ttft-cost``) implement the
:class:`Policy` protocol directly and reuse the same pieces.

A policy only chooses the pod. Whether weights are sent is not its call: the
:class:`~trtfleet_router.routing.fleet.Fleet` sends them exactly when the pod's shadow cache does
not hold the adapter, for every policy.

Candidates are given as indices into ``ctx.pods`` (ready pods the request does not exclude, in a
stable order); ``ctx.loads[i]`` is pod ``i``'s load (see :mod:`~trtfleet_router.routing.load`).
"""

from __future__ import annotations

import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol

from trtfleet_router.routing.hashing import RendezvousRankings
from trtfleet_router.routing.load import AdapterDemand, PodLoad
from trtfleet_router.routing.placement import EMPTY_PLAN, PlacementPlan
from trtfleet_router.routing.prefixindex import PrefixIndex
from trtfleet_router.routing.residency import PodResidency, Residency
from trtfleet_router.routing.types import NoCapacity, RouteRequest


class PodView(Protocol):
    """What a policy may read about a pod (the fleet's pod state; never modify it)."""

    @property
    def pod_id(self) -> str: ...
    @property
    def ready(self) -> bool: ...
    @property
    def load(self) -> PodLoad: ...
    @property
    def residency(self) -> PodResidency: ...
    @property
    def cache_full_until_s(self) -> float: ...


class RoutingContext:
    """Everything one decision may look at. Built per request by the fleet; read-only."""

    __slots__ = (
        "_matches",
        "by_id",
        "demand",
        "loads",
        "now_s",
        "placement",
        "pods",
        "prefix",
        "rankings",
        "request",
        "residency",
        "rng",
    )

    def __init__(
        self,
        *,
        request: RouteRequest,
        now_s: float,
        pods: Sequence[PodView],
        loads: Sequence[int],
        by_id: Mapping[str, PodView],
        residency: Residency,
        demand: AdapterDemand,
        rankings: RendezvousRankings,
        rng: random.Random,
        prefix: PrefixIndex | None = None,
        placement: PlacementPlan = EMPTY_PLAN,
    ) -> None:
        self.request = request
        self.now_s = now_s
        self.pods = pods  # candidates: ready, not excluded, in the fleet's (sorted) order
        self.loads = loads  # load of each candidate, aligned with pods
        self.by_id = by_id  # every pod of the fleet, candidate or not
        self.residency = residency
        self.demand = demand
        self.rankings = rankings
        self.rng = rng
        self.prefix = prefix if prefix is not None else PrefixIndex(0)
        self.placement = placement  # where the fleet plans host copies of each adapter (routing/placement.py)
        self._matches: dict[str, int] | None = None

    def prefix_matches(self) -> dict[str, int]:
        """Pod id -> leading blocks of the request it holds (computed once per decision, O(request blocks))."""
        if self._matches is None:
            self._matches = self.prefix.match(self.request.blocks.hashes)
        return self._matches

    def load(self, pod: PodView) -> int:
        """``pod``'s load as this request compares it: an interactive request leaves batch lines out
        (:mod:`~trtfleet_router.routing.load`); ``loads`` holds the same for the candidates."""
        if self.request.background:
            return pod.load.load(self.now_s)
        return pod.load.foreground(self.now_s)

    def is_candidate(self, pod: PodView) -> bool:
        return pod.ready and pod.pod_id not in self.request.exclude_pods


@dataclass(frozen=True, slots=True)
class Choice:
    pod: PodView
    reason: str


class Filter(Protocol):
    name: str

    def filter(self, ctx: RoutingContext, candidates: list[int]) -> list[int]: ...


class Scorer(Protocol):
    name: str

    def score(self, ctx: RoutingContext, candidates: list[int]) -> list[float]:
        """One score in [0, 1] per candidate, higher is better."""
        ...


class Picker(Protocol):
    name: str

    def pick(self, ctx: RoutingContext, candidates: list[int], scores: list[float]) -> int:
        """The chosen position in ``candidates``."""
        ...


class Policy(Protocol):
    @property
    def name(self) -> str: ...

    def choose(self, ctx: RoutingContext) -> Choice:
        """Pick a pod among ``ctx.pods`` (never empty). May raise NoCapacity."""
        ...

    def pods_changed(self, pod_ids: Sequence[str]) -> None:
        """The fleet's pod set changed (sorted ids, ready or not)."""
        ...

    # Optional: ``uses_prefix = True`` on a policy that reads ``ctx.request.blocks`` or ``ctx.prefix_matches()``;
    # the fleet then books the request's blocks in the prefix index and the peer events. Without it no prompt
    # is hashed (the front ends hand lazy blocks) and the index holds only what peers and KV events report.


@dataclass(frozen=True, slots=True)
class WeightedScorer:
    scorer: Scorer
    weight: float


class Profile:
    """A policy made of filters, weighted scorers and one picker."""

    __slots__ = ("_filters", "_name", "_picker", "_retry_after_s", "_scorers", "uses_prefix")

    def __init__(
        self,
        name: str,
        *,
        picker: Picker,
        filters: Sequence[Filter] = (),
        scorers: Sequence[WeightedScorer] = (),
        retry_after_s: float = 1.0,
        uses_prefix: bool = False,
    ) -> None:
        self._name = name
        self.uses_prefix = uses_prefix  # reads the request's KV blocks (the fleet hashes prompts for it)
        self._filters = tuple(filters)
        self._scorers = tuple(scorers)
        self._picker = picker
        self._retry_after_s = retry_after_s

    @property
    def name(self) -> str:
        return self._name

    def pods_changed(self, pod_ids: Sequence[str]) -> None:
        for part in (*self._filters, *(ws.scorer for ws in self._scorers), self._picker):
            hook = getattr(part, "pods_changed", None)
            if hook is not None:
                hook(pod_ids)

    def choose(self, ctx: RoutingContext) -> Choice:
        candidates = list(range(len(ctx.pods)))
        for step in self._filters:
            candidates = step.filter(ctx, candidates)
            if not candidates:
                raise NoCapacity(f"filter {step.name} left no pod", self._retry_after_s)
        totals = [0.0] * len(candidates)
        for weighted in self._scorers:
            if weighted.weight == 0:
                continue
            scores = weighted.scorer.score(ctx, candidates)
            weight = weighted.weight
            totals = [total + weight * score for total, score in zip(totals, scores, strict=True)]
        position = self._picker.pick(ctx, candidates, totals)
        return Choice(ctx.pods[candidates[position]], self._picker.name)


# -- shared pieces ----------------------------------------------------------------------------------


def min_max_inverse(values: Sequence[float]) -> list[float]:
    """Scores in [0, 1]: 1 for the smallest value, 0 for the largest, 1 for all when they are equal."""
    low, high = min(values), max(values)
    if high == low:
        return [1.0] * len(values)
    span = high - low
    return [(high - value) / span for value in values]


class LeastLoadScorer:
    """Score ``(max - load) / (max - min)`` over the candidates' loads (all equal: 1)."""

    name = "least-load"

    def score(self, ctx: RoutingContext, candidates: list[int]) -> list[float]:
        loads = ctx.loads
        return min_max_inverse([loads[i] for i in candidates])


SCORE_TIE_TOLERANCE = 1e-12  # float sums of equal scores may differ in the last bits


class MaxScorePicker:
    """The highest total score; ties broken uniformly at random with the injected rng."""

    name = "max-score"

    def pick(self, ctx: RoutingContext, candidates: list[int], scores: list[float]) -> int:
        best = max(scores)
        tied = [position for position, score in enumerate(scores) if score >= best - SCORE_TIE_TOLERANCE]
        return tied[0] if len(tied) == 1 else tied[ctx.rng.randrange(len(tied))]


def least_loaded(ctx: RoutingContext) -> PodView:
    """The candidate with the smallest load, ties at random (for policies' base-model requests)."""
    loads = ctx.loads
    low = min(loads)
    tied = [i for i, load in enumerate(loads) if load == low]
    return ctx.pods[tied[0] if len(tied) == 1 else tied[ctx.rng.randrange(len(tied))]]
