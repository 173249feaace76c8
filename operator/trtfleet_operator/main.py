"""Run the operator: kopf settings, peering, the liveness endpoint, metrics, then kopf itself.

Peering (``--peering NAME``): every replica posts keep-alives to the ``ClusterKopfPeering`` (or, with
``--namespace``, ``KopfPeering``) named NAME, and only the live replica with the highest priority
works; the others stand by and take over when its keep-alives stop (``PEERING_LIFETIME_S``). Replicas
of one Deployment start with the same flags, so each draws a random priority below
``PRIMARY_PRIORITY`` unless ``--priority`` is given; ``--standby`` uses priority 0 (work only when no
other replica is alive). The peering CRDs come with the Helm chart.
"""

from __future__ import annotations

import asyncio
import logging
import os
import secrets
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import kopf

from trtfleet_operator import metrics
from trtfleet_operator.config import OperatorConfig
from trtfleet_operator.handlers import FINALIZER, register
from trtfleet_operator.kube import KubeClient, default_credentials
from trtfleet_operator.names import FIELD_MANAGER
from trtfleet_operator.runtime import OperatorRuntime

logger = logging.getLogger(__name__)

PRIMARY_PRIORITY = 1_000_000
PEERING_LIFETIME_S = 30


@dataclass(frozen=True)
class RunOptions:
    namespaces: Sequence[str]
    all_namespaces: bool
    peering: str | None
    standby: bool
    priority: int | None
    metrics_port: int
    health_port: int


def operator_settings(options: RunOptions) -> kopf.OperatorSettings:
    settings = kopf.OperatorSettings()
    settings.persistence.finalizer = FINALIZER
    settings.persistence.progress_storage = kopf.AnnotationsProgressStorage(prefix="kopf.trtfleet.io")
    settings.persistence.diffbase_storage = kopf.AnnotationsDiffBaseStorage(
        prefix="kopf.trtfleet.io", key="last-handled-configuration"
    )
    settings.posting.level = logging.WARNING
    settings.posting.reporting_component = FIELD_MANAGER
    settings.watching.server_timeout = 300
    settings.networking.request_timeout = 60
    settings.peering.lifetime = PEERING_LIFETIME_S
    if options.peering:
        settings.peering.name = options.peering
        settings.peering.mandatory = True
        settings.peering.priority = priority(options)
    else:
        settings.peering.standalone = True
    return settings


def login(**kwargs: Any) -> kopf.ConnectionInfo | None:
    """kopf's own login: $KUBECONFIG or ~/.kube/config, else the in-cluster service account (the same
    sources as :func:`trtfleet_operator.kube.default_credentials`)."""
    if os.environ.get("KUBECONFIG") or not os.environ.get("KUBERNETES_SERVICE_HOST"):
        return kopf.login_with_kubeconfig(**kwargs)
    return kopf.login_with_service_account(**kwargs)


def priority(options: RunOptions) -> int:
    if options.standby:
        return 0
    if options.priority is not None:
        return options.priority
    return 1 + secrets.randbelow(PRIMARY_PRIORITY - 1)


async def run_operator(config: OperatorConfig, options: RunOptions) -> None:
    settings = operator_settings(options)
    registry = kopf.OperatorRegistry()
    client = KubeClient(default_credentials())
    runtime = OperatorRuntime(config, client)
    kopf.on.login(registry=registry)(login)
    register(registry, runtime, config)
    if options.metrics_port:
        metrics.serve(options.metrics_port)
    logger.info(
        "starting",
        extra={
            "namespaces": list(options.namespaces) or "all",
            "peering": options.peering or "standalone",
            "priority": settings.peering.priority,
        },
    )
    try:
        await kopf.operator(
            registry=registry,
            settings=settings,
            clusterwide=options.all_namespaces,
            namespaces=list(options.namespaces),
            standalone=not options.peering,
            peering_name=options.peering,
            priority=settings.peering.priority,
            liveness_endpoint=f"http://0.0.0.0:{options.health_port}/healthz" if options.health_port else None,
        )
    finally:
        await runtime.close()
        await client.close()


def run(config: OperatorConfig, options: RunOptions) -> int:
    asyncio.run(run_operator(config, options))
    return 0
