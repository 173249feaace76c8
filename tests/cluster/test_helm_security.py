"""``helm install charts/trtfleet`` into the real control plane: the internal token's Secret and the NetworkPolicies.

* The Secret holds one generated token, and ``helm upgrade`` keeps it (``lookup`` reads the live object): the one
  generated at install, and a token rotated with kubectl since, which an upgrade must not undo.
* The NetworkPolicies are accepted by kube-apiserver (installed, and again through a server-side dry run), and
  their selectors pick what they promise, asked of the API server itself (``kubectl get pods -l``): the router
  policy the router pods only, its peer-port peers the router and operator pods, the serving policy the pods of a
  serving Deployment as the operator builds it (its golden file) and neither the routers nor the operator.

The policies' effect on traffic needs a network plugin that enforces them; this control plane has none (kwok's
pods have no network), so the traffic itself is not tested here (docs/security.md).
"""

from __future__ import annotations

import base64
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.cluster.helm_release import VALUES, Release, installed, peer_pods, pods_of
from tests.support.controlplane import ControlPlane, eventually
from tests.support.helm import CHART, ROOT

pytestmark = pytest.mark.cluster

SERVING_GOLDEN = ROOT / "tests" / "golden" / "operator" / "tiny-reference" / "expected" / "deployment.yaml"


@pytest.fixture
def release(control_plane: ControlPlane, kube_namespace: str, tmp_path: Path) -> Iterator[Release]:
    with installed(control_plane, kube_namespace, tmp_path / "helm") as installed_release:
        yield installed_release


def _token_text(release: Release) -> str:
    secret = release.get("secret", f"{release.fullname}-internal", "-n", release.namespace)
    return base64.b64decode(secret["data"]["tokens"]).decode()


def _serving_deployment(namespace: str) -> dict[str, Any]:
    """The reference BaseModel's serving Deployment exactly as the operator's builder makes it (its golden file),
    here without its owner (no BaseModel exists to own it)."""
    deployment: dict[str, Any] = yaml.safe_load(SERVING_GOLDEN.read_text())
    deployment["metadata"]["namespace"] = namespace
    deployment["metadata"].pop("ownerReferences", None)
    return deployment


def test_the_generated_token_is_kept_across_upgrades_and_rotations(release: Release, tmp_path: Path) -> None:
    generated = _token_text(release)
    assert len(generated.strip()) == 48 and generated.endswith("\n")
    release.helm("upgrade", release.name, str(CHART), "--namespace", release.namespace, "--wait", "--timeout", "120s")
    assert _token_text(release) == generated
    rotated = "a-rotated-token-set-with-kubectl-01\n" + generated  # rotation step 1: new first, old kept
    patch = {"data": {"tokens": base64.b64encode(rotated.encode()).decode()}}
    release.cp.kubectl("patch", "secret", f"{release.fullname}-internal", "-n", release.namespace,
                       "--type=merge", "-p", json.dumps(patch))
    release.helm("upgrade", release.name, str(CHART), "--namespace", release.namespace, "--wait", "--timeout", "120s")
    assert _token_text(release) == rotated


def test_the_network_policies_select_the_pods_they_promise(release: Release) -> None:
    cp, ns, name = release.cp, release.namespace, release.fullname
    policies = {p["metadata"]["name"]: p for p in release.get("networkpolicies", "-n", ns)["items"]}
    assert set(policies) == {f"{name}-router", f"{name}-operator", f"{name}-serving"}
    rendered = release.helm("get", "manifest", release.name, "--namespace", ns).stdout
    manifests = [doc for doc in yaml.safe_load_all(rendered) if doc and doc["kind"] == "NetworkPolicy"]
    cp.kubectl("apply", "--dry-run=server", "-f", "-", input=yaml.safe_dump_all(manifests))

    cp.kubectl("apply", "-f", "-", input=yaml.safe_dump(_serving_deployment(ns)))
    eventually(lambda: len(pods_of(release, ns, {"trtfleet.io/basemodel": "tiny"})) == 2, timeout=60,
               what="kwok runs the serving Deployment's two pods")
    router_pods = pods_of(release, ns, {"app.kubernetes.io/instance": release.name,
                                        "app.kubernetes.io/component": "router"})
    operator_pods = pods_of(release, ns, {"app.kubernetes.io/instance": release.name,
                                          "app.kubernetes.io/component": "operator"})
    serving_pods = pods_of(release, ns, {"trtfleet.io/basemodel": "tiny"})
    assert len(router_pods) == VALUES["router"]["replicas"] and len(operator_pods) == 1

    router = policies[f"{name}-router"]["spec"]
    assert pods_of(release, ns, router["podSelector"]["matchLabels"]) == router_pods
    (peer_rule,) = [rule for rule in router["ingress"] if rule["ports"] == [{"port": "peers", "protocol": "TCP"}]]
    assert set().union(*(peer_pods(release, peer) for peer in peer_rule["from"])) == {
        f"{ns}/{pod}" for pod in router_pods | operator_pods}
    (metrics_rule,) = [rule for rule in router["ingress"] if rule["ports"] == [{"port": "metrics", "protocol": "TCP"}]]
    assert set().union(*(peer_pods(release, peer) for peer in metrics_rule["from"])) == {
        f"{ns}/{pod}" for pod in operator_pods}

    operator = policies[f"{name}-operator"]["spec"]
    assert pods_of(release, ns, operator["podSelector"]["matchLabels"]) == operator_pods
    assert not operator.get("ingress")  # nobody until Prometheus's namespace is named

    serving = policies[f"{name}-serving"]["spec"]
    assert pods_of(release, ns, serving["podSelector"]["matchLabels"]) == serving_pods
    (from_routers,) = serving["ingress"]
    assert set().union(*(peer_pods(release, peer) for peer in from_routers["from"])) == {
        f"{ns}/{pod}" for pod in router_pods}
    deployment = release.get("deployment", "tiny", "-n", ns)
    ports = {p["name"] for c in deployment["spec"]["template"]["spec"]["containers"] for p in c.get("ports", [])}
    assert {p["port"] for p in from_routers["ports"]} == {"http", "grpc", "metrics"}
    assert ports <= {"http", "grpc", "metrics"}  # every port the serving pod names is one the routers may reach
