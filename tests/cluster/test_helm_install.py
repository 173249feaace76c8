"""``helm install charts/trtfleet`` into the real control plane: the objects and the permissions.

* The chart's CRDs are accepted by kube-apiserver and Established; the Deployments, ServiceAccounts,
  RBAC and Services have the shape the chart promises, and the kwok node runs the pods behind them.
* Least privilege, asked of the API server itself (``kubectl auth can-i --as=<service account>``): the
  operator and the router get the verbs they use and nothing else (no Secrets, no RBAC, no CRDs; with
  ``watchNamespaces`` nothing outside the listed namespaces).

``test_helm_operator.py`` then runs the operator with the chart's ServiceAccount.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Sequence
from pathlib import Path

import pytest
import yaml

from tests.cluster.helm_release import (
    CRD_NAMES,
    IMAGE,
    VALUES,
    Release,
    can_i,
    container,
    env_of,
    extra_namespace,
    installed,
    scoped_values,
)
from tests.support.controlplane import ControlPlane, eventually
from tests.support.helm import CHART

pytestmark = pytest.mark.cluster

Permission = tuple[str, str, str | None]  # verb, resource, subresource


@pytest.fixture
def workload_namespace(control_plane: ControlPlane, kube_namespace: str) -> Iterator[str]:
    with extra_namespace(control_plane, f"{kube_namespace}-models") as name:
        yield name


@pytest.fixture
def default_release(control_plane: ControlPlane, kube_namespace: str, tmp_path: Path) -> Iterator[Release]:
    """The chart with its default values: cluster-wide RBAC."""
    with installed(control_plane, kube_namespace, tmp_path / "helm") as release:
        yield release


@pytest.fixture
def scoped_release(
    control_plane: ControlPlane, kube_namespace: str, workload_namespace: str, tmp_path: Path
) -> Iterator[Release]:
    """The chart watching ``workload_namespace`` only: namespaced Roles instead of ClusterRoles."""
    with installed(control_plane, kube_namespace, tmp_path / "helm", *scoped_values(workload_namespace)) as release:
        yield release


# What the operator and the router do (verb, resource, subresource); checked in the namespace they manage.
OPERATOR_NEEDS: list[Permission] = [
    ("watch", "basemodels.trtfleet.io", None),
    ("patch", "basemodels.trtfleet.io", None),
    ("patch", "basemodels.trtfleet.io", "status"),
    ("patch", "adapters.trtfleet.io", "status"),
    ("update", "adapters.trtfleet.io", "finalizers"),
    ("create", "jobs.batch", None),
    ("delete", "jobs.batch", None),
    ("create", "deployments.apps", None),
    ("patch", "deployments.apps", None),
    ("create", "services", None),
    ("create", "configmaps", None),
    ("create", "poddisruptionbudgets.policy", None),
    ("list", "pods", None),
    ("patch", "pods", None),  # the autoscaler's pod-deletion-cost before a scale-down
    ("create", "events", None),
]
OPERATOR_MUST_NOT: list[Permission] = [
    ("get", "secrets", None),
    ("delete", "secrets", None),
    ("create", "pods", None),
    ("delete", "pods", None),
    ("delete", "basemodels.trtfleet.io", None),
    ("create", "adapters.trtfleet.io", None),
    ("create", "rolebindings.rbac.authorization.k8s.io", None),
    ("create", "serviceaccounts", None),
    ("create", "persistentvolumeclaims", None),
    ("create", "pods", "exec"),
]
ROUTER_NEEDS: list[Permission] = [
    ("watch", "endpointslices.discovery.k8s.io", None),
    ("list", "basemodels.trtfleet.io", None),
    ("watch", "adapters.trtfleet.io", None),
    ("watch", "batches.trtfleet.io", None),
    ("patch", "batches.trtfleet.io", "status"),
    ("update", "leases.coordination.k8s.io", None),
]
ROUTER_MUST_NOT: list[Permission] = [
    ("get", "secrets", None),
    ("list", "pods", None),
    ("patch", "basemodels.trtfleet.io", None),
    ("patch", "adapters.trtfleet.io", "status"),
    ("patch", "batches.trtfleet.io", None),
    ("create", "configmaps", None),
    ("create", "jobs.batch", None),
]
# Nobody installed by the chart may touch RBAC or CRDs, or act as someone else.
CLUSTER_MUST_NOT = [
    ("create", "clusterroles.rbac.authorization.k8s.io"),
    ("create", "clusterrolebindings.rbac.authorization.k8s.io"),
    ("escalate", "clusterroles.rbac.authorization.k8s.io"),
    ("impersonate", "serviceaccounts"),
    ("create", "customresourcedefinitions.apiextensions.k8s.io"),
    ("delete", "namespaces"),
    ("list", "secrets"),
    ("*", "*"),
]


def assert_rbac(cp: ControlPlane, who: str, namespace: str | None,
                needs: Sequence[Permission], must_not: Sequence[Permission]) -> None:
    missing = [n for n in needs if not can_i(cp, who, n[0], n[1], namespace, n[2])]
    extra = [n for n in must_not if can_i(cp, who, n[0], n[1], namespace, n[2])]
    extra += [(v, r, None) for v, r in CLUSTER_MUST_NOT if can_i(cp, who, v, r, None)]
    assert not missing, f"{who} lacks {missing} in {namespace or 'all namespaces'}"
    assert not extra, f"{who} may {extra} in {namespace or 'all namespaces'}"


# ----------------------------------------------------------------------------------- chart objects
def test_crds_from_the_chart_are_accepted_and_established(default_release: Release) -> None:
    cp = default_release.cp
    # The chart's own CRD files, validated by the API server even when an earlier test created them.
    cp.kubectl("apply", "--server-side", "--force-conflicts", "--dry-run=server",
               "--field-manager=helm", "-f", str(CHART / "crds"))
    cp.kubectl("wait", "--for=condition=Established", "--timeout=60s", *(f"crd/{n}" for n in CRD_NAMES))
    for crd in CRD_NAMES:
        obj = default_release.get("crd", crd)
        assert obj["spec"]["group"] == "trtfleet.io"
        assert [v["name"] for v in obj["spec"]["versions"] if v["storage"]] == ["v1alpha1"]
        assert all("status" in v.get("subresources", {}) for v in obj["spec"]["versions"])
    served = cp.kubectl("api-resources", "--api-group=trtfleet.io", "-o", "name").stdout.split()
    assert set(served) == set(CRD_NAMES)


def test_operator_and_router_deployments_have_the_promised_shape(default_release: Release) -> None:
    r, ns = default_release, default_release.namespace
    operator = r.get("deployment", f"{r.fullname}-operator", "-n", ns)
    router = r.get("deployment", f"{r.fullname}-router", "-n", ns)

    assert operator["spec"]["replicas"] == 1
    assert operator["spec"]["strategy"]["type"] == "Recreate"  # never two active operators
    pod = operator["spec"]["template"]["spec"]
    assert pod["serviceAccountName"] == f"{r.fullname}-operator"
    assert pod["securityContext"]["runAsNonRoot"] is True
    c = container(operator)
    assert c["image"] == IMAGE
    assert c["args"][0] == "operator"
    assert {"--all-namespaces", "--standalone"} <= set(c["args"])
    assert f"--engine-pvc={VALUES['operator']['enginePvc']}" in c["args"]
    assert f"--artifact-pvc={VALUES['operator']['artifactPvc']}" in c["args"]
    env = env_of(c)
    assert env["TRTFLEET_WORKER_IMAGE"] == VALUES["operator"]["images"]["worker"]
    assert "TRTFLEET_RUNTIME_IMAGE" not in env and "TRTFLEET_MODELOPT_IMAGE" not in env  # stock images by default
    assert c["livenessProbe"]["httpGet"]["path"] == "/healthz"
    assert c["securityContext"]["readOnlyRootFilesystem"] is True
    assert c["securityContext"]["capabilities"]["drop"] == ["ALL"]

    assert router["spec"]["replicas"] == VALUES["router"]["replicas"]
    assert router["spec"]["strategy"]["rollingUpdate"]["maxUnavailable"] == 0
    pod = router["spec"]["template"]["spec"]
    assert pod["serviceAccountName"] == f"{r.fullname}-router"
    c = container(router)
    assert c["image"] == IMAGE
    assert c["args"][:2] == ["router", "--kubernetes"]
    assert "--policy-config=/etc/trtfleet/policy.yaml" in c["args"]
    assert {p["name"]: p["containerPort"] for p in c["ports"]} == {
        "http": 8080, "grpc": 8081, "metrics": 9090, "peers": 8082}
    assert f"--peer-dns={r.fullname}-router-peers.{ns}.svc:8082" in c["args"]  # the replicas share one view
    assert c["readinessProbe"]["httpGet"]["path"] == "/v2/health/live"  # no model pod needed
    assert "checksum/config" in router["spec"]["template"]["metadata"]["annotations"]
    policy = yaml.safe_load(r.get("configmap", f"{r.fullname}-router", "-n", ns)["data"]["policy.yaml"])
    assert policy["policy"] == VALUES["router"]["policy"]

    # kwok runs the pods: the Deployments are Available and the Service selects the router pods.
    for deployment in (operator, router):
        conditions = {c["type"]: c["status"] for c in r.get(
            "deployment", deployment["metadata"]["name"], "-n", ns)["status"]["conditions"]}
        assert conditions["Available"] == "True"
    service = r.get("service", f"{r.fullname}-router", "-n", ns)
    assert service["spec"]["type"] == "ClusterIP"
    assert {p["name"]: (p["port"], p["targetPort"]) for p in service["spec"]["ports"]} == {
        "http": (8080, "http"), "grpc": (8081, "grpc"), "metrics": (9090, "metrics")}
    assert service["spec"]["selector"].items() <= router["spec"]["template"]["metadata"]["labels"].items()
    peers = r.get("service", f"{r.fullname}-router-peers", "-n", ns)  # headless, not-ready pods listed too
    assert (peers["spec"]["clusterIP"], peers["spec"]["publishNotReadyAddresses"]) == ("None", True)
    assert peers["spec"]["selector"] == service["spec"]["selector"]

    def ready_endpoints() -> int:
        slices = r.get("endpointslices", "-n", ns, "-l", f"kubernetes.io/service-name={r.fullname}-router")
        return sum(1 for s in slices["items"] for e in s.get("endpoints") or []
                   if (e.get("conditions") or {}).get("ready"))

    eventually(lambda: ready_endpoints() == VALUES["router"]["replicas"], timeout=60,
               what="the router Service's EndpointSlice to list every router pod")

    sas = r.get("serviceaccounts", "-n", ns, "-l", f"app.kubernetes.io/instance={r.name}")
    assert sorted(s["metadata"]["name"] for s in sas["items"]) == [f"{r.fullname}-operator", f"{r.fullname}-router"]
    dashboard = r.get("configmap", f"{r.fullname}-dashboard", "-n", ns)
    assert dashboard["metadata"]["labels"]["grafana_dashboard"] == "1"
    assert json.loads(dashboard["data"]["trtfleet.json"])["panels"]


def test_default_rbac_is_cluster_wide_and_least_privilege(default_release: Release, workload_namespace: str) -> None:
    cp, r = default_release.cp, default_release
    bindings = r.get("clusterrolebindings", "-l", f"app.kubernetes.io/instance={r.name}")
    assert sorted(b["metadata"]["name"] for b in bindings["items"]) == sorted(
        [f"{r.fullname}-operator", f"{r.fullname}-operator-discovery", f"{r.fullname}-router"])
    # Any namespace, since the default install watches all of them.
    assert_rbac(cp, r.operator_sa, workload_namespace, OPERATOR_NEEDS, OPERATOR_MUST_NOT)
    assert_rbac(cp, r.router_sa, workload_namespace, ROUTER_NEEDS, ROUTER_MUST_NOT)
    # kopf's discovery needs these cluster-wide; the router needs none of them.
    for verb, resource in (("list", "customresourcedefinitions.apiextensions.k8s.io"), ("watch", "namespaces")):
        assert can_i(cp, r.operator_sa, verb, resource, None)
        assert not can_i(cp, r.router_sa, verb, resource, None)


def test_watch_namespaces_confines_rbac_to_them(scoped_release: Release, workload_namespace: str) -> None:
    cp, r = scoped_release.cp, scoped_release
    roles = r.get("roles", "-n", workload_namespace, "-l", f"app.kubernetes.io/instance={r.name}")
    assert sorted(x["metadata"]["name"] for x in roles["items"]) == [f"{r.fullname}-operator", f"{r.fullname}-router"]
    assert_rbac(cp, r.operator_sa, workload_namespace, OPERATOR_NEEDS, OPERATOR_MUST_NOT)
    assert_rbac(cp, r.router_sa, workload_namespace, ROUTER_NEEDS, ROUTER_MUST_NOT)
    # One exception, by design: the autoscaler lists this release's router pods (to read their /metrics) in
    # the release namespace, through the operator-routers Role (get, list pods there and nothing else).
    routers = ("list", "pods", None)
    for who, needs in ((r.operator_sa, OPERATOR_NEEDS), (r.router_sa, ROUTER_NEEDS)):
        outside = [n for n in needs if can_i(cp, who, n[0], n[1], r.namespace, n[2])
                   and not (who == r.operator_sa and n == routers)]
        assert not outside, f"{who} may {outside} outside the watched namespace"
        assert not can_i(cp, who, "create", "jobs.batch", None)
        assert not can_i(cp, who, "list", "basemodels.trtfleet.io", None)
    assert can_i(cp, r.operator_sa, "list", "pods", r.namespace)
    assert not any(can_i(cp, r.operator_sa, verb, "pods", r.namespace) for verb in ("watch", "delete", "create"))
    operator_args = container(r.get("deployment", f"{r.fullname}-operator", "-n", r.namespace))["args"]
    assert f"--namespace={workload_namespace}" in operator_args and "--all-namespaces" not in operator_args
    router_args = container(r.get("deployment", f"{r.fullname}-router", "-n", r.namespace))["args"]
    assert f"--namespace={workload_namespace}" in router_args
