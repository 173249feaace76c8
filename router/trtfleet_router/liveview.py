"""The router's live view: the model registry plus one routing :class:`Fleet` per base model.

Discovery (static or Kubernetes) produces :class:`DiscoverySnapshot` values; :meth:`FleetSet.apply`
swaps the registry and hands each fleet its pods (``Fleet.set_pods`` resets a pod whose uid changed,
so a restarted pod starts with an empty shadow cache). Everything here runs on the event loop thread.

Pod health (outlier detection, see :mod:`trtfleet_router.routing.outlier`): pod failures reported by the
dispatcher and the readiness probes (:meth:`FleetSet.record_failure`) eject a pod with back-off, i.e. hand
it to its fleet as not ready, until its ejection time passes and a probe answers (:meth:`FleetSet.readmit`).
Discovery's own readiness (EndpointSlice conditions) still rules; ejection only adds to it.
"""

from __future__ import annotations

import logging
import random
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field

from trtfleet_router.errors import NoCapacityAvailable
from trtfleet_router.models_registry import ModelRegistry, Target
from trtfleet_router.routing.config import RoutingConfig
from trtfleet_router.routing.events import Journal
from trtfleet_router.routing.fleet import Fleet
from trtfleet_router.routing.outlier import Ejection, OutlierDetector
from trtfleet_router.routing.policies import build_policy
from trtfleet_router.routing.types import PodInfo

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class PodEndpoint:
    """One serving pod as discovery sees it."""

    pod_id: str
    address: str  # host:port of Triton's gRPC endpoint
    uid: str
    metrics_url: str | None = None  # http://host:port/metrics of Triton's metrics endpoint
    ready: bool = True
    http_address: str | None = None  # host:port of Triton's HTTP endpoint (warm requests, see http_transport)


@dataclass(frozen=True, slots=True)
class DiscoverySnapshot:
    registry: ModelRegistry
    pods: Mapping[str, Mapping[str, PodEndpoint]] = field(default_factory=dict)  # base -> pod id -> pod
    objective_priorities: Mapping[str, int] = field(default_factory=dict)
    """InferenceObjective name -> ``spec.priority`` (Kubernetes discovery with ``tenancy.inferenceObjectives``)."""


class FleetSet:
    """Registry + fleets; the only mutable routing state of the router."""

    def __init__(
        self,
        routing_config: RoutingConfig,
        *,
        now: Callable[[], float] = time.monotonic,
        seed: int | None = None,
        journal: Journal | None = None,
    ) -> None:
        self.routing_config = routing_config
        self.journal = journal  # other router replicas: every fleet's changes go there
        self._now = now
        self._rng = random.Random(seed)
        self.registry = ModelRegistry()
        self.objective_priorities: Mapping[str, int] = {}
        self.fleets: dict[str, Fleet] = {}
        self.pods: dict[str, dict[str, PodEndpoint]] = {}
        self.outliers: dict[str, OutlierDetector] = {}  # base -> failure counts and ejections of its pods
        self.generation = 0
        self.pod_listeners: list[Callable[[set[str]], None]] = []
        """Called with the base models whose pods were handed to their fleets anew (the dispatcher's holds)."""

    def apply(self, snapshot: DiscoverySnapshot) -> None:
        registry = snapshot.registry
        for name in registry.bases:
            if name not in self.fleets:
                policy = build_policy(self.routing_config)
                seed = self._rng.getrandbits(64)
                self.fleets[name] = Fleet(
                    policy,
                    now=self._now,
                    rng=random.Random(seed),
                    config=self.routing_config,
                    model=name,
                    journal=self.journal,
                )
                self.outliers[name] = OutlierDetector(self.routing_config.outlier_detection)
                log.info("base model added", extra={"ctx": {"base_model": name, "policy": policy.name}})
        for name in [n for n in self.fleets if n not in registry.bases]:
            del self.fleets[name]
            self.pods.pop(name, None)
            self.outliers.pop(name, None)
            log.info("base model removed", extra={"ctx": {"base_model": name}})
        self.registry = registry
        self.objective_priorities = snapshot.objective_priorities
        for name in self.fleets:
            self.fleets[name].kv_tokens_per_block = registry.bases[name].kv_tokens_per_block
            self.pods[name] = dict(snapshot.pods.get(name, {}))
            self.outliers[name].retain(self.pods[name])
            self._hand_pods(name)
        self.generation += 1
        self._pods_changed(set(self.fleets))

    def _pods_changed(self, base_models: set[str]) -> None:
        for listener in self.pod_listeners:
            listener(base_models)

    def _hand_pods(self, name: str) -> None:
        base = self.registry.bases[name]
        ejected = self.ejected(name)
        self.fleets[name].set_pods(
            {
                pod_id: PodInfo(
                    pod_id, ep.address, ep.uid, base.host_pages, base.device_pages, ep.ready and pod_id not in ejected,
                    kv_blocks=base.kv_blocks,
                )
                for pod_id, ep in self.pods[name].items()
            }
        )

    def ejected(self, base_model: str) -> frozenset[str]:
        outliers = self.outliers.get(base_model)
        return outliers.ejected if outliers is not None else frozenset()

    def record_failure(self, base_model: str, pod_id: str) -> Ejection | None:
        """A failure that says the pod is broken (never a request error); may eject it."""
        outliers = self.outliers.get(base_model)
        pods = self.pods.get(base_model, {})
        if outliers is None or pod_id not in pods:
            return None
        ejection = outliers.record_failure(pod_id, len(pods), self._now())
        if ejection is not None:
            self._hand_pods(base_model)
            self._pods_changed({base_model})  # so a readmitted pod is new to the warm start again
            log.warning(
                "pod ejected",
                extra={
                    "ctx": {
                        "base_model": base_model,
                        "pod": pod_id,
                        "ejection_s": ejection.duration_s,
                        "consecutive_failures": ejection.consecutive_failures,
                    }
                },
            )
        return ejection

    def record_success(self, base_model: str, pod_id: str) -> None:
        outliers = self.outliers.get(base_model)
        if outliers is not None:
            outliers.record_success(pod_id)

    def readmit(self, base_model: str, pod_id: str) -> None:
        """A probe of an ejected pod answered after its ejection time: route to it again."""
        outliers = self.outliers.get(base_model)
        if outliers is not None and outliers.readmit(pod_id, self._now()) and base_model in self.fleets:
            self._hand_pods(base_model)
            self._pods_changed({base_model})
            log.info("pod readmitted", extra={"ctx": {"base_model": base_model, "pod": pod_id}})

    def due_for_probe(self) -> list[tuple[str, PodEndpoint]]:
        """Ejected pods whose ejection time has passed (a successful probe readmits them)."""
        now = self._now()
        return [
            (base, self.pods[base][pod_id])
            for base, outliers in self.outliers.items()
            for pod_id in outliers.due_for_probe(now)
            if pod_id in self.pods.get(base, {})
        ]

    def fleet(self, base_model: str) -> Fleet:
        fleet = self.fleets.get(base_model)
        if fleet is None:
            raise NoCapacityAvailable(f"base model '{base_model}' has no fleet yet")
        return fleet

    def endpoint(self, base_model: str, pod_id: str) -> PodEndpoint | None:
        return self.pods.get(base_model, {}).get(pod_id)

    def ready_endpoints(self, base_model: str) -> list[PodEndpoint]:
        ejected = self.ejected(base_model)
        return [ep for ep in self.pods.get(base_model, {}).values() if ep.ready and ep.pod_id not in ejected]

    def serving(self, target: Target) -> Target:
        """``target``, or its fallback (the same name on the BaseModel it replaces, or a merged adapter hot-swapped
        on the shared pool) while the target's base model has no ready pod and the fallback's has one: a
        migration or a mode switch moves each request the moment the new pods can take it, and back while they
        cannot."""
        fallback = target.fallback
        if fallback is None or self.ready_endpoints(target.base.name) or not self.ready_endpoints(fallback.base.name):
            return target
        return fallback

    def all_endpoints(self) -> Iterator[tuple[str, PodEndpoint]]:
        for base, pods in self.pods.items():
            for endpoint in pods.values():
                yield base, endpoint

    def addresses(self) -> set[str]:
        return {endpoint.address for _, endpoint in self.all_endpoints()}
