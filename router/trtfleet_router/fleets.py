"""The router's live view: the model registry plus one routing :class:`Fleet` per base model.

Discovery (static or Kubernetes) produces :class:`DiscoverySnapshot` values; :meth:`FleetSet.apply`
swaps the registry and hands each fleet its pods (``Fleet.set_pods`` resets a pod whose uid changed,
so a restarted pod starts with an empty shadow cache). Everything here runs on the event loop thread.

Passive health: a pod whose transport failed (connection refused or reset) is *suspended*, i.e. handed
to its fleet as not ready, until a probe (``ServerReady``, see the app's health loop) answers again.
Discovery's own readiness (EndpointSlice conditions) still rules; suspension only adds to it.
"""

from __future__ import annotations

import logging
import random
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field

from trtfleet_router.errors import NoCapacityAvailable
from trtfleet_router.models_registry import ModelRegistry
from trtfleet_router.routing.config import RoutingConfig
from trtfleet_router.routing.fleet import Fleet
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


class FleetSet:
    """Registry + fleets; the only mutable routing state of the router."""

    def __init__(
        self,
        routing_config: RoutingConfig,
        *,
        now: Callable[[], float] = time.monotonic,
        seed: int | None = None,
    ) -> None:
        self.routing_config = routing_config
        self._now = now
        self._rng = random.Random(seed)
        self.registry = ModelRegistry()
        self.fleets: dict[str, Fleet] = {}
        self.pods: dict[str, dict[str, PodEndpoint]] = {}
        self.suspended: dict[str, set[str]] = {}  # base -> pod ids failing at the transport level
        self.generation = 0

    def apply(self, snapshot: DiscoverySnapshot) -> None:
        registry = snapshot.registry
        for name in registry.bases:
            if name not in self.fleets:
                policy = build_policy(self.routing_config)
                seed = self._rng.getrandbits(64)
                self.fleets[name] = Fleet(
                    policy, now=self._now, rng=random.Random(seed), config=self.routing_config, model=name
                )
                log.info("base model added", extra={"ctx": {"base_model": name, "policy": policy.name}})
        for name in [n for n in self.fleets if n not in registry.bases]:
            del self.fleets[name]
            self.pods.pop(name, None)
            log.info("base model removed", extra={"ctx": {"base_model": name}})
        self.registry = registry
        for name in self.fleets:
            self.pods[name] = dict(snapshot.pods.get(name, {}))
            suspended = self.suspended.get(name)
            if suspended:
                suspended &= set(self.pods[name])
            self._hand_pods(name)
        self.generation += 1

    def _hand_pods(self, name: str) -> None:
        base = self.registry.bases[name]
        suspended = self.suspended.get(name, set())
        self.fleets[name].set_pods(
            {
                pod_id: PodInfo(
                    pod_id, ep.address, ep.uid, base.host_pages, base.device_pages, ep.ready and pod_id not in suspended
                )
                for pod_id, ep in self.pods[name].items()
            }
        )

    def suspend(self, base_model: str, pod_id: str) -> None:
        """Stop routing to a pod whose transport failed until :meth:`resume`."""
        if base_model not in self.fleets or pod_id not in self.pods.get(base_model, {}):
            return
        suspended = self.suspended.setdefault(base_model, set())
        if pod_id not in suspended:
            suspended.add(pod_id)
            self._hand_pods(base_model)
            log.warning("pod suspended", extra={"ctx": {"base_model": base_model, "pod": pod_id}})

    def resume(self, base_model: str, pod_id: str) -> None:
        suspended = self.suspended.get(base_model)
        if suspended and pod_id in suspended:
            suspended.discard(pod_id)
            if base_model in self.fleets:
                self._hand_pods(base_model)
            log.info("pod resumed", extra={"ctx": {"base_model": base_model, "pod": pod_id}})

    def suspended_endpoints(self) -> list[tuple[str, PodEndpoint]]:
        return [
            (base, self.pods[base][pod_id])
            for base, pods in self.suspended.items()
            for pod_id in pods
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
        suspended = self.suspended.get(base_model, set())
        return [ep for ep in self.pods.get(base_model, {}).values() if ep.ready and ep.pod_id not in suspended]

    def all_endpoints(self) -> Iterator[tuple[str, PodEndpoint]]:
        for base, pods in self.pods.items():
            for endpoint in pods.values():
                yield base, endpoint

    def addresses(self) -> set[str]:
        return {endpoint.address for _, endpoint in self.all_endpoints()}
