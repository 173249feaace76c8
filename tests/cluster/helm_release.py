"""A Helm release of charts/trtfleet in the test control plane, for the cluster tests of the chart.

``installed(...)`` installs the chart for the duration of a ``with`` block (``--wait``, a random
release name) and uninstalls it afterwards, checking the uninstall (no cluster-scoped leftovers, the
CRDs kept); ``scoped_values(ns)`` are the values of a release that watches one namespace.
"""

from __future__ import annotations

import base64
import json
import secrets
import signal
import subprocess
import sys
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from tests.support.controlplane import ControlPlane, eventually, free_port
from tests.support.helm import CHART, helm

CRD_NAMES = ("basemodels.trtfleet.io", "adapters.trtfleet.io", "batches.trtfleet.io")
VALUES: dict[str, Any] = yaml.safe_load((CHART / "values.yaml").read_text())
CHART_META: dict[str, Any] = yaml.safe_load((CHART / "Chart.yaml").read_text())
IMAGE = f"{VALUES['image']['repository']}:{VALUES['image']['tag'] or CHART_META['appVersion']}"
INSTALL_TIMEOUT = "120s"
TRTFLEET = Path(sys.executable).parent / "trtfleet"
OPERATOR_STOP_TIMEOUT_S = 30.0

Obj = dict[str, Any]


@dataclass
class Release:
    cp: ControlPlane
    name: str
    namespace: str
    home: Path

    @property
    def fullname(self) -> str:
        return f"{self.name}-trtfleet"

    @property
    def operator_sa(self) -> str:
        return f"system:serviceaccount:{self.namespace}:{self.fullname}-operator"

    @property
    def router_sa(self) -> str:
        return f"system:serviceaccount:{self.namespace}:{self.fullname}-router"

    def helm(self, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        return helm(*args, home=self.home, env=self.cp.env, check=check)

    def get(self, *args: str) -> Obj:
        out: Obj = json.loads(self.cp.kubectl("get", *args, "-o", "json").stdout)
        return out


def install(cp: ControlPlane, namespace: str, home: Path, *values: str) -> Release:
    # Release names never contain "trtfleet", so every object is named "<release>-trtfleet-...".
    release = Release(cp, f"r{secrets.token_hex(3)}", namespace, home)
    res = release.helm("install", release.name, str(CHART), "--namespace", namespace, "--wait",
                       "--timeout", INSTALL_TIMEOUT, *values, check=False)
    assert res.returncode == 0, f"helm install failed:\n{res.stdout}\n{res.stderr}"
    return release


def uninstall(release: Release) -> None:
    """``helm uninstall`` removes everything but the CRDs (helm never deletes those)."""
    release.helm("uninstall", release.name, "--namespace", release.namespace, "--wait",
                 "--timeout", INSTALL_TIMEOUT)
    selector = f"app.kubernetes.io/instance={release.name}"
    left = release.cp.kubectl("get", "clusterroles,clusterrolebindings", "-l", selector, "-o", "name").stdout
    assert left.strip() == "", f"cluster-scoped objects left behind by helm uninstall: {left}"
    for crd in CRD_NAMES:
        release.cp.kubectl("get", f"crd/{crd}")


@contextmanager
def installed(cp: ControlPlane, namespace: str, home: Path, *values: str) -> Iterator[Release]:
    """The chart installed (``--wait``) for the duration of the block, then uninstalled."""
    release = install(cp, namespace, home, *values)
    try:
        yield release
    finally:
        uninstall(release)


def scoped_values(namespace: str) -> tuple[str, ...]:
    """Values that make the operator and the router watch ``namespace`` only (namespaced Roles)."""
    return ("--set", f"operator.watchNamespaces={{{namespace}}}", "--set", f"router.watchNamespaces={{{namespace}}}")


@contextmanager
def extra_namespace(cp: ControlPlane, name: str) -> Iterator[str]:
    """A namespace besides the release's (for BaseModels and Adapters), deleted afterwards."""
    cp.kubectl("create", "namespace", name)
    eventually(lambda: cp.kubectl("get", "serviceaccount", "default", "-n", name, check=False).returncode == 0,
               timeout=30, what=f"ServiceAccount default in {name}")
    try:
        yield name
    finally:
        cp.kubectl("delete", "namespace", name, "--wait=false", "--ignore-not-found", check=False)


def can_i(cp: ControlPlane, who: str, verb: str, resource: str, namespace: str | None,
          subresource: str | None = None) -> bool:
    args = ["auth", "can-i", verb, resource, f"--as={who}"]
    args += ["-n", namespace] if namespace else ["--all-namespaces"]
    if subresource:
        args.append(f"--subresource={subresource}")
    res = cp.kubectl(*args, check=False)
    answer = res.stdout.strip()
    assert answer in ("yes", "no"), f"kubectl {' '.join(args)}: {res.stdout}{res.stderr}"
    return answer == "yes"


def _selector(match_labels: dict[str, str]) -> str:
    return ",".join(f"{key}={value}" for key, value in sorted(match_labels.items()))


def pods_of(release: Release, namespace: str, match_labels: dict[str, str]) -> set[str]:
    """Names of the pods of ``namespace`` that ``match_labels`` selects, as the API server selects them."""
    found = release.get("pods", "-n", namespace, "-l", _selector(match_labels))
    return {pod["metadata"]["name"] for pod in found["items"]}


def peer_pods(release: Release, peer: dict[str, Any]) -> set[str]:
    """The pods (``namespace/name``) a NetworkPolicy peer (namespaceSelector + podSelector) selects."""
    namespaces = release.get("namespaces", "-l", _selector(peer["namespaceSelector"]["matchLabels"]))["items"]
    return {
        f"{ns['metadata']['name']}/{name}"
        for ns in namespaces
        for name in pods_of(release, ns["metadata"]["name"], peer["podSelector"]["matchLabels"])
    }


def container(deployment: Obj) -> Obj:
    containers = deployment["spec"]["template"]["spec"]["containers"]
    assert len(containers) == 1
    c: Obj = containers[0]
    return c


def env_of(c: Obj) -> dict[str, str]:
    return {e["name"]: e["value"] for e in c.get("env", [])}


def service_account_kubeconfig(release: Release, account: str, path: Path) -> Path:
    """A kubeconfig that authenticates as ``account`` with a short-lived TokenRequest token."""
    cp = release.cp
    token = cp.kubectl("create", "token", account, "-n", release.namespace, "--duration=1h").stdout.strip()
    path.write_text(yaml.safe_dump({
        "apiVersion": "v1", "kind": "Config", "current-context": "sa",
        "clusters": [{"name": "c", "cluster": {"server": cp.server,
                                               "certificate-authority": str(cp.pki / "ca.crt")}}],
        "users": [{"name": account, "user": {"token": token}}],
        "contexts": [{"name": "sa", "context": {"cluster": "c", "user": account}}],
    }))
    path.chmod(0o600)
    return path


def operator_argv(
    chart_args: list[str], namespace: str, health_port: int, token_file: Path | None = None
) -> list[str]:
    """The chart's operator arguments with local ports (the pod's are taken on a shared machine) and the routers'
    token where this process reads it (the pod's mount of the Secret is ``token_file`` here; None: no router runs
    in the test, and the flag is left out)."""
    local = {"--metrics-port": "--metrics-port=0", "--health-port": f"--health-port={health_port}"}
    if token_file is not None:
        local["--router-token-file"] = f"--router-token-file={token_file}"
    argv = [local.get(a.split("=", 1)[0], a) for a in chart_args
            if token_file is not None or not a.startswith("--router-token-file")]
    assert argv[0] == "operator" and f"--namespace={namespace}" in argv, argv
    return [str(TRTFLEET), *argv]


@contextmanager
def running_chart_operator(release: Release, namespace: str, tmp_path: Path) -> Iterator[None]:
    """``trtfleet operator`` with the chart's arguments and environment, as the chart's ServiceAccount (a TokenRequest
    token), watching ``namespace``, for the duration of the block: healthy when it starts, alive and never refused by
    RBAC when it ends, then stopped cleanly after the namespace's BaseModels and Adapters are deleted (while it
    runs, so that kopf's finalizers come off)."""
    r = release
    c = container(r.get("deployment", f"{r.fullname}-operator", "-n", r.namespace))
    kubeconfig = service_account_kubeconfig(r, f"{r.fullname}-operator", tmp_path / "operator.kubeconfig")
    whoami = r.cp.kubectl("auth", "whoami", "-o", "json", kubeconfig=kubeconfig).stdout
    assert json.loads(whoami)["status"]["userInfo"]["username"] == r.operator_sa
    health = free_port()
    env = {**r.cp.env, **env_of(c), "KUBECONFIG": str(kubeconfig)}
    secret = r.get("secret", f"{r.fullname}-internal", "-n", r.namespace)  # what the chart mounts in the pod
    token_file = tmp_path / "internal-tokens"
    token_file.write_bytes(base64.b64decode(secret["data"]["tokens"]))
    log = tmp_path / "operator.log"
    with log.open("wb") as out:
        proc = subprocess.Popen(operator_argv(c["args"], namespace, health, token_file), env=env,
                                stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
    try:
        def healthy() -> bool:
            assert proc.poll() is None, f"the operator exited with {proc.returncode}:\n{log.read_text()[-4000:]}"
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{health}/healthz", timeout=2) as resp:
                    return bool(resp.status == 200)
            except OSError:
                return False

        eventually(healthy, timeout=60, what="the operator's /healthz")
        yield
        assert proc.poll() is None, f"the operator died during the test:\n{log.read_text()[-4000:]}"
        forbidden = [line for line in log.read_text().splitlines() if "Forbidden" in line or " 403" in line]
        assert not forbidden, "the chart's RBAC refused the operator:\n" + "\n".join(forbidden[:10])
    finally:
        if proc.poll() is None:
            # While the operator still runs, so that kopf's finalizers come off and the namespace can go.
            r.cp.kubectl("delete", "adapters,basemodels", "--all", "-n", namespace, "--wait=true",
                         "--timeout=60s", check=False)
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(OPERATOR_STOP_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
                raise AssertionError(f"the operator ignored SIGTERM for {OPERATOR_STOP_TIMEOUT_S}s") from None
    assert proc.returncode == 0, f"the operator stopped with {proc.returncode}:\n{log.read_text()[-4000:]}"
