"""The test control plane itself: real etcd + kube-apiserver + kube-controller-manager."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tests.support.controlplane import ControlPlane, eventually

pytestmark = pytest.mark.cluster


def get_json(cp: ControlPlane, *args: str) -> dict[str, Any]:
    obj: dict[str, Any] = json.loads(cp.kubectl("get", *args, "-o", "json").stdout)
    return obj


def test_version_and_namespaces(control_plane: ControlPlane) -> None:
    version = json.loads(control_plane.kubectl("version", "-o", "json").stdout)
    assert version["serverVersion"]["gitVersion"] == "v1.36.3"
    names = control_plane.kubectl("get", "ns", "-o", "name").stdout.split()
    assert {"namespace/default", "namespace/kube-system"} <= set(names)
    assert control_plane.env["KUBECONFIG"] == str(control_plane.kubeconfig)
    assert control_plane.server.startswith("https://127.0.0.1:")


DEPLOYMENT = """
apiVersion: apps/v1
kind: Deployment
metadata:
  name: web
spec:
  replicas: 2
  selector:
    matchLabels: {app: web}
  template:
    metadata:
      labels: {app: web}
    spec:
      containers:
      - name: web
        image: registry.invalid/web:1
"""


def test_deployment_gets_replicaset_and_pods(control_plane: ControlPlane, kube_namespace: str) -> None:
    control_plane.kubectl("apply", "-n", kube_namespace, "-f", "-", input=DEPLOYMENT)

    def replicaset() -> dict[str, Any] | None:
        items = get_json(control_plane, "replicasets", "-n", kube_namespace, "-l", "app=web")["items"]
        return items[0] if items else None

    rs = eventually(replicaset, what="a ReplicaSet of the Deployment")
    assert rs["metadata"]["ownerReferences"][0]["kind"] == "Deployment"
    # kube-scheduler binds the Pods to the kwok node, kwok marks them Running.
    control_plane.kubectl("wait", "-n", kube_namespace, "--for=condition=Available", "deployment/web",
                          "--timeout=60s")
    pods = get_json(control_plane, "pods", "-n", kube_namespace, "-l", "app=web")["items"]
    assert len(pods) == 2
    assert all(p["spec"].get("nodeName") for p in pods)  # kwok-node-0 or a node another test added
    assert {p["status"]["phase"] for p in pods} == {"Running"}


def test_job_runs_to_completion(control_plane: ControlPlane, kube_namespace: str) -> None:
    control_plane.kubectl("create", "job", "once", "-n", kube_namespace, "--image=registry.invalid/job:1")
    control_plane.kubectl("wait", "-n", kube_namespace, "--for=condition=Complete", "job/once",
                          "--timeout=60s")
    job = get_json(control_plane, "job", "once", "-n", kube_namespace)
    assert job["status"].get("succeeded") == 1, job["status"]
    assert any(c["type"] == "Complete" and c["status"] == "True" for c in job["status"]["conditions"])
    pods = get_json(control_plane, "pods", "-n", kube_namespace, "-l", "job-name=once")["items"]
    assert [p["status"]["phase"] for p in pods] == ["Succeeded"]


def test_gpu_requests_are_scheduled(control_plane: ControlPlane, kube_namespace: str) -> None:
    pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "gpu"}, "spec": {"containers": [{
        "name": "c", "image": "registry.invalid/gpu:1", "resources": {"limits": {"nvidia.com/gpu": "1"}}}]}}
    control_plane.kubectl("apply", "-n", kube_namespace, "-f", "-", input=json.dumps(pod))
    control_plane.kubectl("wait", "-n", kube_namespace, "--for=condition=Ready", "pod/gpu", "--timeout=60s")
    scheduled = get_json(control_plane, "pod", "gpu", "-n", kube_namespace)
    node = get_json(control_plane, "node", scheduled["spec"]["nodeName"])
    assert int(node["status"]["allocatable"].get("nvidia.com/gpu", "0")) >= 1  # bound to a node with a GPU
    assert scheduled["status"]["phase"] == "Running"


def test_owner_deletion_garbage_collects_dependents(control_plane: ControlPlane, kube_namespace: str) -> None:
    ns = kube_namespace
    control_plane.kubectl("create", "configmap", "owner", "-n", ns, "--from-literal=a=1")
    owner_uid = get_json(control_plane, "configmap", "owner", "-n", ns)["metadata"]["uid"]
    owned = {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {
            "name": "owned",
            "namespace": ns,
            "ownerReferences": [{"apiVersion": "v1", "kind": "ConfigMap", "name": "owner", "uid": owner_uid}],
        },
        "data": {"b": "2"},
    }
    control_plane.kubectl("apply", "-f", "-", input=json.dumps(owned))
    assert get_json(control_plane, "configmap", "owned", "-n", ns)["data"] == {"b": "2"}  # there before
    control_plane.kubectl("delete", "configmap", "owner", "-n", ns)

    def gone() -> bool:
        res = control_plane.kubectl("get", "configmap", "owned", "-n", ns, check=False)
        return res.returncode != 0 and "NotFound" in res.stderr

    eventually(gone, what="the garbage collector to delete the owned ConfigMap")


def test_rbac_is_enforced(control_plane: ControlPlane, kube_namespace: str) -> None:
    ns = kube_namespace
    control_plane.kubectl("create", "serviceaccount", "nobody", "-n", ns)
    user = f"system:serviceaccount:{ns}:nobody"
    can = control_plane.kubectl("auth", "can-i", "list", "pods", "-n", ns, f"--as={user}", check=False)
    assert can.stdout.strip() == "no" and can.returncode == 1
    denied = control_plane.kubectl("get", "pods", "-n", ns, f"--as={user}", check=False)
    assert denied.returncode != 0
    assert "Forbidden" in denied.stderr and user in denied.stderr

    control_plane.kubectl("create", "role", "pod-reader", "-n", ns, "--verb=get,list", "--resource=pods")
    control_plane.kubectl(
        "create",
        "rolebinding",
        "nobody-reads",
        "-n",
        ns,
        "--role=pod-reader",
        f"--serviceaccount={ns}:nobody",
    )
    assert (
        control_plane.kubectl("auth", "can-i", "list", "pods", "-n", ns, f"--as={user}").stdout.strip()
        == "yes"
    )
    assert control_plane.kubectl("get", "pods", "-n", ns, f"--as={user}").returncode == 0
    # Still nothing outside the namespace or beyond the Role's verbs.
    other = control_plane.kubectl("auth", "can-i", "delete", "pods", "-n", ns, f"--as={user}", check=False)
    assert other.stdout.strip() == "no"


def test_service_account_tokens_are_issued(
    control_plane: ControlPlane, kube_namespace: str, tmp_path: Path
) -> None:
    """The SA signing key pair works: TokenRequest returns a token the apiserver accepts."""
    ns = kube_namespace
    control_plane.kubectl("create", "serviceaccount", "bot", "-n", ns)
    token = control_plane.kubectl("create", "token", "bot", "-n", ns, "--duration=10m").stdout.strip()
    assert token.count(".") == 2  # a JWT; never printed
    kubeconfig = tmp_path / "bot.kubeconfig"
    kubeconfig.write_text(
        json.dumps(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "current-context": "bot",
                "clusters": [
                    {
                        "name": "c",
                        "cluster": {
                            "server": control_plane.server,
                            "certificate-authority": str(control_plane.pki / "ca.crt"),
                        },
                    }
                ],
                "users": [{"name": "bot", "user": {"token": token}}],
                "contexts": [{"name": "bot", "context": {"cluster": "c", "user": "bot"}}],
            }
        )
    )
    res = control_plane.kubectl("auth", "whoami", "-o", "json", kubeconfig=kubeconfig)
    assert json.loads(res.stdout)["status"]["userInfo"]["username"] == f"system:serviceaccount:{ns}:bot"


def test_simulated_node_holds_a_lease_and_stays_ready(control_plane: ControlPlane) -> None:
    # kwok renews kwok-node-0's Lease, so kube-controller-manager never marks the node Unknown (which
    # would taint it NoSchedule and mark its pods NotReady while kwok re-initialises it).
    lease = eventually(
        lambda: json.loads(out) if (out := control_plane.kubectl(
            "get", "lease", "kwok-node-0", "-n", "kube-node-lease", "-o", "json", check=False).stdout) else None,
        what="the Lease of kwok-node-0",
    )
    assert lease["spec"]["renewTime"] and lease["spec"]["leaseDurationSeconds"] == 40
    node = get_json(control_plane, "node", "kwok-node-0")
    assert not [t for t in node["spec"].get("taints") or [] if t["key"].startswith("node.kubernetes.io/")]
    ready = next(c for c in node["status"]["conditions"] if c["type"] == "Ready")
    assert ready["status"] == "True"


def test_a_port_taken_between_picking_and_binding_is_picked_again(monkeypatch: pytest.MonkeyPatch) -> None:
    """The API server's port is bound by someone else before the API server binds it (what etcd's own
    loopback connections did to a CI run): the control plane starts over on fresh ports instead of failing."""
    import socket

    from tests.support import controlplane

    taken = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    taken.bind(("127.0.0.1", 0))
    taken.listen()
    picks: list[int] = []
    real = controlplane.free_port

    def pick() -> int:
        picks.append(real() if len(picks) != 2 else taken.getsockname()[1])  # the third pick: the API port
        return picks[-1]

    monkeypatch.setattr(controlplane, "free_port", pick)
    cp = ControlPlane(controller_manager=False)
    try:
        cp.start()
        assert cp.server != f"https://127.0.0.1:{taken.getsockname()[1]}"
        assert json.loads(cp.kubectl("version", "-o", "json").stdout)["serverVersion"]["gitVersion"] == "v1.36.3"
    finally:
        cp.stop()
        taken.close()
