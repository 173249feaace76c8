"""The serving pods' headless Service (what the router resolves to pod addresses) and their PodDisruptionBudget."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from trtfleet.api.basemodel import Runtime, ServingServer
from trtfleet_operator.builders.common import Obj, metadata
from trtfleet_operator.builders.serving import GRPC_PORT, HTTP_PORT, METRICS_PORT, selector_labels
from trtfleet_operator.names import COMPONENT_SERVING

_SERVICE_PORTS: tuple[Obj, ...] = (
    {"name": "http", "port": HTTP_PORT, "targetPort": "http", "protocol": "TCP", "appProtocol": "http"},
    {"name": "grpc", "port": GRPC_PORT, "targetPort": "grpc", "protocol": "TCP", "appProtocol": "kubernetes.io/h2c"},
    {"name": "metrics", "port": METRICS_PORT, "targetPort": "metrics", "protocol": "TCP", "appProtocol": "http"},
)
HTTP_ONLY_RUNTIMES = frozenset({Runtime.PYTORCH})
"""trtllm-serve has one port: the OpenAI API, /health and /prometheus/metrics all answer on ``http``
(``serving.server: triton`` pods of the same runtime have Triton's three)."""


def build_service(
    *,
    name: str,
    namespace: str,
    owner: Mapping[str, Any],
    basemodel: str,
    adapter: str | None = None,
    runtime: Runtime = Runtime.TENSORRTLLM,
    server: ServingServer | None = None,
    variant: str | None = None,
) -> Obj:
    """The headless Service the router resolves to pod addresses (port ``http`` on every runtime)."""
    selector = selector_labels(basemodel, adapter, variant)
    http_only = runtime in HTTP_ONLY_RUNTIMES and server is not ServingServer.TRITON
    ports = [dict(port) for port in _SERVICE_PORTS if not http_only or port["name"] == "http"]
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": metadata(name, namespace, component=COMPONENT_SERVING, labels=selector, owners=[owner]),
        "spec": {
            "clusterIP": "None",
            "publishNotReadyAddresses": False,
            "selector": selector,
            "ports": ports,
        },
    }


def build_pdb(
    *,
    name: str,
    namespace: str,
    owner: Mapping[str, Any],
    basemodel: str,
    adapter: str | None = None,
    variant: str | None = None,
) -> Obj:
    """Voluntary disruptions (drains) take one serving pod at a time; broken pods never block a drain."""
    selector = selector_labels(basemodel, adapter, variant)
    return {
        "apiVersion": "policy/v1",
        "kind": "PodDisruptionBudget",
        "metadata": metadata(name, namespace, component=COMPONENT_SERVING, labels=selector, owners=[owner]),
        "spec": {
            "maxUnavailable": 1,
            "selector": {"matchLabels": selector},
            "unhealthyPodEvictionPolicy": "AlwaysAllow",
        },
    }
