"""GIE's own endpoint picker, ``lwepp``, picking from Pod objects in a real API server, for bench.gateway.

``lwepp`` (``sigs.k8s.io/gateway-api-inference-extension/cmd/lwepp``, built by ``make bench-tools`` from the same
v1.6.2 module whose InferencePool CRD the cluster tests install) watches one InferencePool and the Pods its selector
names, and answers Envoy's ``ext_proc`` stream with a round-robin pick of a ready Pod's IP and target port. It needs
a Kubernetes API server and Pods; here the API server is the tests' real one (etcd + kube-apiserver +
kube-controller-manager, ``tests/support/controlplane.py``), and the Pods are objects no kubelet runs: their status
(``Running``, ``Ready``, ``podIP`` 127.0.0.1) is written through the status subresource, as a kubelet would, so the
address lwepp picks is the benchmark's upstream on this machine.
"""

from __future__ import annotations

import contextlib
import json
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from bench.native_loadgen import free_port, wait_port  # noqa: E402
from tests.support.controlplane import ControlPlane, eventually  # noqa: E402
from tests.support.inferencepool import install  # noqa: E402

LWEPP = ROOT / ".cache" / "bench" / "bin" / "lwepp"
POOL = "bench"
LABEL = "trtfleet.io/bench"
SYNC_TIMEOUT_S = 120.0


@dataclass(frozen=True)
class Lwepp:
    address: str  # host:port of its ext_proc gRPC server
    pid: int


def find_lwepp() -> Path | None:
    return LWEPP if LWEPP.is_file() else None


def _objects(upstream: str) -> tuple[dict[str, object], dict[str, object]]:
    host, port = upstream.rsplit(":", 1)
    pod = {"apiVersion": "v1", "kind": "Pod",
           "metadata": {"name": "echo-0", "namespace": "default", "labels": {LABEL: POOL}},
           "spec": {"containers": [{"name": "echo", "image": "unused.invalid/echo:none"}]}}
    pool = {"apiVersion": "inference.networking.k8s.io/v1", "kind": "InferencePool",
            "metadata": {"name": POOL, "namespace": "default"},
            "spec": {"selector": {"matchLabels": {LABEL: POOL}}, "targetPorts": [{"number": int(port)}],
                     "endpointPickerRef": {"name": "lwepp", "port": {"number": 9002}}}}
    assert host == "127.0.0.1", f"the upstream must listen on the loopback a Pod's IP can name, not {host}"
    return pod, pool


def _mark_running(cp: ControlPlane) -> None:
    """What a kubelet would write once the container is up: the Pod runs, is ready, has an IP."""
    now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    status = {"status": {"phase": "Running", "podIP": "127.0.0.1", "podIPs": [{"ip": "127.0.0.1"}],
                         "conditions": [{"type": "Ready", "status": "True", "lastTransitionTime": now}]}}
    cp.kubectl("patch", "pod", "echo-0", "-n", "default", "--subresource=status", "--type=merge",
               "-p", json.dumps(status))


@contextlib.contextmanager
def running(upstream: str, work: Path) -> Iterator[Lwepp]:
    """lwepp picking ``upstream`` (``127.0.0.1:port``) from an InferencePool of one Pod; yields its address."""
    binary = find_lwepp()
    if binary is None:
        raise FileNotFoundError(f"{LWEPP} not built: make bench-tools")
    with ControlPlane(work / "control-plane") as cp:
        install(cp)
        eventually(lambda: cp.kubectl("get", "serviceaccount", "default", "-n", "default", check=False).returncode == 0,
                   timeout=SYNC_TIMEOUT_S, what="the controller-manager's default ServiceAccount")
        pod, pool = _objects(upstream)
        cp.kubectl("apply", "-f", "-", input=json.dumps({"apiVersion": "v1", "kind": "List", "items": [pod, pool]}))
        _mark_running(cp)
        grpc_port = free_port()
        with (work / "lwepp.log").open("wb") as log:  # the child keeps its own descriptor
            process = subprocess.Popen(
                [str(binary), "--pool-name", POOL, "--pool-namespace", "default", "--grpc-port", str(grpc_port),
                 "--grpc-health-port", str(free_port()), "--metrics-port", str(free_port()), "--secure-serving=false",
                 "--zap-devel=false", "--zap-log-level=error"],
                env=cp.env, stdout=log, stderr=subprocess.STDOUT)
        try:
            wait_port(grpc_port)
            yield Lwepp(f"127.0.0.1:{grpc_port}", process.pid)
        finally:
            process.terminate()
            try:
                process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()


def wait_synced(probe: Callable[[], None]) -> None:
    """Until ``probe`` (a request through Envoy and lwepp) passes: lwepp answers 503 until its caches synced."""

    def passes() -> bool:
        try:
            probe()
        except (OSError, RuntimeError):
            return False
        return True

    eventually(passes, timeout=SYNC_TIMEOUT_S, what="lwepp to pick the benchmark's Pod")
