"""``helm install`` with the gateway values (charts/trtfleet/ci/gateway-values.yaml) into the real control plane,
with GIE's InferencePool CRD served, so ``gateway.inferencePool.enabled: auto`` turns on as it would in a cluster
with a gateway.

* The endpoint picker's Deployment, Service, PodDisruptionBudget and RBAC are accepted and run (kwok runs the pods;
  the Service's EndpointSlice lists them); the picker's ServiceAccount reads the fleet and may do nothing else; the
  operator's may create and patch InferencePools and not delete them; without the switch it may not touch them.
* The NetworkPolicies select the picker pods and admit the pickers where they must go (peers, serving pods).
* ``trtfleet operator`` with the chart's arguments, as the chart's ServiceAccount, makes the InferencePool of a
  BaseModel in the release namespace, pointing at the chart's picker Service (InferencePoolReady True).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.cluster.helm_release import (
    IMAGE,
    Release,
    can_i,
    container,
    installed,
    peer_pods,
    pods_of,
    running_chart_operator,
    scoped_values,
)
from tests.support import inferencepool
from tests.support.controlplane import ControlPlane, eventually
from tests.support.helm import CHART, ROOT

pytestmark = pytest.mark.cluster

GATEWAY_VALUES = ("-f", str(CHART / "ci" / "gateway-values.yaml"), "--set", "gateway.inferencePool.enabled=auto")
PICKER_NEEDS = [("watch", "endpointslices.discovery.k8s.io"), ("list", "basemodels.trtfleet.io"),
                ("watch", "adapters.trtfleet.io")]
PICKER_MUST_NOT = [("patch", "basemodels.trtfleet.io"), ("watch", "batches.trtfleet.io"),
                   ("update", "leases.coordination.k8s.io"), ("get", "secrets"), ("list", "pods"),
                   ("create", "inferencepools.inference.networking.k8s.io"), ("create", "configmaps")]


@pytest.fixture
def pools_served(control_plane: ControlPlane) -> Iterator[ControlPlane]:
    with inferencepool.installed(control_plane) as cp:
        yield cp


@pytest.fixture
def gateway_release(pools_served: ControlPlane, kube_namespace: str, tmp_path: Path) -> Iterator[Release]:
    """The chart with the picker, watching its own namespace (where a pool's picker Service must be)."""
    with installed(pools_served, kube_namespace, tmp_path / "helm", *scoped_values(kube_namespace),
                   *GATEWAY_VALUES) as release:
        yield release


def test_the_picker_is_installed_runs_and_reads_only_the_fleet(gateway_release: Release) -> None:
    r, ns, cp = gateway_release, gateway_release.namespace, gateway_release.cp
    deployment = r.get("deployment", f"{r.fullname}-epp", "-n", ns)
    c = container(deployment)
    assert c["image"] == IMAGE and c["args"][:2] == ["router", "--kubernetes"]
    assert {"--epp-port=9002", "--epp-fallbacks=2", "--grpc-port=-1", f"--namespace={ns}"} <= set(c["args"])
    assert deployment["spec"]["template"]["spec"]["serviceAccountName"] == f"{r.fullname}-epp"
    conditions = {x["type"]: x["status"] for x in deployment["status"]["conditions"]}
    assert conditions["Available"] == "True"  # helm --wait, kwok runs the pods
    service = r.get("service", f"{r.fullname}-epp", "-n", ns)
    ports = [(p["port"], p["targetPort"], p["appProtocol"]) for p in service["spec"]["ports"]]
    assert ports == [(9002, "epp", "http2")]

    def ready_endpoints() -> int:
        slices = r.get("endpointslices", "-n", ns, "-l", f"kubernetes.io/service-name={r.fullname}-epp")
        return sum(1 for s in slices["items"] for e in s.get("endpoints") or []
                   if (e.get("conditions") or {}).get("ready") and (s.get("ports") or [{}])[0].get("port") == 9002)

    eventually(lambda: ready_endpoints() == deployment["spec"]["replicas"], timeout=60,
               what="the picker Service's EndpointSlice to list every picker pod on port 9002")
    assert r.get("poddisruptionbudget", f"{r.fullname}-epp", "-n", ns)["spec"]["minAvailable"] == 1

    picker = f"system:serviceaccount:{ns}:{r.fullname}-epp"
    missing = [n for n in PICKER_NEEDS if not can_i(cp, picker, n[0], n[1], ns)]
    extra = [n for n in PICKER_MUST_NOT if can_i(cp, picker, n[0], n[1], ns)]
    assert not missing and not extra, (missing, extra)
    pools = "inferencepools.inference.networking.k8s.io"
    assert can_i(cp, r.operator_sa, "create", pools, ns) and can_i(cp, r.operator_sa, "patch", pools, ns)
    assert not can_i(cp, r.operator_sa, "delete", pools, ns)  # the garbage collector deletes them


def test_without_the_switch_the_operator_may_not_touch_pools(
    pools_served: ControlPlane, kube_namespace: str, tmp_path: Path
) -> None:
    with installed(pools_served, kube_namespace, tmp_path / "helm", *scoped_values(kube_namespace)) as r:
        assert not can_i(r.cp, r.operator_sa, "create", "inferencepools.inference.networking.k8s.io", kube_namespace)
        picker = r.cp.kubectl("get", "deployment", f"{r.fullname}-epp", "-n", kube_namespace, check=False)
        assert picker.returncode != 0  # off by default, even where the CRD is served


def test_the_chart_operator_makes_the_pool_with_the_charts_picker(gateway_release: Release, tmp_path: Path) -> None:
    r, ns, cp = gateway_release, gateway_release.namespace, gateway_release.cp
    with running_chart_operator(r, ns, tmp_path):
        cp.kubectl("apply", "-n", ns, "-f", str(ROOT / "examples" / "basemodel-reference-tiny.yaml"))

        def ready() -> dict[str, str] | None:
            status = r.get("basemodel", "tiny", "-n", ns).get("status") or {}
            found = [c for c in status.get("conditions") or [] if c["type"] == "InferencePoolReady"]
            return found[0] if found and found[0]["status"] == "True" else None

        condition = eventually(ready, timeout=90, what="InferencePoolReady True")
        assert f"Service {r.fullname}-epp port 9002" in condition["message"]
        pool = r.get("inferencepool", "tiny", "-n", ns)
        assert pool["spec"]["endpointPickerRef"]["name"] == f"{r.fullname}-epp"
        assert pool["spec"]["selector"]["matchLabels"] == {"trtfleet.io/basemodel": "tiny",
                                                           "app.kubernetes.io/component": "serving"}
        cp.kubectl("delete", "basemodel", "tiny", "-n", ns, "--wait=true", "--timeout=60s")
        eventually(lambda: cp.kubectl("get", "inferencepool", "tiny", "-n", ns, check=False).returncode != 0,
                   timeout=60, what="the pool deleted with its BaseModel")


def test_the_network_policies_select_the_pickers_and_let_them_reach_the_serving_pods(
    gateway_release: Release,
) -> None:
    """Asked of the API server: the picker policy selects the picker pods only, its peer port takes the routers,
    the pickers and the operator; the routers' peer port takes the pickers; the serving pods take the pickers."""
    r, ns = gateway_release, gateway_release.namespace
    policies = {p["metadata"]["name"]: p["spec"] for p in r.get("networkpolicies", "-n", ns)["items"]}
    component = {c: pods_of(r, ns, {"app.kubernetes.io/instance": r.name, "app.kubernetes.io/component": c})
                 for c in ("router", "epp", "operator")}
    assert len(component["epp"]) == 2 and all(component.values())

    def reached(spec: dict[str, Any], port: str) -> set[str]:
        (rule,) = [rule for rule in spec["ingress"] if {"port": port, "protocol": "TCP"} in rule["ports"]]
        return set().union(*(peer_pods(r, peer) for peer in rule["from"] if "podSelector" in peer))

    def named(*components: str) -> set[str]:
        return {f"{ns}/{pod}" for c in components for pod in component[c]}

    picker = policies[f"{r.fullname}-epp"]
    assert pods_of(r, ns, picker["podSelector"]["matchLabels"]) == component["epp"]
    (gateway_rule,) = [rule for rule in picker["ingress"] if rule["ports"] == [{"port": "epp", "protocol": "TCP"}]]
    assert gateway_rule["from"] == [{"namespaceSelector": {"matchLabels": {
        "kubernetes.io/metadata.name": "gateway-system"}}}]  # networkPolicy.pickerFrom, and nobody else
    assert reached(picker, "peers") == named("router", "epp", "operator")
    assert reached(picker, "metrics") == named("operator")
    assert reached(policies[f"{r.fullname}-router"], "peers") == named("router", "epp", "operator")
    assert reached(policies[f"{r.fullname}-serving"], "http") == named("router", "epp")
