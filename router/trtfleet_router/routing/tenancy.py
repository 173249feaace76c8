"""Tenants, their weights and bands: the routing file's ``tenancy`` block, and who a request is and how important.

Example::

    tenancy:
      order: vtc                  # vtc (default) | fcfs | llmd-round-robin (comparison)
      saturation: {inflightPerPod: 8}   # requests wait in the router beyond this (0: never, the default)
                                        # reservedPerPod: 1 keeps each pod's last slot off a flooding request
      tenants:
        chat-product: {weight: 3, priority: critical}
        analytics:    {weight: 1, priority: sheddable}
        research:     {weight: 1, requestPriority: true}
      adapters: {llama3-sql-batch: sheddable}
      objectives: {premium: critical}  # InferenceObjective name -> band (else its spec.priority: > 0 critical,
                                       # 0 interactive, < 0 sheddable, read from Kubernetes with inferenceObjectives)

**Who.** The tenant is the API key's name (``--api-keys``); through the endpoint picker, the gateway's fairness
header (``x-llm-d-inference-fairness-id``) when it sends one; on the router's own front ends that header only with
``fairnessHeader: true`` (behind a gateway that sets it); else ``default``.

**How important** (:func:`classify`): the adapter's band, else the tenant's, else ``interactive``; a gateway's
``InferenceObjective`` replaces it; then the request's own trtllm-serve ``priority`` (a float in [0, 1]) may lower
it always and raise it only where the tenant has ``requestPriority: true``. Batch lines are always ``batch``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Final, Literal

from pydantic import Field, model_validator

from trtfleet.api.common import ApiModel
from trtfleet_router.routing.fairqueue import Priority, band_of_engine_priority, more_important
from trtfleet_router.routing.vtc import INPUT_COST_DEFAULT, MAX_TENANTS_DEFAULT, OUTPUT_COST_DEFAULT

DEFAULT_TENANT: Final = "default"
FAIRNESS_HEADERS: Final = ("x-llm-d-inference-fairness-id", "x-gateway-inference-fairness-id")
OBJECTIVE_HEADERS: Final = ("x-llm-d-inference-objective", "x-gateway-inference-objective")
"""A gateway's headers naming the tenant (fairness id) and the InferenceObjective: llm-d-router's names first, then
the older aliases gateways still send."""
ORDERS: Final = ("vtc", "fcfs", "llmd-round-robin")
TenantOrderName = Literal["vtc", "fcfs", "llmd-round-robin"]


class TenantSpec(ApiModel):
    weight: float = Field(default=1.0, gt=0, description="Share of a saturated fleet's tokens, relative to others'.")
    priority: Priority | None = Field(
        default=None, description="This tenant's band (unset: the adapter's, else interactive)."
    )
    request_priority: bool = Field(
        default=False,
        description="The request's own trtllm-serve `priority` may raise its band (lowering it is always allowed).",
    )


class SaturationConfig(ApiModel):
    """When a base model's fleet counts as saturated: requests then wait in the router, where they can be ordered."""

    detector: Literal["inflight", "llmd-utilization"] = Field(
        default="inflight",
        description="inflight: every ready pod holds inflightPerPod requests in flight (every replica's, and those "
        "let go to start; until then requests go to the pods below it). llmd-utilization: llm-d's utilization "
        "detector (mean over pods of max(waiting / queueDepthThreshold, KV use / kvCacheUtilThreshold) reaches 1), "
        "for comparison.",
    )
    inflight_per_pod: float = Field(
        default=0.0,
        ge=0,
        description="Requests in flight per ready pod beyond which requests wait in the router (0: they never wait "
        "for this reason; every request goes to a pod, which queues what its batch does not hold). Set it near the "
        "engine's maxBatchSize so queues form here, in band and fair order, not in the pods.",
    )
    reserved_per_pod: int = Field(
        default=0,
        ge=0,
        description="inflight: the last slots below inflightPerPod on each pod that only a request that is not "
        "flooding may take (see :func:`may_take_reserved`): a request of an over-share tenant, or of the sheddable "
        "or batch band, starts only on a pod below inflightPerPod - reservedPerPod, so a steady tenant's or a "
        "critical request finds a free slot without waiting for a running one to end (engines do not preempt). "
        "Not work-conserving: while its tenant counts as over its share, a flood leaves these slots idle. "
        "0 (the default): no reserve.",
    )
    queue_depth_threshold: int = Field(default=5, ge=1, description="llmd-utilization: waiting requests per pod.")
    kv_cache_util_threshold: float = Field(
        default=0.8, gt=0, le=1, description="llmd-utilization: KV-cache fraction per pod."
    )

    @model_validator(mode="after")
    def _reserve_below_limit(self) -> SaturationConfig:
        if self.reserved_per_pod and not self.reserved_per_pod < self.inflight_per_pod:
            raise ValueError(
                f"reservedPerPod ({self.reserved_per_pod}) must be below inflightPerPod ({self.inflight_per_pod:g}): "
                "the reserve is the last slots below that limit, so a flooding request keeps at least one; lower "
                "reservedPerPod or raise inflightPerPod"
            )
        if self.reserved_per_pod and self.detector != "inflight":
            raise ValueError("reservedPerPod needs the inflight detector (detector: inflight)")
        return self

    @property
    def enabled(self) -> bool:
        return self.detector == "llmd-utilization" or self.inflight_per_pod > 0

    @property
    def reserving(self) -> bool:
        """Whether pods keep reserved slots (the inflight detector with ``reservedPerPod`` above 0)."""
        return self.reserved_per_pod > 0 and self.inflight_per_pod > 0

    def limit(self, reserved: bool) -> float:
        """Requests in flight per pod below which a request starts: ``inflightPerPod``, less the reserve for a
        request that may not take it (``reserved``: it may)."""
        return self.inflight_per_pod if reserved else self.inflight_per_pod - self.reserved_per_pod


class TenancyConfig(ApiModel):
    order: TenantOrderName = Field(
        default="vtc",
        description="Order of tenants inside a band where requests wait: vtc (weighted fair sharing by tokens "
        "served, the Virtual Token Counter), fcfs (first come, first served) or llm-d's round robin (comparison).",
    )
    input_token_cost: float = Field(
        default=INPUT_COST_DEFAULT, ge=0, description="vtc: weighted tokens a prompt token costs its tenant."
    )
    output_token_cost: float = Field(
        default=OUTPUT_COST_DEFAULT, ge=0, description="vtc: weighted tokens an output token costs its tenant."
    )
    default_weight: float = Field(default=1.0, gt=0, description="Weight of a tenant not listed in tenants.")
    tenants: dict[str, TenantSpec] = Field(default_factory=dict, description="Per tenant name: weight and band.")
    adapters: dict[str, Priority] = Field(
        default_factory=dict, description="Per served adapter name: the band of its requests."
    )
    objectives: dict[str, Priority] = Field(
        default_factory=dict, description="Per InferenceObjective name (the gateway's objective header): a band."
    )
    inference_objectives: bool = Field(
        default=False,
        description="Read InferenceObjectives (llm-d.ai/v1alpha2) from Kubernetes where the CRD is installed and "
        "map their spec.priority: above 0 critical, 0 interactive, below 0 sheddable.",
    )
    fairness_header: bool = Field(
        default=False,
        description="Take the tenant from the x-llm-d-inference-fairness-id header on the router's own front ends "
        "(only behind a gateway that sets it; the endpoint picker always reads it).",
    )
    saturation: SaturationConfig = Field(default_factory=SaturationConfig, description="When requests wait here.")
    max_tenants: int = Field(
        default=MAX_TENANTS_DEFAULT, ge=2, description="Tenants whose counters a base model keeps (idle ones go first)."
    )

    def weights(self) -> dict[str, float]:
        return {name: spec.weight for name, spec in self.tenants.items()}


RESERVE_BANDS: Final = frozenset({Priority.CRITICAL, Priority.INTERACTIVE})
"""Bands whose requests may take a pod's reserved slots (``saturation.reservedPerPod``) when their tenant is not over
its share: sheddable and batch requests are what a reserve is kept from."""


def may_take_reserved(band: Priority, over_share: bool) -> bool:
    """Whether a request may take a reserved slot: it is not flooding, i.e. its band is critical or interactive and
    its tenant did not receive more than its weight's share of the tokens served lately beside other tenants
    (:meth:`ServedShares.over_share`; a tenant alone is never over its share). Pure."""
    return band in RESERVE_BANDS and not over_share


@dataclass(frozen=True, slots=True)
class RequestClass:
    tenant: str
    band: Priority


def first_header(headers: Mapping[str, str], names: Iterable[str]) -> str | None:
    """The first of ``names`` with a non-empty value in ``headers``."""
    for name in names:
        value = headers.get(name)
        if value:
            return value
    return None


def band_of_objective_priority(value: int) -> Priority:
    """An InferenceObjective's ``spec.priority``: above 0 critical, 0 (or unset) interactive, below 0 sheddable."""
    if value > 0:
        return Priority.CRITICAL
    return Priority.INTERACTIVE if value == 0 else Priority.SHEDDABLE


def classify(
    config: TenancyConfig,
    tenant: str,
    *,
    adapter: str | None = None,
    objective: str | None = None,
    objective_priorities: Mapping[str, int] | None = None,
    requested: float | None = None,
    batch: bool = False,
) -> RequestClass:
    """The tenant and band of one request (see the module docstring; pure)."""
    if batch:
        return RequestClass(tenant, Priority.BATCH)
    spec = config.tenants.get(tenant)
    band = config.adapters.get(adapter) if adapter is not None else None
    if band is None:
        band = spec.priority if spec is not None and spec.priority is not None else Priority.INTERACTIVE
    if objective:
        named = config.objectives.get(objective)
        if named is None and objective_priorities is not None and objective in objective_priorities:
            named = band_of_objective_priority(objective_priorities[objective])
        if named is not None:
            band = named
    if requested is not None:
        wanted = band_of_engine_priority(requested)
        if more_important(band, wanted) or (spec is not None and spec.request_priority):
            band = wanted
    return RequestClass(tenant, band)


SHARE_HALF_LIFE_S: Final = 30.0
"""How fast the served-token shares a refused tenant is told about forget: a half-life of 30 s."""


class ServedShares:
    """Tokens served per tenant of one base model, decayed with a half-life: the recent shares a 429 reports.

    Kept in buckets of a sixth of the half-life (an add is a dict update; the decay is applied when the shares are
    read, which only a refusal does), and forgotten after four half-lives."""

    __slots__ = ("_buckets", "_current", "_current_index", "_now", "_width_s", "half_life_s", "max_tenants")

    def __init__(
        self, now: Callable[[], float], half_life_s: float = SHARE_HALF_LIFE_S, max_tenants: int = MAX_TENANTS_DEFAULT
    ) -> None:
        self._now = now
        self.half_life_s = half_life_s
        self.max_tenants = max_tenants
        self._width_s = half_life_s / 6
        self._buckets: dict[int, dict[str, float]] = {}  # bucket index -> tenant -> tokens
        self._current: dict[str, float] = {}
        self._current_index = -1

    def add(self, tenant: str, tokens: float) -> None:
        index = int(self._now() // self._width_s)
        if index != self._current_index:
            self._rotate(index)
        current = self._current
        value = current.get(tenant)
        if value is not None:
            current[tenant] = value + tokens
        elif len(current) < self.max_tenants:
            current[tenant] = tokens

    def _rotate(self, index: int) -> None:
        self._current_index = index
        self._current = self._buckets.setdefault(index, {})
        horizon = index - 24  # four half-lives
        for old in [i for i in self._buckets if i <= horizon]:
            del self._buckets[old]

    def recent(self) -> dict[str, float]:
        """Decayed tokens per tenant as of now."""
        now = self._now()
        found: dict[str, float] = {}
        for index, bucket in self._buckets.items():
            age_s = max(0.0, now - (index + 0.5) * self._width_s)
            factor = 0.5 ** (age_s / self.half_life_s)
            for tenant, tokens in bucket.items():
                found[tenant] = found.get(tenant, 0.0) + tokens * factor
        return found

    def over_share(self, tenant: str, weights: Callable[[str], float]) -> tuple[float, float] | None:
        """``(served share, weight share)`` of ``tenant`` among the tenants served lately when it received more than
        its weight's share; None when it did not (or was alone)."""
        recent = {name: tokens for name, tokens in self.recent().items() if tokens >= 1.0}
        total = sum(recent.values())
        if tenant not in recent or len(recent) < 2 or total <= 0:
            return None
        served = recent[tenant] / total
        fair = weights(tenant) / sum(weights(name) for name in recent)
        return (served, fair) if served > fair else None
