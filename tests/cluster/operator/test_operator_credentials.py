"""The operator's client with every credential kind users have, against the real API server: an exec
plugin, inline client-certificate data, and an in-cluster service account whose token rotates (the old
one revoked) between two rounds of the operator's verbs; and ``trtfleet operator`` itself logging in
(kopf and the runtime client) through an exec-plugin kubeconfig."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from trtfleet_operator.errors import ConflictError
from trtfleet_operator.kube import KubeClient, collection_path, object_path

from tests.cluster.operator.harness import IMAGES, OperatorProcess, apply_tiny, wait_phase
from tests.support.controlplane import ControlPlane
from tests.support.kubecreds import CredentialKit
from trtfleet.api import API_VERSION
from trtfleet.kube import KubeApi, KubeSource

pytestmark = pytest.mark.cluster


@pytest.fixture
def kit(crds: ControlPlane, kube_namespace: str, tmp_path: Path) -> Iterator[CredentialKit]:
    with CredentialKit(crds, kube_namespace, tmp_path) as made:
        yield made


async def operator_verbs(client: KubeClient, namespace: str, name: str) -> None:
    """Server-side apply, get, list, a compare-and-swap status patch (and its stale repeat), an Event."""
    adapter = {
        "apiVersion": API_VERSION,
        "kind": "Adapter",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {"baseModel": "tiny", "source": {"uri": f"file:///adapters/{name}"}},
    }
    path = object_path(API_VERSION, "Adapter", namespace, name)
    applied = await client.apply(adapter)
    assert applied["metadata"]["managedFields"][0]["manager"] == client.field_manager
    current = await client.get(path)
    assert current is not None
    guarded = {"metadata": {"resourceVersion": current["metadata"]["resourceVersion"]}, "status": {"taskId": 7}}
    patched = await client.patch_merge(path, guarded, status=True)
    assert patched["status"]["taskId"] == 7
    with pytest.raises(ConflictError):
        await client.patch_merge(path, guarded, status=True)
    names = {a["metadata"]["name"] for a in await client.list(collection_path(API_VERSION, "Adapter", namespace))}
    assert name in names
    await client.event(patched, type_="Normal", reason="CredentialCheck", message=name, now="2026-01-01T00:00:00Z")


@dataclass(frozen=True)
class Case:
    """``source`` makes the credentials (token generation 1); ``rotate`` moves them to generation 2 or is None."""

    source: Callable[[CredentialKit], KubeSource]
    rotate: Callable[[CredentialKit], None] | None


def _exec_source(kit: CredentialKit) -> KubeSource:
    token_file = kit.root / "plugin-token"
    token_file.write_text(kit.token(1))
    return KubeSource(kubeconfig=str(kit.exec_kubeconfig(token_file)), environ={})


def _exec_rotate(kit: CredentialKit) -> None:
    token_file = kit.root / "plugin-token"
    old = token_file.read_text()
    token_file.write_text(kit.token(2))
    kit.revoke(1, old)


def _in_cluster_source(kit: CredentialKit) -> KubeSource:
    account, environ = kit.service_account_dir(kit.token(1))
    return KubeSource(service_account_dir=account, environ=environ)


def _in_cluster_rotate(kit: CredentialKit) -> None:
    account = kit.root / "serviceaccount"
    old = (account / "token").read_text()
    kit.rotate(account, kit.token(2))
    kit.revoke(1, old)


CASES = [
    pytest.param(Case(_exec_source, _exec_rotate), id="exec-plugin"),
    pytest.param(Case(lambda kit: KubeSource(kubeconfig=str(kit.client_cert_kubeconfig()), environ={}), None),
                 id="client-certificate-data"),
    pytest.param(Case(_in_cluster_source, _in_cluster_rotate), id="in-cluster-rotating-token"),
]


@pytest.mark.parametrize("case", CASES)
def test_operator_client_with_each_credential_kind(kit: CredentialKit, case: Case) -> None:
    source = case.source(kit)

    async def scenario() -> None:
        async with KubeClient(await KubeApi.connect(source)) as client:
            assert client.api.namespace == kit.namespace
            await operator_verbs(client, kit.namespace, "before")
            if case.rotate is not None:
                await asyncio.to_thread(case.rotate, kit)
                await operator_verbs(client, kit.namespace, "after")
                assert client.api.reloads == 1, "the revoked token's 401 made the client load the new one"

    asyncio.run(scenario())


def test_operator_logs_in_through_an_exec_plugin(kit: CredentialKit, tmp_path: Path) -> None:
    """kopf's login and the runtime client both take the plugin's token: the BaseModel reaches Ready."""
    token_file = kit.root / "plugin-token"
    token_file.write_text(kit.token(1))
    kubeconfig = kit.exec_kubeconfig(token_file)
    process = OperatorProcess(kit.cp, kit.namespace, tmp_path, env={"KUBECONFIG": str(kubeconfig), **IMAGES})
    process.start()
    try:
        apply_tiny(kit.cp, kit.namespace)
        wait_phase(kit.cp, kit.namespace, "basemodel", "tiny", "Ready", timeout=60)
    finally:
        process.stop()
    assert "Traceback" not in process.log_tail(400)
