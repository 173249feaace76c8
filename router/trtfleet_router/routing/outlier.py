"""Outlier detection for the pods of one base model, after Envoy's (pure: the caller passes ``now``).

Envoy's model (``outlier_detection``: consecutive gateway failures, base ejection time multiplied by
the number of times a host was ejected, max ejection percent) applied to LLM pods:

* a *pod failure* is what says the pod, not the request, is broken: a refused or reset connection, a
  dead Python stub (``Stub process ... is not healthy``), a pod that sends nothing within the first-token
  or inter-token timeout, a failed readiness probe. Request errors (invalid input, a LoRA miss, a full
  queue or cache) are never pod failures;
* ``consecutiveFailures`` pod failures in a row (a successful answer resets the count) eject the pod for
  ``baseEjectionTimeS x 2^(times ejected before)``, at most ``maxEjectionTimeS``;
* at most ``maxEjectionPercent`` of the pods (at least one, never all) are ejected at once: a failure that
  would exceed the budget is counted but ejects nothing, so the whole fleet is never ejected;
* an ejected pod comes back only when its ejection time has passed *and* a readiness probe then answers;
  a pod that stays healthy for ``maxEjectionTimeS`` after coming back starts its back-off afresh.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from pydantic import Field

from trtfleet.api.common import ApiModel


class OutlierDetectionConfig(ApiModel):
    """When the router stops sending requests to a pod that fails (see ``routing/outlier.py``)."""

    consecutive_failures: int = Field(
        default=3,
        ge=1,
        description="Pod failures in a row (refused or reset connections, a dead stub, no token "
        "within the stream timeouts, failed readiness probes) that eject a pod. Request errors never count.",
    )
    base_ejection_time_s: float = Field(
        default=5.0, gt=0, description="First ejection time; each later ejection of the same pod doubles it."
    )
    max_ejection_time_s: float = Field(
        default=300.0,
        gt=0,
        description="Longest ejection; also how long a pod must stay healthy after coming "
        "back before its back-off starts afresh.",
    )
    max_ejection_percent: float = Field(
        default=50.0,
        ge=0,
        le=100,
        description="Share of a base model's pods that may be ejected at once (at least one pod, never all of them).",
    )
    probe_interval_s: float = Field(
        default=1.0,
        gt=0,
        description="How often every pod's readiness (Triton ModelReady of the upstream model) "
        "is probed; a probe that fails or times out counts as a pod failure.",
    )
    probe_timeout_s: float = Field(default=1.0, gt=0, description="Readiness probe timeout.")


@dataclass(slots=True)
class PodHealth:
    """Outlier state of one pod."""

    consecutive_failures: int = 0
    times_ejected: int = 0
    ejected_until_s: float | None = None  # on the caller's clock; set while the pod is ejected
    returned_at_s: float | None = None


@dataclass(frozen=True, slots=True)
class Ejection:
    pod: str
    duration_s: float
    consecutive_failures: int


def ejection_budget(pods_total: int, max_ejection_percent: float) -> int:
    """How many of ``pods_total`` pods may be ejected at once: at least one, never all."""
    if pods_total <= 1:
        return 0
    return min(pods_total - 1, max(1, int(pods_total * max_ejection_percent / 100.0)))


class OutlierDetector:
    """Failure counts and ejections of the pods of one base model."""

    def __init__(self, config: OutlierDetectionConfig) -> None:
        self.config = config
        self._pods: dict[str, PodHealth] = {}

    def health(self, pod: str) -> PodHealth:
        found = self._pods.get(pod)
        if found is None:
            found = self._pods[pod] = PodHealth()
        return found

    @property
    def ejected(self) -> frozenset[str]:
        return frozenset(pod for pod, health in self._pods.items() if health.ejected_until_s is not None)

    def record_success(self, pod: str) -> None:
        """The pod answered a request: its failure count starts again."""
        health = self._pods.get(pod)
        if health is not None:
            health.consecutive_failures = 0

    def record_failure(self, pod: str, pods_total: int, now_s: float) -> Ejection | None:
        """A pod failure; returns the ejection it caused, if any."""
        health = self.health(pod)
        health.consecutive_failures += 1
        config = self.config
        if health.ejected_until_s is not None or health.consecutive_failures < config.consecutive_failures:
            return None
        if len(self.ejected) >= ejection_budget(pods_total, config.max_ejection_percent):
            return None
        if health.returned_at_s is not None and now_s - health.returned_at_s >= config.max_ejection_time_s:
            health.times_ejected = 0  # healthy long enough since it came back: forget its history
        duration_s = min(config.base_ejection_time_s * 2**health.times_ejected, config.max_ejection_time_s)
        health.times_ejected += 1
        health.ejected_until_s = now_s + duration_s
        return Ejection(pod, duration_s, health.consecutive_failures)

    def due_for_probe(self, now_s: float) -> list[str]:
        """Ejected pods whose ejection time has passed: a successful probe brings them back."""
        return [
            pod
            for pod, health in self._pods.items()
            if health.ejected_until_s is not None and health.ejected_until_s <= now_s
        ]

    def readmit(self, pod: str, now_s: float) -> bool:
        """A probe of an ejected pod answered after its ejection time: route to it again. True if it was out."""
        health = self._pods.get(pod)
        if health is None or health.ejected_until_s is None or health.ejected_until_s > now_s:
            return False
        health.ejected_until_s = None
        health.consecutive_failures = 0
        health.returned_at_s = now_s
        return True

    def retain(self, pods: Iterable[str]) -> None:
        """Forget pods that left the fleet."""
        kept = set(pods)
        for pod in [p for p in self._pods if p not in kept]:
            del self._pods[pod]
