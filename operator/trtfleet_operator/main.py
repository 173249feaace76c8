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
import secrets
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import kopf

from trtfleet.internalauth import TokenFile, TokenFileError
from trtfleet.kube import KubeApi, KubeConfigError, KubeConnection, KubeSource, load_connection
from trtfleet.kube.config import bearer_token
from trtfleet_operator import metrics
from trtfleet_operator.autoscaler import Autoscaler, ScrapeSignals
from trtfleet_operator.config import OperatorConfig
from trtfleet_operator.errors import ConfigError
from trtfleet_operator.handlers import FINALIZER, register
from trtfleet_operator.holdwatch import HoldWatch
from trtfleet_operator.kube import KubeClient, KubeTaskIdStore
from trtfleet_operator.mergeadvisor import MergeAdvisor, RouterDemand
from trtfleet_operator.names import FIELD_MANAGER
from trtfleet_operator.runtime import OperatorRuntime

logger = logging.getLogger(__name__)

EXIT_CONFIG = 2
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


async def connection_info(connection: KubeConnection) -> kopf.ConnectionInfo:
    """kopf's view of credentials the shared layer loaded (files may be the library's temporary files)."""
    configuration = connection.configuration
    header = await bearer_token(configuration)
    scheme, _, token = header.partition(" ") if header else (None, "", None)
    return kopf.ConnectionInfo(
        server=str(configuration.host),
        ca_path=configuration.ssl_ca_cert,
        insecure=not configuration.verify_ssl,
        scheme=scheme,
        token=token or None,
        certificate_path=configuration.cert_file,
        private_key_path=configuration.key_file,
        proxy_url=configuration.proxy,
        default_namespace=connection.namespace,
    )


async def login(**_: Any) -> kopf.ConnectionInfo:
    """kopf logs in through the shared layer, as the operator's own client does; kopf calls this again
    after a 401, which loads a rotated token or runs the exec plugin again."""
    try:
        return await connection_info(await load_connection(KubeSource()))
    except KubeConfigError as exc:
        raise kopf.LoginError(str(exc)) from exc


def priority(options: RunOptions) -> int:
    if options.standby:
        return 0
    if options.priority is not None:
        return options.priority
    return 1 + secrets.randbelow(PRIMARY_PRIORITY - 1)


async def run_operator(config: OperatorConfig, options: RunOptions) -> None:
    settings = operator_settings(options)
    registry = kopf.OperatorRegistry()
    try:
        client = KubeClient(await KubeApi.connect(KubeSource()))
    except KubeConfigError as exc:
        raise ConfigError(str(exc)) from exc
    token_file = config.merge_advice.router_token_file
    try:
        tokens = TokenFile(token_file) if token_file is not None else None
    except TokenFileError as exc:
        await client.close()
        raise ConfigError(f"--router-token-file: {exc}") from exc
    runtime = OperatorRuntime(config, client, KubeTaskIdStore(client))
    kopf.on.login(registry=registry)(login)
    autoscaler = Autoscaler(client, ScrapeSignals(client, config.autoscale), runtime.clock)
    demand = RouterDemand(client, config.autoscale, config.merge_advice, tokens=tokens)
    advisor = MergeAdvisor(client, demand, runtime.clock, runtime.trigger)
    watch = (
        HoldWatch(client, config.autoscale, config.merge_advice, tokens=tokens)
        if config.autoscale.held_wait_s > 0
        else None
    )
    register(registry, runtime, config, autoscaler, advisor, watch)
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
    sweep = (asyncio.create_task(runtime.sweep_engines(options.namespaces))
             if config.engine_retention_s > 0 else None)
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
        if sweep is not None:
            sweep.cancel()
            await asyncio.gather(sweep, return_exceptions=True)
        await runtime.close()
        await client.close()


def run(config: OperatorConfig, options: RunOptions) -> int:
    try:
        asyncio.run(run_operator(config, options))
    except ConfigError as exc:
        print(f"trtfleet operator: {exc}", file=sys.stderr)
        return EXIT_CONFIG
    return 0
