"""``trtfleet router``: run the adapter-aware router.

Examples::

    trtfleet router --fleet-config fleet.yaml
    trtfleet router --base-model tiny --architecture reference --max-input-len 256 --max-seq-len 512 \\
        --backend 127.0.0.1:8001/8002,127.0.0.1:9001/9002 --adapter tiny-upper=1:/data/adapters/upper
    trtfleet router --kubernetes --namespace models
    trtfleet router --fleet-config fleet.yaml --peer-port 8082 --peer http://10.0.0.7:8082 \
        --internal-token-file /etc/trtfleet/internal/tokens  # a second replica (the same file on each)

SIGTERM/SIGINT drain: readiness goes false, new requests get 503, in-flight ones get
``--drain-timeout-s`` to finish.
"""

from __future__ import annotations

import argparse
import asyncio
import signal
from pathlib import Path

from trtfleet.batch.runner import CONCURRENCY_DEFAULT, RunnerSettings
from trtfleet_router.app import (
    DRAIN_TIMEOUT_S_DEFAULT,
    PREWARM_INTERVAL_S_DEFAULT,
    Discovery,
    Router,
    RouterSettings,
)
from trtfleet_router.batch.capacity import POD_SLOTS_DEFAULT
from trtfleet_router.batch.wiring import BatchSettings
from trtfleet_router.epp.exchange import PickerSettings
from trtfleet_router.logs import configure_logging
from trtfleet_router.models_registry import DEFAULT_UPSTREAM_MODEL
from trtfleet_router.peering.peers import (
    GRACE_S_DEFAULT,
    PEER_PORT_DEFAULT,
    SYNC_TIMEOUT_S_DEFAULT,
    PeerSettings,
    normalize_peer_url,
)
from trtfleet_router.routing.config import RoutingConfig
from trtfleet_router.routing.policies import load_routing_config, parse_routing_config
from trtfleet_router.routing.reserve import RESERVE_AUTO
from trtfleet_router.server.batch_http import MAX_FILE_BYTES_DEFAULT
from trtfleet_router.server.common import (
    BODY_TIMEOUT_S_DEFAULT,
    HEADER_TIMEOUT_S_DEFAULT,
    MAX_BODY_BYTES_DEFAULT,
    REQUEST_TIMEOUT_S_DEFAULT,
    FrontendSettings,
)
from trtfleet_router.upstream.grpc_transport import STREAMS_PER_POD_DEFAULT, UpstreamCalls
from trtfleet_router.upstream.scrape import SCRAPE_INTERVAL_S_DEFAULT
from trtfleet_router.weights import DEFAULT_CAPACITY_BYTES


def configure(parser: argparse.ArgumentParser) -> None:
    ports = parser.add_argument_group("ports")
    ports.add_argument("--host", default="0.0.0.0", help="address to listen on (default 0.0.0.0)")
    ports.add_argument("--http-port", type=int, default=8080, help="OpenAI + Triton HTTP (0: any free port)")
    ports.add_argument("--grpc-port", type=int, default=8081, help="Triton gRPC (-1: disabled)")
    ports.add_argument("--metrics-port", type=int, default=9090, help="/metrics (-1: disabled)")

    peers = parser.add_argument_group("router replicas (one shared view of the pods' LoRA caches)")
    peers.add_argument(
        "--peer-port",
        type=int,
        default=PEER_PORT_DEFAULT,
        help=f"internal port other replicas stream events from (default {PEER_PORT_DEFAULT}; -1: disabled)",
    )
    peers.add_argument(
        "--peer", action="append", default=[], metavar="URL", help="another replica's peer URL (repeatable)"
    )
    peers.add_argument("--peer-dns", metavar="HOST:PORT", help="headless Service whose addresses are the replicas")
    peers.add_argument("--peer-advertise", metavar="URL", help="this replica's peer URL as the others reach it")
    peers.add_argument("--peer-grace-s", type=float, default=GRACE_S_DEFAULT, help="a replica silent this long is gone")
    peers.add_argument(
        "--peer-sync-timeout-s",
        type=float,
        default=SYNC_TIMEOUT_S_DEFAULT,
        help="at start, how long to try to copy a peer's view before serving",
    )

    picker = parser.add_argument_group("endpoint picker (a Gateway API InferencePool's EPP, docs/gateway.md)")
    picker.add_argument(
        "--epp-port",
        type=int,
        default=-1,
        help="also serve Envoy's ext_proc endpoint-picker protocol and gRPC health on this port (default -1: off)",
    )
    picker.add_argument(
        "--epp-fallbacks",
        type=int,
        default=0,
        help="endpoints after the first in x-gateway-destination-endpoint, for gateways that retry down the list "
        "(default 0: plain Envoy takes one)",
    )

    internal = parser.add_argument_group(
        "internal endpoints (the peer port, the debug endpoints; without a token file: loopback clients only)"
    )
    internal.add_argument(
        "--internal-token-file",
        type=Path,
        metavar="FILE",
        help="bearer tokens, one per line: every one is accepted, the first is sent to the other replicas; "
        "re-read when the file changes (a mounted Secret)",
    )
    internal.add_argument(
        "--no-internal-auth",
        action="store_true",
        help="serve the internal endpoints to anyone who reaches them, without a credential (logged at start)",
    )
    internal.add_argument(
        "--debug-endpoints", action="store_true", help="serve /debug/fleets on the metrics port (off by default)"
    )

    routing = parser.add_argument_group("routing")
    routing.add_argument("--policy", help="routing policy (overrides the policy config file)")
    routing.add_argument("--policy-config", type=Path, help="routing policy YAML file")
    routing.add_argument("--max-attempts", type=int, default=3, help="pods tried per request (default 3)")
    routing.add_argument(
        "--upstream-calls",
        choices=[c.value for c in UpstreamCalls],
        default="auto",
        help="auto: a gRPC call per client stream (cancellable), unary requests multiplexed "
        "on shared streams; per-request; multiplexed",
    )
    routing.add_argument(
        "--streams-per-pod",
        type=int,
        default=STREAMS_PER_POD_DEFAULT,
        help="shared gRPC streams per pod for multiplexed requests",
    )
    routing.add_argument(
        "--no-upstream-http",
        action="store_true",
        help="send warm text requests over gRPC too (default: Triton HTTP when the pod's HTTP port is known; "
        "requests with weights always use gRPC)",
    )
    routing.add_argument("--seed", type=int, help="seed of the routing tie-breaks (default: random)")

    source = parser.add_argument_group("discovery (one of --fleet-config, --backend, --kubernetes)")
    source.add_argument("--fleet-config", type=Path, help="fleet YAML (base models, backends, adapters)")
    source.add_argument(
        "--backend",
        action="append",
        default=[],
        help="host:grpcport[/metricsport[/httpport]][,...] of a Triton pod (repeatable)",
    )
    source.add_argument("--base-model", help="base model name for --backend")
    source.add_argument("--adapter", action="append", default=[], help="name=task_id:artifact_dir (repeatable)")
    source.add_argument("--architecture", default="llama", help="chat template family for --backend")
    source.add_argument("--max-input-len", type=int, default=2048, help="engine maxInputLen for --backend")
    source.add_argument("--max-seq-len", type=int, default=4096, help="engine maxSeqLen for --backend")
    source.add_argument("--host-pages", type=int, help="LoRA host-cache pages per pod for --backend")
    source.add_argument("--device-pages", type=int, help="LoRA device-cache pages per pod for --backend")
    source.add_argument("--upstream-model", default=DEFAULT_UPSTREAM_MODEL, help="text-level model on the pods")
    source.add_argument("--kubernetes", action="store_true", help="watch BaseModels, Adapters, EndpointSlices")
    source.add_argument("--namespace", help="namespace to watch (default: the service account's)")

    limits = parser.add_argument_group("limits")
    limits.add_argument("--api-keys", type=Path, help="API keys file (YAML/JSON); keys are off without it")
    limits.add_argument("--max-body-bytes", type=int, default=MAX_BODY_BYTES_DEFAULT)
    limits.add_argument("--request-timeout-s", type=float, default=REQUEST_TIMEOUT_S_DEFAULT)
    limits.add_argument(
        "--header-timeout-s",
        type=float,
        default=HEADER_TIMEOUT_S_DEFAULT,
        help="HTTP: close a connection that has not sent a whole request head for this long (idle keep-alive too)",
    )
    limits.add_argument(
        "--body-timeout-s",
        type=float,
        default=BODY_TIMEOUT_S_DEFAULT,
        help="HTTP: answer 408 and close when a request body has not fully arrived within this time",
    )
    limits.add_argument(
        "--weight-store-bytes",
        type=int,
        default=DEFAULT_CAPACITY_BYTES,
        help="host memory for cached adapter weights",
    )
    limits.add_argument("--scrape-interval-s", type=float, default=SCRAPE_INTERVAL_S_DEFAULT)
    limits.add_argument("--prewarm-interval-s", type=float, default=PREWARM_INTERVAL_S_DEFAULT)
    limits.add_argument("--drain-timeout-s", type=float, default=DRAIN_TIMEOUT_S_DEFAULT)
    batch = parser.add_argument_group("batches (OpenAI Files + Batches API)")
    batch.add_argument("--batch-store", help="directory, file:// or s3://bucket/prefix of batch state (off when unset)")
    batch.add_argument(
        "--batch-concurrency", type=int, default=CONCURRENCY_DEFAULT, help="batch lines in flight at once"
    )
    batch.add_argument(
        "--batch-pod-slots",
        type=int,
        default=POD_SLOTS_DEFAULT,
        help="requests per pod up to which batch lines are admitted (interactive ones go first)",
    )
    batch.add_argument(
        "--batch-reserve-pods",
        type=_reserve_pods,
        default=0,
        help="pods that take no batch line while interactive requests come, and take those first (at most all "
        "ready pods but one); auto: sized from the interactive requests in flight",
    )
    batch.add_argument(
        "--batch-ttft-target-ms",
        type=float,
        default=None,
        help="an interactive first answer slower than this halves the batch runner's lines in flight (AIMD)",
    )
    batch.add_argument(
        "--batch-max-file-bytes",
        type=int,
        default=MAX_FILE_BYTES_DEFAULT,
        help="largest file POST /v1/files accepts (streamed; not bound by --max-body-bytes)",
    )
    batch.add_argument(
        "--batch-order",
        choices=("model", "input"),
        default="model",
        help="model: each model's lines together, so a pod loads each adapter once (default); input: file order",
    )
    parser.add_argument("--log-level", default="INFO")
    parser.set_defaults(func=run)


def _reserve_pods(value: str) -> int:
    """``--batch-reserve-pods``: a count, or ``auto`` (:data:`~trtfleet_router.routing.reserve.RESERVE_AUTO`)."""
    if value.strip().lower() == "auto":
        return RESERVE_AUTO
    try:
        count = int(value)
    except ValueError:
        count = -1
    if count < 0:
        raise argparse.ArgumentTypeError(f"a number of pods (0 or more) or auto, not {value!r}")
    return count


def _routing_config(args: argparse.Namespace) -> RoutingConfig:
    """The routing file and ``--policy``, validated once here, at start-up."""
    config = load_routing_config(args.policy_config) if args.policy_config else parse_routing_config(None)
    if args.policy:
        config = parse_routing_config({**config.model_dump(), "policy": args.policy})
    return config


def build_discovery(args: argparse.Namespace) -> Discovery:
    chosen = [bool(args.fleet_config), bool(args.backend), bool(args.kubernetes)]
    if sum(chosen) != 1:
        raise SystemExit("trtfleet router: give exactly one of --fleet-config, --backend, --kubernetes")
    if args.kubernetes:
        from trtfleet.kube import KubeConfigError, KubeSource, load_connection
        from trtfleet_router.discovery.kubeclient import KubeClient
        from trtfleet_router.discovery.kubernetes import KubernetesDiscovery

        source = KubeSource()
        try:  # before the event loop: a bad kubeconfig or a failing exec plugin stops the start-up
            connection = asyncio.run(load_connection(source))
        except KubeConfigError as exc:
            raise SystemExit(f"trtfleet router: {exc}") from exc
        tenancy = _routing_config(args).tenancy
        return KubernetesDiscovery(
            KubeClient(source, connection), args.namespace, inference_objectives=tenancy.inference_objectives
        )
    from trtfleet_router.discovery.static import StaticDiscovery, config_from_flags

    if args.fleet_config:
        return StaticDiscovery(path=args.fleet_config)
    if not args.base_model:
        raise SystemExit("trtfleet router: --backend needs --base-model")
    return StaticDiscovery(
        config=config_from_flags(
            base_model=args.base_model,
            backends=args.backend,
            adapters=args.adapter,
            architecture=args.architecture,
            max_input_len=args.max_input_len,
            max_seq_len=args.max_seq_len,
            host_pages=args.host_pages,
            device_pages=args.device_pages,
            upstream_model=args.upstream_model,
        )
    )


def _peering(args: argparse.Namespace) -> PeerSettings | None:
    if args.peer_port < 0:
        if args.peer or args.peer_dns:
            raise SystemExit("trtfleet router: --peer/--peer-dns need the peer port (--peer-port is -1)")
        return None
    named = [("--peer", url) for url in args.peer]
    if args.peer_advertise:  # the others refuse a subscription whose advertised URL is not a peer URL
        named.append(("--peer-advertise", args.peer_advertise))
    for flag, url in named:
        try:
            normalize_peer_url(url)
        except ValueError as exc:
            raise SystemExit(f"trtfleet router: {flag} {url!r}: {exc}, e.g. http://10.0.0.7:8082") from None
    return PeerSettings(
        port=args.peer_port,
        seeds=tuple(args.peer),
        dns=args.peer_dns,
        advertise_url=args.peer_advertise,
        grace_s=args.peer_grace_s,
        sync_timeout_s=args.peer_sync_timeout_s,
    )


def settings_from_args(args: argparse.Namespace) -> RouterSettings:
    return RouterSettings(
        host=args.host,
        http_port=args.http_port,
        grpc_port=None if args.grpc_port < 0 else args.grpc_port,
        metrics_port=None if args.metrics_port < 0 else args.metrics_port,
        routing=_routing_config(args),
        frontend=FrontendSettings(
            max_body_bytes=args.max_body_bytes,
            request_timeout_s=args.request_timeout_s,
            header_timeout_s=args.header_timeout_s,
            body_timeout_s=args.body_timeout_s,
        ),
        weight_store_bytes=args.weight_store_bytes,
        scrape_interval_s=args.scrape_interval_s,
        prewarm_interval_s=args.prewarm_interval_s,
        drain_timeout_s=args.drain_timeout_s,
        max_attempts=args.max_attempts,
        upstream_calls=UpstreamCalls(args.upstream_calls),
        streams_per_pod=args.streams_per_pod,
        warm_over_http=not args.no_upstream_http,
        seed=args.seed,
        api_keys_path=args.api_keys,
        peering=_peering(args),
        picker=PickerSettings(fallbacks=args.epp_fallbacks) if args.epp_port >= 0 else None,
        picker_port=args.epp_port,
        internal_token_file=args.internal_token_file,
        internal_open=args.no_internal_auth,
        debug_endpoints=args.debug_endpoints,
        batch=BatchSettings(
            store=args.batch_store,
            runner=RunnerSettings(concurrency=args.batch_concurrency, group_by_model=args.batch_order == "model"),
            pod_slots=args.batch_pod_slots,
            ttft_target_ms=args.batch_ttft_target_ms,
            reserve_pods=args.batch_reserve_pods,
            max_file_bytes=args.batch_max_file_bytes,
        ),
    )


async def serve(router: Router) -> None:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stop.set)
    await router.start()
    await stop.wait()
    await router.stop()


def run(args: argparse.Namespace) -> int:
    configure_logging(args.log_level)
    try:
        settings = settings_from_args(args)
        discovery = build_discovery(args)
        router = Router(settings, discovery)
    except ValueError as exc:
        raise SystemExit(f"trtfleet router: {exc}") from exc
    asyncio.run(serve(router))
    return 0
