"""A real Envoy in front of trtfleet's endpoint picker, configured as the Gateway API inference gateways configure it.

The bootstrap (:func:`gateway_bootstrap`) follows the endpoint-picker protocol's reference setup: an ``ext_proc``
HTTP filter calling the picker over gRPC (HTTP/2) with ``FULL_DUPLEX_STREAMED`` request and response bodies and a
long ``message_timeout`` (a request may be held while its base model scales from zero), in front of an
``ORIGINAL_DST`` cluster that takes its host from the ``x-gateway-destination-endpoint`` header. The route adds
``x-gateway-destination-endpoint-served: %UPSTREAM_HOST%`` to responses, so a plain Envoy tells the picker which
pod answered (gateways that implement the protocol report it in metadata instead). With ``static_pods`` the
bootstrap is a plain Envoy load balancer over those pods instead (the benchmark's floor).

:class:`EnvoyProcess` runs the pinned binary (``make tools`` installs it: ``hack/install-envoy.sh``) on loopback.
Used by ``trtfleet demo --gateway``, the tests and the benchmarks.
"""

from __future__ import annotations

import os
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Final

import yaml

from trtfleet.demo.errors import DemoError

ROOT: Final = Path(__file__).resolve().parents[2]
ENVOY_BINARY: Final = ROOT / ".cache" / "envoy" / "bin" / "envoy"
READY_TIMEOUT_S: Final = 30.0
DESTINATION_HEADER: Final = "x-gateway-destination-endpoint"
SERVED_HEADER: Final = "x-gateway-destination-endpoint-served"


def envoy_command(config: Path, concurrency: int = 1) -> list[str]:
    """The command line that runs the pinned Envoy on ``config``."""
    return [str(envoy_binary()), "-c", str(config), "--concurrency", str(concurrency), "--log-level", "warning",
            "--disable-hot-restart"]


def write_bootstrap(bootstrap: dict[str, Any], path: Path) -> Path:
    path.write_text(yaml.safe_dump(bootstrap, sort_keys=False), encoding="utf-8")
    return path


def envoy_binary() -> Path:
    """The pinned Envoy (``TRTFLEET_ENVOY`` overrides); a clear error when it is not installed."""
    path = Path(os.environ.get("TRTFLEET_ENVOY") or ENVOY_BINARY)
    if not path.exists():
        raise DemoError(f"Envoy is not installed at {path}: run `make tools` (hack/install-envoy.sh)")
    return path


def _address(host_port: str) -> dict[str, Any]:
    host, _, port = host_port.rpartition(":")
    return {"socket_address": {"address": host or "127.0.0.1", "port_value": int(port)}}


def gateway_bootstrap(
    listen_port: int,
    admin_port: int,
    *,
    picker: str | None = None,
    static_pods: Sequence[str] = (),
    host: str = "127.0.0.1",
) -> dict[str, Any]:
    """Envoy's bootstrap: a gateway on ``host:listen_port`` whose picker is ``picker`` (host:port), or, with
    ``static_pods``, plain round-robin over those pods. The admin port listens on loopback only."""
    if (picker is None) == (not static_pods):
        raise ValueError("a gateway has either a picker or static pods")
    route: dict[str, Any] = {"cluster": "pods", "timeout": "600s"}
    filters: list[dict[str, Any]] = []
    clusters: list[dict[str, Any]] = []
    if picker is not None:
        filters.append({
            "name": "envoy.filters.http.ext_proc",
            "typed_config": {
                "@type": "type.googleapis.com/envoy.extensions.filters.http.ext_proc.v3.ExternalProcessor",
                "grpc_service": {"envoy_grpc": {"cluster_name": "picker"}, "timeout": "10s"},
                "processing_mode": {
                    "request_header_mode": "SEND",
                    "response_header_mode": "SEND",
                    "request_body_mode": "FULL_DUPLEX_STREAMED",
                    "response_body_mode": "FULL_DUPLEX_STREAMED",
                    "request_trailer_mode": "SEND",
                    "response_trailer_mode": "SEND",
                },
                "message_timeout": "1000s",
            },
        })
        clusters.append({
            "name": "pods",
            "type": "ORIGINAL_DST",
            "lb_policy": "CLUSTER_PROVIDED",
            "connect_timeout": "2s",
            "original_dst_lb_config": {"use_http_header": True, "http_header_name": DESTINATION_HEADER},
        })
        clusters.append({
            "name": "picker",
            "type": "STATIC",
            "connect_timeout": "2s",
            "typed_extension_protocol_options": {
                "envoy.extensions.upstreams.http.v3.HttpProtocolOptions": {
                    "@type": "type.googleapis.com/envoy.extensions.upstreams.http.v3.HttpProtocolOptions",
                    "explicit_http_config": {"http2_protocol_options": {}},
                }
            },
            "load_assignment": {
                "cluster_name": "picker", "endpoints": [{"lb_endpoints": [{"endpoint": {"address": _address(picker)}}]}]
            },
        })
    else:
        clusters.append({
            "name": "pods",
            "type": "STATIC",
            "lb_policy": "ROUND_ROBIN",
            "connect_timeout": "2s",
            "load_assignment": {
                "cluster_name": "pods",
                "endpoints": [{"lb_endpoints": [{"endpoint": {"address": _address(pod)}} for pod in static_pods]}],
            },
        })
    filters.append({
        "name": "envoy.filters.http.router",
        "typed_config": {"@type": "type.googleapis.com/envoy.extensions.filters.http.router.v3.Router"},
    })
    manager_type = "envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager"
    manager = {
        "@type": f"type.googleapis.com/{manager_type}",
        "stat_prefix": "gateway",
        "route_config": {
            "name": "gateway",
            "virtual_hosts": [{
                "name": "all",
                "domains": ["*"],
                "routes": [{
                    "match": {"prefix": "/"},
                    "route": route,
                    "response_headers_to_add": [{"header": {"key": SERVED_HEADER, "value": "%UPSTREAM_HOST%"}}],
                }],
            }],
        },
        "http_filters": filters,
    }
    return {
        "admin": {"address": _address(f"127.0.0.1:{admin_port}")},
        "static_resources": {
            "listeners": [{
                "name": "gateway",
                "address": _address(f"{host}:{listen_port}"),
                "filter_chains": [{"filters": [{"name": "envoy.filters.network.http_connection_manager",
                                                "typed_config": manager}]}],
            }],
            "clusters": clusters,
        },
    }


class EnvoyProcess:
    """One Envoy on loopback, with its bootstrap in ``workdir``; a context manager that waits until it is ready."""

    def __init__(self, bootstrap: dict[str, Any], workdir: Path, *, concurrency: int = 1) -> None:
        self.bootstrap = bootstrap
        self.workdir = workdir
        self.concurrency = concurrency
        self.process: subprocess.Popen[bytes] | None = None
        self.admin_url = "http://127.0.0.1:{}".format(bootstrap["admin"]["address"]["socket_address"]["port_value"])
        listener = bootstrap["static_resources"]["listeners"][0]["address"]["socket_address"]
        self.url = f"http://127.0.0.1:{listener['port_value']}"

    def __enter__(self) -> EnvoyProcess:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def start(self) -> None:
        self.workdir.mkdir(parents=True, exist_ok=True)
        config = write_bootstrap(self.bootstrap, self.workdir / "envoy.yaml")
        command = envoy_command(config, self.concurrency)
        log = (self.workdir / "envoy.log").open("wb")
        self.process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT)
        log.close()
        until = time.monotonic() + READY_TIMEOUT_S
        while time.monotonic() < until:
            if self.process.poll() is not None:
                raise DemoError(f"Envoy exited at start: {(self.workdir / 'envoy.log').read_text()[-2000:]}")
            try:
                with urllib.request.urlopen(self.admin_url + "/ready", timeout=1) as answer:
                    if answer.status == 200:
                        return
            except (urllib.error.URLError, OSError):
                pass
            time.sleep(0.05)
        self.stop()
        raise DemoError(f"Envoy was not ready within {READY_TIMEOUT_S:g} s")

    def stop(self) -> None:
        process, self.process = self.process, None
        if process is None or process.poll() is not None:
            return
        process.terminate()
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()

    def stats(self) -> dict[str, int]:
        """Envoy's counters and gauges (``/stats``), by name."""
        with urllib.request.urlopen(self.admin_url + "/stats", timeout=5) as answer:
            lines = answer.read().decode().splitlines()
        found: dict[str, int] = {}
        for line in lines:
            name, _, value = line.partition(": ")
            if value.strip().lstrip("-").isdigit():
                found[name] = int(value)
        return found
