"""``trtfleet operator`` as the Helm chart runs it, in the real control plane.

The operator runs as a local process (kwok has no images to run its pod) with the chart's arguments and
environment, authenticated as the chart's operator ServiceAccount with a TokenRequest token, so the
chart's RBAC is what it really gets (the namespaced variant, the tighter one). ``kubectl apply -f
examples/`` (the legacy Llama one) then yields what the operator promises: a build Job and no Deployment for the GPU
BaseModel, a Deployment + headless Service for the reference BaseModel (Ready, since kwok runs its
pods), a convert Job per Adapter; deleting the examples removes all of it. Nothing provisions the engine
and adapter PersistentVolumeClaims here, so build and convert Jobs stay active: the test stops there.
"""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.cluster.helm_release import (
    IMAGE,
    TRTFLEET,
    VALUES,
    Obj,
    Release,
    container,
    extra_namespace,
    installed,
    running_chart_operator,
    scoped_values,
)
from tests.support import inferencepool
from tests.support.controlplane import ControlPlane, eventually
from tests.support.helm import ROOT

pytestmark = pytest.mark.cluster

EXAMPLES = ROOT / "examples"
# Both Llama BaseModel examples are named llama3-8b (one per runtime, for namespaces of their own): this test
# applies the legacy one with every other example.
APPLIED = [arg for path in sorted(EXAMPLES.glob("*.yaml")) if path.name != "basemodel-llama3-8b-pytorch.yaml"
           for arg in ("-f", str(path))]
PULL_SECRET = "registry-credentials"
PULLS = [{"name": PULL_SECRET}]


@pytest.fixture
def workload_namespace(control_plane: ControlPlane, kube_namespace: str) -> Iterator[str]:
    with extra_namespace(control_plane, f"{kube_namespace}-models") as name:
        yield name


@pytest.fixture
def scoped_release(
    control_plane: ControlPlane, kube_namespace: str, workload_namespace: str, tmp_path: Path
) -> Iterator[Release]:
    """The chart watching ``workload_namespace`` only (namespaced Roles instead of ClusterRoles), with a pull
    secret for a private registry."""
    values = (*scoped_values(workload_namespace), "--set", f"imagePullSecrets[0].name={PULL_SECRET}")
    with installed(control_plane, kube_namespace, tmp_path / "helm", *values) as release:
        yield release


@pytest.fixture
def chart_operator(scoped_release: Release, workload_namespace: str, tmp_path: Path) -> Iterator[Release]:
    """``trtfleet operator`` with the chart's arguments and environment, as the chart's ServiceAccount."""
    with running_chart_operator(scoped_release, workload_namespace, tmp_path):
        yield scoped_release


def owned_by(obj: Obj, kind: str, name: str) -> bool:
    return any(o["kind"] == kind and o["name"] == name for o in obj["metadata"].get("ownerReferences") or [])


def engine_hash(example: Path) -> str:
    out = subprocess.run([str(TRTFLEET), "engines", "hash", "-f", str(example)],
                         capture_output=True, text=True, check=True)
    return out.stdout.strip()


def test_operator_with_chart_rbac_creates_what_the_examples_ask_for(
    chart_operator: Release, workload_namespace: str
) -> None:
    r, ns = chart_operator, workload_namespace
    cp = r.cp
    images = VALUES["operator"]["images"]
    inferencepool.install_httproute(cp)  # examples/ holds an HTTPRoute too: a gateway's cluster has its CRD
    cp.kubectl("apply", "-n", ns, *APPLIED)

    # GPU BaseModel: one build Job named after the engine hash, no serving pods before the engine exists.
    llama_hash = engine_hash(EXAMPLES / "basemodel-llama3-8b-tensorrtllm.yaml")

    def building() -> Obj | None:
        status = r.get("basemodel", "llama3-8b", "-n", ns).get("status") or {}
        return status if status.get("phase") == "Building" else None

    status = eventually(building, timeout=60, what="BaseModel llama3-8b to be Building")
    assert status["engine"]["hash"] == llama_hash
    job = r.get("job", f"trtfleet-build-{llama_hash[:16]}", "-n", ns)
    assert owned_by(job, "BaseModel", "llama3-8b")
    pod = job["spec"]["template"]["spec"]
    assert pod["imagePullSecrets"] == PULLS  # the chart's imagePullSecrets reach the operator's pods
    # the BaseModel's own TRT-LLM image, as written; trtfleet comes from the chart's image by an init container
    assert container(job)["image"] == "nvcr.io/nvidia/tritonserver:25.12-trtllm-python-py3"
    assert container(job)["command"][0] == "/opt/trtfleet-cli/bin/trtfleet"
    assert [(c["name"], c["image"]) for c in pod["initContainers"]] == [("trtfleet-cli", IMAGE)]
    assert container(job)["resources"]["limits"]["nvidia.com/gpu"] == "1"
    assert pod["nodeSelector"] == {"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3"}
    claims = {v["persistentVolumeClaim"]["claimName"] for v in pod["volumes"] if "persistentVolumeClaim" in v}
    assert claims == {VALUES["operator"]["enginePvc"]}
    assert cp.kubectl("get", "deployment", "llama3-8b", "-n", ns, check=False).returncode != 0

    # Reference BaseModel: nothing to build; a Deployment of the worker image and a headless Service.
    def tiny_ready() -> Obj | None:
        status = r.get("basemodel", "tiny", "-n", ns).get("status") or {}
        return status if status.get("phase") == "Ready" else None

    status = eventually(tiny_ready, timeout=90, what="BaseModel tiny to be Ready (kwok runs its pods)")
    assert status["readyReplicas"] == 2
    deployment = r.get("deployment", "tiny", "-n", ns)
    assert owned_by(deployment, "BaseModel", "tiny")
    assert deployment["spec"]["replicas"] == 2
    assert deployment["spec"]["strategy"]["rollingUpdate"]["maxUnavailable"] == 0
    assert container(deployment)["image"] == images["worker"]
    assert deployment["spec"]["template"]["spec"]["imagePullSecrets"] == PULLS
    labels = deployment["spec"]["template"]["metadata"]["labels"]
    assert labels["trtfleet.io/basemodel"] == "tiny"
    service = r.get("service", "tiny", "-n", ns)
    assert service["spec"]["clusterIP"] == "None"
    assert service["spec"]["selector"].items() <= labels.items()
    assert {p["name"] for p in service["spec"]["ports"]} >= {"grpc", "metrics"}

    # Adapters: a convert Job each (the tiny ones were applied before their BaseModel and healed).
    adapters = {"llama3-sql": IMAGE, "llama3-support-qlora": IMAGE, "tiny-json": images["worker"],
                "tiny-reverse": images["worker"],
                "tiny-upper": images["worker"]}

    def convert_jobs() -> dict[str, Obj] | None:
        jobs = r.get("jobs", "-n", ns, "-l", "app.kubernetes.io/component=adapter-convert")["items"]
        found = {o["name"]: j for j in jobs for o in j["metadata"].get("ownerReferences") or []
                 if o["kind"] == "Adapter"}
        return found if set(found) == set(adapters) else None

    jobs = eventually(convert_jobs, timeout=60, what="a convert Job for every Adapter")
    for name, job in jobs.items():
        assert container(job)["image"] == adapters[name], name
        assert job["spec"]["template"]["spec"]["imagePullSecrets"] == PULLS, name
        claims = {v["persistentVolumeClaim"]["claimName"] for v in job["spec"]["template"]["spec"]["volumes"]
                  if "persistentVolumeClaim" in v}
        assert claims == {VALUES["operator"]["artifactPvc"]}, name
        adapter = r.get("adapter", name, "-n", ns)
        assert adapter["status"]["phase"] == "Converting", (name, adapter["status"])
        assert "taskId" not in adapter["status"]  # ids are handed out after a successful conversion

    # Deleting the examples deletes what the operator made for them (owner references + the GC).
    cp.kubectl("delete", "-n", ns, *APPLIED, "--wait=true", "--timeout=90s")

    def all_gone() -> bool:
        left = cp.kubectl("get", "jobs,deployments,services,configmaps,poddisruptionbudgets", "-n", ns,
                          "-l", "app.kubernetes.io/managed-by=trtfleet-operator", "-o", "name").stdout
        return left.strip() == ""

    eventually(all_gone, timeout=90, what="the garbage collector to remove the operator's objects")
