"""Kubernetes discovery against the real kube-apiserver: BaseModels, Adapters and EndpointSlices become
the router's registry and pods, and follow updates (new pod uid/IP, adapter removed)."""

from __future__ import annotations

import asyncio
import functools
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from trtfleet_router.discovery.kubeclient import KubeClient
from trtfleet_router.discovery.kubernetes import KubernetesDiscovery
from trtfleet_router.liveview import DiscoverySnapshot

from tests.support.controlplane import ControlPlane, eventually
from tests.support.kubecreds import CredentialKit
from trtfleet.kube import KubeSource, load_connection

pytestmark = pytest.mark.cluster

ROOT = Path(__file__).resolve().parents[3]
CRD_NAMES = ("basemodels.trtfleet.io", "adapters.trtfleet.io")


@pytest.fixture(scope="module")
def crds(control_plane: ControlPlane) -> ControlPlane:
    # The real CRDs: the session's control plane is shared, so no test may swap in other schemas.
    control_plane.kubectl("apply", "--server-side", "--force-conflicts", "-f", str(ROOT / "crds"))
    control_plane.wait_established(*CRD_NAMES)

    def served(resource: str) -> bool:
        return control_plane.kubectl("get", resource, "-A", check=False).returncode == 0

    for resource in ("basemodels", "adapters"):
        eventually(functools.partial(served, resource), timeout=30, what=f"{resource} to be served")
    return control_plane


def _slice(uid: str, ip: str) -> str:
    return json.dumps(
        {
            "apiVersion": "discovery.k8s.io/v1",
            "kind": "EndpointSlice",
            "addressType": "IPv4",
            "metadata": {
                "name": "tiny-abc",
                "labels": {"trtfleet.io/basemodel": "tiny", "kubernetes.io/service-name": "tiny"},
            },
            "ports": [{"name": "grpc", "port": 8001, "protocol": "TCP"}, {"name": "metrics", "port": 8002}],
            "endpoints": [
                {
                    "addresses": [ip],
                    "conditions": {"ready": True},
                    "targetRef": {"kind": "Pod", "name": "tiny-0", "uid": uid},
                }
            ],
        }
    )


def _fleet(cp: ControlPlane, ns: str) -> None:
    """The tiny BaseModel and its adapter, both Ready, and one EndpointSlice."""
    cp.kubectl("apply", "-n", ns, "-f", str(ROOT / "examples" / "basemodel-reference-tiny.yaml"))
    cp.kubectl(
        "patch",
        "basemodel",
        "tiny",
        "-n",
        ns,
        "--subresource=status",
        "--type=merge",
        "-p",
        json.dumps({"status": {"phase": "Ready", "capacity": {"loraHostPages": 6, "loraDevicePages": 3}}}),
    )
    cp.kubectl("apply", "-n", ns, "-f", str(ROOT / "examples" / "adapter-tiny-upper.yaml"))
    cp.kubectl(
        "patch",
        "adapter",
        "tiny-upper",
        "-n",
        ns,
        "--subresource=status",
        "--type=merge",
        "-p",
        json.dumps(
            {
                "status": {
                    "phase": "Ready",
                    "taskId": 12,
                    "servedName": "tiny-upper",
                    "artifact": {
                        "uri": "s3://artifacts/tiny-upper",
                        "sha256": "ab" * 32,
                        "bytes": 4096,
                        "rank": 8,
                        "modules": ["attn_q"],
                    },
                }
            }
        ),
    )
    cp.kubectl("apply", "-n", ns, "-f", "-", input=_slice("uid-1", "10.0.0.5"))


def test_discovery_follows_the_api_server(crds: ControlPlane, kube_namespace: str) -> None:
    cp, ns = crds, kube_namespace
    _fleet(cp, ns)

    snapshots: list[DiscoverySnapshot] = []

    async def scenario() -> None:
        source = KubeSource(kubeconfig=str(cp.kubeconfig))
        client = KubeClient(source, await load_connection(source))
        discovery = KubernetesDiscovery(client, ns)
        assert not discovery.initial().registry.bases
        task = asyncio.create_task(discovery.run(snapshots.append))

        async def until(check: Any, what: str) -> DiscoverySnapshot:
            for _ in range(300):
                if snapshots and check(snapshots[-1]):
                    return snapshots[-1]
                await asyncio.sleep(0.1)
            raise AssertionError(f"discovery never showed {what}")

        try:
            first = await until(lambda s: "tiny-upper" in s.registry.adapters and s.pods.get("tiny"), "the fleet")
            base = first.registry.bases["tiny"]
            assert (base.host_pages, base.device_pages, base.limits.max_input_tokens) == (6, 3, 128)
            adapter = first.registry.adapters["tiny-upper"]
            assert (adapter.task_id, adapter.artifact_uri) == (12, "s3://artifacts/tiny-upper")
            pod = first.pods["tiny"]["tiny-0"]
            assert pod.address == "10.0.0.5:8001" and pod.metrics_url == "http://10.0.0.5:8002/metrics"
            await asyncio.to_thread(cp.kubectl, "apply", "-n", ns, "-f", "-", input=_slice("uid-2", "10.0.0.9"))
            moved = await until(lambda s: s.pods["tiny"]["tiny-0"].address == "10.0.0.9:8001", "the new pod")
            assert moved.pods["tiny"]["tiny-0"].uid != pod.uid
            await asyncio.to_thread(cp.kubectl, "delete", "adapter", "tiny-upper", "-n", ns)
            await until(lambda s: "tiny-upper" not in s.registry.adapters, "the adapter removed")
        finally:
            task.cancel()
            await client.close()

    asyncio.run(scenario())


def _objective(name: str, priority: int | None) -> str:
    spec: dict[str, Any] = {"poolRef": {"name": "tiny-pool"}}
    if priority is not None:
        spec["priority"] = priority
    return json.dumps(
        {"apiVersion": "llm-d.ai/v1alpha2", "kind": "InferenceObjective", "metadata": {"name": name}, "spec": spec}
    )


def test_inference_objectives_name_bands_where_their_crd_is_installed(crds: ControlPlane, kube_namespace: str) -> None:
    cp, ns = crds, kube_namespace
    crd = ROOT / "tests" / "fixtures" / "crds" / "inferenceobjectives.llm-d.ai.yaml"
    cp.kubectl("apply", "--server-side", "-f", str(crd))
    cp.wait_established("inferenceobjectives.llm-d.ai")
    eventually(
        lambda: cp.kubectl("get", "inferenceobjectives", "-A", check=False).returncode == 0,
        timeout=30,
        what="inferenceobjectives to be served",
    )
    _fleet(cp, ns)
    for name, priority in (("premium", 10), ("bulk", -1), ("plain", None)):
        cp.kubectl("apply", "-n", ns, "-f", "-", input=_objective(name, priority))
    snapshots: list[DiscoverySnapshot] = []
    absent: list[DiscoverySnapshot] = []

    async def scenario() -> None:
        source = KubeSource(kubeconfig=str(cp.kubeconfig))
        client = KubeClient(source, await load_connection(source))
        discovery = KubernetesDiscovery(client, ns, inference_objectives=True)
        # a group and version the API server does not serve: nothing is watched, the rest of discovery runs
        without = KubernetesDiscovery(client, ns, inference_objectives=True, objectives_api="llm-d.ai/v9")
        tasks = [asyncio.create_task(discovery.run(snapshots.append)), asyncio.create_task(without.run(absent.append))]
        try:
            seen = await _until(snapshots, lambda s: len(s.objective_priorities) == 3, "the objectives")
            assert seen.objective_priorities == {"premium": 10, "bulk": -1, "plain": 0}
            await asyncio.to_thread(cp.kubectl, "apply", "-n", ns, "-f", "-", input=_objective("bulk", 5))
            await _until(snapshots, lambda s: s.objective_priorities.get("bulk") == 5, "the changed priority")
            await asyncio.to_thread(cp.kubectl, "delete", "inferenceobjective", "premium", "-n", ns)
            await _until(snapshots, lambda s: "premium" not in s.objective_priorities, "the objective removed")
            other = await _until(absent, lambda s: "tiny" in s.registry.bases, "the fleet without objectives")
            assert other.objective_priorities == {}
        finally:
            for task in tasks:
                task.cancel()
            await client.close()

    asyncio.run(scenario())


async def _until(snapshots: list[DiscoverySnapshot], check: Any, what: str) -> DiscoverySnapshot:
    for _ in range(300):
        if snapshots and check(snapshots[-1]):
            return snapshots[-1]
        await asyncio.sleep(0.1)
    raise AssertionError(f"discovery never showed {what}")


def _exec_plugin(kit: CredentialKit) -> tuple[KubeSource, Callable[[], None]]:
    token_file = kit.root / "plugin-token"
    token_file.write_text(kit.token(1))

    def rotate() -> None:
        old = token_file.read_text()
        token_file.write_text(kit.token(2))
        kit.revoke(1, old)

    return KubeSource(kubeconfig=str(kit.exec_kubeconfig(token_file)), environ={}), rotate


def _client_certificate(kit: CredentialKit) -> tuple[KubeSource, None]:
    return KubeSource(kubeconfig=str(kit.client_cert_kubeconfig()), environ={}), None


def _in_cluster(kit: CredentialKit) -> tuple[KubeSource, Callable[[], None]]:
    account, environ = kit.service_account_dir(kit.token(1))

    def rotate() -> None:
        old = (account / "token").read_text()
        kit.rotate(account, kit.token(2))
        kit.revoke(1, old)

    return KubeSource(service_account_dir=account, environ=environ), rotate


@pytest.mark.parametrize(
    "credentials",
    [
        pytest.param(_exec_plugin, id="exec-plugin"),
        pytest.param(_client_certificate, id="client-certificate-data"),
        pytest.param(_in_cluster, id="in-cluster-rotating-token"),
    ],
)
def test_discovery_with_each_credential_kind(
    crds: ControlPlane,
    kube_namespace: str,
    tmp_path: Path,
    credentials: Callable[[CredentialKit], tuple[KubeSource, Callable[[], None] | None]],
) -> None:
    """Discovery lists and watches with the credential kind; where the token rotates (the old one revoked),
    the next request takes the new one and discovery keeps following the API server."""
    cp, ns = crds, kube_namespace
    _fleet(cp, ns)
    with CredentialKit(cp, ns, tmp_path) as kit:
        source, rotate = credentials(kit)
        snapshots: list[DiscoverySnapshot] = []

        async def scenario() -> None:
            client = KubeClient(source, await load_connection(source))
            discovery = KubernetesDiscovery(client)
            assert discovery.namespace == ns, "the namespace comes from the context or the service account"
            task = asyncio.create_task(discovery.run(snapshots.append))
            try:
                await _until(snapshots, lambda s: "tiny-upper" in s.registry.adapters, "the adapter")
                if rotate is not None:
                    await asyncio.to_thread(rotate)
                    listed = await client.list(f"/apis/trtfleet.io/v1alpha1/namespaces/{ns}/adapters")
                    assert [a["metadata"]["name"] for a in listed["items"]] == ["tiny-upper"]
                    assert client.api().reloads == 1, "the revoked token's 401 made the client load the new one"
                await asyncio.to_thread(cp.kubectl, "delete", "adapter", "tiny-upper", "-n", ns)
                await _until(snapshots, lambda s: "tiny-upper" not in s.registry.adapters, "the adapter removed")
            finally:
                task.cancel()
                await client.close()

        asyncio.run(scenario())
