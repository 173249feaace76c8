"""``trtfleet operator``: run the Kubernetes operator (kopf).

    trtfleet operator [--namespace NS ... | --all-namespaces] [--peering NAME [--standby | --priority N]]
                      [--standalone] [--metrics-port 8080] [--health-port 8081]
                      [--engine-pvc trtfleet-engines] [--artifact-pvc trtfleet-adapters]
                      [--resync-interval 30] [--build-backoff-limit 1] [--build-max-attempts 5]
                      [--build-retry-delay 60] [--convert-node-selector KEY=VALUE ...] [--image-pull-secret NAME ...]
                      [--no-artifact-collection] [--adapter-drain 60] [--engine-retention 604800]
                      [--collect-interval 600] [--log-level INFO]
                      [--autoscale-interval 15] [--router-selector SEL] [--router-namespace NS]
                      [--router-metrics-port 9090] [--router-metrics-url URL ...] [--held-wait 20]
                      [--merge-interval 60] [--router-peer-port 8082] [--router-demand-url URL ...]
                      [--inference-pool-picker SERVICE:PORT]

Images come from TRTFLEET_IMAGE, TRTFLEET_WORKER_IMAGE and TRTFLEET_MODELOPT_IMAGE (see
:mod:`trtfleet_operator.config`). Exit codes: 0 after a clean stop, 2 for bad flags or environment.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from trtfleet_operator import logs
from trtfleet_operator.config import (
    AutoscaleConfig,
    BuildPolicy,
    InferencePoolConfig,
    MergeAdviceConfig,
    OperatorConfig,
    Storage,
    images_from_environment,
)
from trtfleet_operator.errors import ConfigError

EXIT_CONFIG = 2


def configure(parser: argparse.ArgumentParser) -> None:
    scope = parser.add_mutually_exclusive_group()
    scope.add_argument(
        "--namespace",
        "-n",
        action="append",
        default=[],
        metavar="NS",
        help="watch this namespace (repeatable)",
    )
    scope.add_argument("--all-namespaces", "-A", action="store_true", help="watch every namespace")
    peering = parser.add_mutually_exclusive_group()
    peering.add_argument("--peering", metavar="NAME", help="kopf peering object shared with standby replicas")
    peering.add_argument("--standalone", action="store_true", help="no peering (a single replica; default)")
    rank = parser.add_mutually_exclusive_group()
    rank.add_argument("--standby", action="store_true", help="with --peering: work only when no peer is alive")
    rank.add_argument("--priority", type=int, help="with --peering: this replica's priority (default random)")
    parser.add_argument("--metrics-port", type=int, default=8080, help="Prometheus /metrics port (0: off)")
    parser.add_argument("--health-port", type=int, default=8081, help="liveness /healthz port (0: off)")
    storage = Storage()
    parser.add_argument("--engine-pvc", default=storage.engine_pvc, help="PVC holding built engines")
    parser.add_argument("--artifact-pvc", default=storage.artifact_pvc, help="PVC holding converted adapters")
    defaults = OperatorConfig()
    parser.add_argument(
        "--resync-interval",
        type=float,
        default=defaults.resync_interval_s,
        help="seconds between periodic reconciles of every object",
    )
    parser.add_argument(
        "--build-backoff-limit",
        type=int,
        default=defaults.build.backoff_limit,
        help="pod retries inside one build Job",
    )
    parser.add_argument(
        "--build-max-attempts",
        type=int,
        default=defaults.build.max_attempts,
        help="build Jobs per engine before giving up",
    )
    parser.add_argument(
        "--build-retry-delay",
        type=float,
        default=defaults.build.retry_base_s,
        help="seconds before the second build attempt (doubling after each failure)",
    )
    parser.add_argument(
        "--convert-node-selector",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="node label adapter-convert Jobs must match (repeatable)",
    )
    parser.add_argument(
        "--no-artifact-collection",
        action="store_true",
        help="leave a deleted Adapter's artifact on the adapter volume (default: removed once unused)",
    )
    parser.add_argument(
        "--adapter-drain",
        type=float,
        default=defaults.artifact_drain_s,
        help="seconds requests already at pods get after an Adapter's deletion starts, before its artifact goes",
    )
    parser.add_argument(
        "--engine-retention",
        type=float,
        default=defaults.engine_retention_s,
        help="seconds an engine or staged checkpoint nothing uses stays on the engine volume (0: forever)",
    )
    parser.add_argument(
        "--collect-interval",
        type=float,
        default=defaults.collect_interval_s,
        help="seconds between checks of each engine record for use",
    )
    parser.add_argument(
        "--image-pull-secret",
        action="append",
        default=[],
        metavar="NAME",
        help="Secret the pods of Jobs and Deployments this operator creates pull images with (repeatable; it "
        "must exist in each BaseModel's namespace)",
    )
    scaling = defaults.autoscale
    parser.add_argument(
        "--autoscale-interval",
        type=float,
        default=scaling.interval_s,
        help="seconds between autoscaling decisions of BaseModels with spec.autoscaling",
    )
    parser.add_argument(
        "--router-selector", default=scaling.router_selector, help="label selector of the router pods to scrape"
    )
    parser.add_argument("--router-namespace", help="namespace of the router pods (default: each BaseModel's)")
    parser.add_argument(
        "--router-metrics-port", type=int, default=scaling.router_metrics_port, help="the routers' /metrics port"
    )
    parser.add_argument(
        "--router-metrics-url",
        action="append",
        default=[],
        metavar="URL",
        help="a router's /metrics URL, instead of looking router pods up (repeatable; the local path)",
    )
    parser.add_argument(
        "--held-wait",
        type=float,
        default=scaling.held_wait_s,
        help="seconds one long poll of a router's held requests lasts: a request held at zero pods scales its "
        "BaseModel up at once, not at the next decision (0: off)",
    )
    advice = defaults.merge_advice
    parser.add_argument(
        "--merge-interval",
        type=float,
        default=advice.interval_s,
        help="seconds between merge advice rounds (every BaseModel's Adapters, status.merge)",
    )
    parser.add_argument(
        "--router-peer-port",
        type=int,
        default=advice.router_peer_port,
        help="the routers' peer port, which serves GET /fleet/v1/demand",
    )
    parser.add_argument(
        "--router-demand-url",
        action="append",
        default=[],
        metavar="URL",
        help="a router's /fleet/v1/demand URL, instead of looking router pods up (repeatable; the local path)",
    )
    parser.add_argument(
        "--router-token-file",
        type=Path,
        metavar="FILE",
        help="the routers' internal bearer tokens (their --internal-token-file), sent with the demand and held "
        "requests on the peer port; re-read when the file changes",
    )
    parser.add_argument(
        "--inference-pool-picker",
        metavar="SERVICE:PORT",
        type=_picker,
        help="render an InferencePool (inference.networking.k8s.io/v1) per BaseModel, when the cluster serves "
        "them, whose endpoint picker is this Service of the BaseModel's namespace (trtfleet's picker; default: none)",
    )
    parser.add_argument("--log-level", default=os.environ.get("TRTFLEET_LOG_LEVEL", "INFO"))
    parser.set_defaults(func=run)


def config_from_args(args: argparse.Namespace) -> OperatorConfig:
    defaults = BuildPolicy()
    return OperatorConfig(
        images=images_from_environment(),
        build=BuildPolicy(
            backoff_limit=args.build_backoff_limit,
            deadline_s=defaults.deadline_s,
            max_attempts=args.build_max_attempts,
            retry_base_s=args.build_retry_delay,
            retry_max_s=max(defaults.retry_max_s, args.build_retry_delay),
        ),
        storage=Storage(engine_pvc=args.engine_pvc, artifact_pvc=args.artifact_pvc),
        resync_interval_s=args.resync_interval,
        autoscale=AutoscaleConfig(
            interval_s=args.autoscale_interval,
            router_selector=args.router_selector,
            router_namespace=args.router_namespace,
            router_metrics_port=args.router_metrics_port,
            router_metrics_urls=tuple(args.router_metrics_url),
            held_wait_s=args.held_wait,
        ),
        merge_advice=MergeAdviceConfig(
            interval_s=args.merge_interval,
            router_peer_port=args.router_peer_port,
            router_demand_urls=tuple(args.router_demand_url),
            router_token_file=args.router_token_file,
        ),
        convert_node_selector=tuple(sorted(_key_value(item) for item in args.convert_node_selector)),
        image_pull_secrets=tuple(dict.fromkeys(args.image_pull_secret)),
        collect_artifacts=not args.no_artifact_collection,
        artifact_drain_s=args.adapter_drain,
        engine_retention_s=args.engine_retention,
        collect_interval_s=args.collect_interval,
        inference_pool=args.inference_pool_picker,
    )


def _picker(value: str) -> InferencePoolConfig:
    """``--inference-pool-picker SERVICE:PORT``."""
    service, sep, port = value.rpartition(":")
    if not sep or not port.isdigit():
        raise argparse.ArgumentTypeError(f"expected SERVICE:PORT, e.g. trtfleet-epp:9002, not {value!r}")
    try:
        return InferencePoolConfig(picker_service=service, picker_port=int(port))
    except ConfigError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from exc


def _key_value(item: str) -> tuple[str, str]:
    key, sep, value = item.partition("=")
    if not sep or not key:
        raise ConfigError(f"--convert-node-selector {item!r}: expected KEY=VALUE")
    return key, value


def run(args: argparse.Namespace) -> int:
    logs.configure(str(args.log_level))
    try:
        config = config_from_args(args)
        if (args.standby or args.priority is not None) and not args.peering:
            raise ConfigError("--standby and --priority need --peering")
    except ConfigError as exc:
        print(f"trtfleet operator: {exc}", file=sys.stderr)
        return EXIT_CONFIG
    from trtfleet_operator.main import RunOptions
    from trtfleet_operator.main import run as run_main

    options = RunOptions(
        namespaces=tuple(args.namespace),
        all_namespaces=args.all_namespaces or not args.namespace,
        peering=args.peering,
        standby=args.standby,
        priority=args.priority,
        metrics_port=args.metrics_port,
        health_port=args.health_port,
    )
    return run_main(config, options)
