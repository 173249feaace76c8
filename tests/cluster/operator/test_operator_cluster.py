"""The operator against a real kube-apiserver + kube-controller-manager (+ kwok nodes), as a subprocess.

The Job and Deployment controllers are the real ones; this test plays the kubelet for Pods on GPU nodes
that do not exist (it writes their final status and termination message), and adds a kwok node with
the right labels when it wants serving Pods to run and become Ready.
"""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest
from trtfleet_operator.names import build_job_name

from tests.cluster.operator.harness import (
    BUILDS,
    OperatorProcess,
    adapter_doc,
    apply,
    cond,
    finish_job_pod,
    first_live_job,
    get,
    items,
    live_jobs,
    llama_doc,
    patch,
    phase,
    wait_phase,
    wait_until,
)
from tests.support.controlplane import ControlPlane

pytestmark = pytest.mark.cluster

def the_build_job(cp: ControlPlane, ns: str) -> dict[str, Any]:
    return first_live_job(cp, ns, BUILDS, "a build Job")


def serve(cp: ControlPlane, ns: str) -> None:
    """A kwok GPU node for this namespace's BaseModels and a bound engine PVC: serving Pods (and build Pods)
    are scheduled, run and become Ready (build Pods complete)."""
    engine_volume(cp, ns)
    cp.add_node(f"gpu-{ns}", gpus=8, labels={"nvidia.com/gpu.product": f"H100-{ns}"})


def engine_volume(cp: ControlPlane, ns: str, claim: str = "trtfleet-engines") -> None:
    """A static PersistentVolume pre-bound to ``claim`` (the PV controller binds them)."""
    pv = {
        "apiVersion": "v1",
        "kind": "PersistentVolume",
        "metadata": {"name": f"{claim}-{ns}"},
        "spec": {
            "capacity": {"storage": "1Ti"},
            "accessModes": ["ReadWriteMany"],
            "storageClassName": "",
            "hostPath": {"path": f"/tmp/{ns}/{claim}"},
            "claimRef": {"namespace": ns, "name": claim},
        },
    }
    pvc = {
        "apiVersion": "v1",
        "kind": "PersistentVolumeClaim",
        "metadata": {"name": claim, "namespace": ns},
        "spec": {
            "accessModes": ["ReadWriteMany"],
            "storageClassName": "",
            "volumeName": f"{claim}-{ns}",
            "resources": {"requests": {"storage": "1Ti"}},
        },
    }
    cp.kubectl("apply", "-f", "-", input=json.dumps({"apiVersion": "v1", "kind": "List", "items": [pv, pvc]}))
    wait_until(
        lambda: (get(cp, ns, "pvc", claim) or {}).get("status", {}).get("phase") == "Bound", 30, f"PVC {claim} bound"
    )


def test_build_then_serve_then_ready(operator: OperatorProcess) -> None:
    cp, ns = operator.cp, operator.namespace
    apply(cp, ns, llama_doc(ns))
    job = the_build_job(cp, ns)
    bm = wait_phase(cp, ns, "basemodel", "llama3-8b", "Building")
    engine_hash = bm["status"]["engine"]["hash"]
    assert job["metadata"]["name"] == build_job_name(engine_hash)
    assert [o["name"] for o in job["metadata"]["ownerReferences"]] == ["llama3-8b"]
    pod = job["spec"]["template"]["spec"]
    container = pod["containers"][0]
    assert container["image"] == "nvcr.io/nvidia/tritonserver:25.12-trtllm-python-py3"
    # the stock image as written; trtfleet from the init container's copy of its CLI bundle
    assert container["command"][:5] == ["/opt/trtfleet-cli/bin/trtfleet", "engines", "build", "--plan",
                                        "/plan/plan.json"]
    assert [c["name"] for c in pod["initContainers"]] == ["trtfleet-cli"]
    assert container["resources"]["limits"]["nvidia.com/gpu"] == "1"
    assert container["envFrom"] == [{"secretRef": {"name": "hf-token"}}]
    assert container["terminationMessagePolicy"] == "FallbackToLogsOnError"
    assert {v["name"] for v in pod["volumes"]} >= {"engines", "plan", "dshm", "trtfleet-cli"}
    assert job["spec"]["backoffLimit"] == 0 and job["spec"]["activeDeadlineSeconds"] > 0
    plan = json.loads(get(cp, ns, "configmap", f"trtfleet-plan-{engine_hash[:16]}")["data"]["plan.json"])
    assert plan["engineHash"] == engine_hash
    assert cond(bm, "CapacityPlanned")["status"] == "True" and bm["status"]["capacity"]["kvCacheTokens"] > 0

    finish_job_pod(cp, ns, job["metadata"]["name"], "build", exit_code=0)
    deployment = wait_until(lambda: get(cp, ns, "deployment", "llama3-8b"), 30, "the Deployment")
    service = get(cp, ns, "service", "llama3-8b")
    assert service["spec"]["clusterIP"] == "None"
    assert service["metadata"]["labels"]["trtfleet.io/basemodel"] == "llama3-8b"
    assert [p["port"] for p in service["spec"]["ports"]] == [8000, 8001, 8002]
    template = deployment["spec"]["template"]
    assert template["metadata"]["labels"]["trtfleet.io/engine-hash"] == engine_hash[:16]
    assert deployment["spec"]["strategy"]["rollingUpdate"] == {"maxUnavailable": 0, "maxSurge": 1}
    assert get(cp, ns, "pdb", "llama3-8b") is not None
    assert get(cp, ns, "configmap", f"trtfleet-engine-{engine_hash[:16]}") is not None
    assert phase(get(cp, ns, "basemodel", "llama3-8b")) in ("Pending", "Ready")

    serve(cp, ns)
    bm = wait_phase(cp, ns, "basemodel", "llama3-8b", "Ready", timeout=90)
    assert bm["status"]["readyReplicas"] == 2 and bm["status"]["observedGeneration"] == 1
    assert cond(bm, "Ready")["reason"] == "RolloutComplete"
    assert cond(bm, "EngineBuilt")["reason"] == "Built"
    reasons = {e["reason"] for e in items(cp, ns, "events") if e["involvedObject"]["kind"] == "BaseModel"}
    assert {"Building", "Built", "PhaseReady"} <= reasons
    assert 'trtfleet_operator_builds_total{result="started"} 1.0' in operator.metrics()

    # serving.replicas: no new build, the Deployment scales.
    patch(cp, ns, "basemodel", "llama3-8b", {"spec": {"serving": {"replicas": 3}}})
    wait_until(lambda: get(cp, ns, "deployment", "llama3-8b")["spec"]["replicas"] == 3, 30, "3 replicas")
    bm = wait_phase(cp, ns, "basemodel", "llama3-8b", "Ready", timeout=60)
    assert bm["status"]["readyReplicas"] == 3 and bm["status"]["observedGeneration"] == 2
    assert len(live_jobs(cp, ns, BUILDS)) == 1
    spec_hash = template["metadata"]["annotations"]["trtfleet.io/spec-hash"]
    assert (
        get(cp, ns, "deployment", "llama3-8b")["spec"]["template"]["metadata"]["annotations"]["trtfleet.io/spec-hash"]
        == spec_hash
    )

    # engine.maxBatchSize: a new engine, a new Job; the pods roll once it is built.
    patch(cp, ns, "basemodel", "llama3-8b", {"spec": {"engine": {"maxBatchSize": 128}}})
    bm = wait_phase(cp, ns, "basemodel", "llama3-8b", "Building")
    new_hash = bm["status"]["engine"]["hash"]
    assert new_hash != engine_hash
    assert cond(bm, "Ready")["status"] == "True", "the old engine keeps serving while the new one builds"
    new_job = wait_until(lambda: get(cp, ns, "job", build_job_name(new_hash)), 30, "the new build Job")
    wait_until(lambda: get(cp, ns, "job", build_job_name(engine_hash)) is None, 30, "the old Job deleted")
    assert new_job["status"].get("active", 0) + new_job["status"].get("succeeded", 0) <= 1
    wait_phase(cp, ns, "basemodel", "llama3-8b", "Ready", timeout=90)  # kwok ran the build Pod
    template = get(cp, ns, "deployment", "llama3-8b")["spec"]["template"]
    assert template["metadata"]["annotations"]["trtfleet.io/spec-hash"] != spec_hash
    assert template["metadata"]["labels"]["trtfleet.io/engine-hash"] == new_hash[:16]


def test_build_failure_reports_the_message_and_retries(operator: OperatorProcess) -> None:
    cp, ns = operator.cp, operator.namespace
    apply(cp, ns, llama_doc(ns))
    job = the_build_job(cp, ns)
    message = "trtfleet engines build failed at step 4/5 (trtllm-build) with exit code 1: CUDA out of memory"
    finish_job_pod(cp, ns, job["metadata"]["name"], "build", exit_code=1, message=message)
    bm = wait_phase(cp, ns, "basemodel", "llama3-8b", "Failed")
    built = cond(bm, "EngineBuilt")
    assert built["reason"] == "BuildRetrying" and "CUDA out of memory" in built["message"]
    warnings = [e for e in items(cp, ns, "events") if e["type"] == "Warning" and e["reason"] == "BuildRetrying"]
    assert warnings and "CUDA out of memory" in warnings[0]["message"]
    engine_hash = bm["status"]["engine"]["hash"]
    retry = wait_until(lambda: get(cp, ns, "job", build_job_name(engine_hash, 2)), 30, "attempt 2")
    assert retry["metadata"]["labels"]["trtfleet.io/build-attempt"] == "2"
    wait_until(lambda: get(cp, ns, "job", build_job_name(engine_hash)) is None, 30, "attempt 1 deleted")
    wait_phase(cp, ns, "basemodel", "llama3-8b", "Building")
    assert 'trtfleet_operator_builds_total{result="failed"} 1.0' in operator.metrics()


def test_two_basemodels_with_one_engine_share_one_job(operator: OperatorProcess) -> None:
    cp, ns = operator.cp, operator.namespace
    first = llama_doc(ns)
    second = copy.deepcopy(first)
    second["metadata"]["name"] = "llama3-8b-canary"
    second["spec"]["serving"]["replicas"] = 1
    apply(cp, ns, first)
    apply(cp, ns, second)
    wait_phase(cp, ns, "basemodel", "llama3-8b-canary", "Building")

    def owners() -> list[str] | None:
        jobs = live_jobs(cp, ns, BUILDS)
        names = sorted(o["name"] for o in jobs[0]["metadata"].get("ownerReferences", [])) if jobs else []
        return names if len(jobs) == 1 and len(names) == 2 else None

    assert wait_until(owners, 30, "one Job owned by both") == ["llama3-8b", "llama3-8b-canary"]
    a = get(cp, ns, "basemodel", "llama3-8b")["status"]["engine"]["buildJob"]
    b = get(cp, ns, "basemodel", "llama3-8b-canary")["status"]["engine"]["buildJob"]
    assert a == b == live_jobs(cp, ns, BUILDS)[0]["metadata"]["name"]
    # deleting one user keeps the build for the other.
    cp.kubectl("delete", "basemodel", "llama3-8b-canary", "-n", ns, "--wait=true", "--timeout=60s")
    wait_until(
        lambda: [o["name"] for o in live_jobs(cp, ns, BUILDS)[0]["metadata"].get("ownerReferences", [])]
        == ["llama3-8b"],
        30,
        "the Job owned by the remaining BaseModel",
    )


def test_spec_that_does_not_fit_fails_and_creates_nothing(operator: OperatorProcess) -> None:
    cp, ns = operator.cp, operator.namespace
    apply(cp, ns, llama_doc(ns, engine={"maxSeqLen": 131072, "gpu": {"product": "A10G", "count": 1}}))
    bm = wait_phase(cp, ns, "basemodel", "llama3-8b", "Failed")
    planned = cond(bm, "CapacityPlanned")
    assert (planned["status"], planned["reason"]) == ("False", "DoesNotFit")
    assert "engine.maxSeqLen 131072" in planned["message"]
    assert items(cp, ns, "jobs") == [] and items(cp, ns, "deployments") == []
    assert items(cp, ns, "services") == []


def test_merged_adapter_gets_its_own_build_and_fleet(operator: OperatorProcess) -> None:
    cp, ns = operator.cp, operator.namespace
    apply(cp, ns, llama_doc(ns))
    merged = adapter_doc(
        "sql", "llama3-8b", mode="merged", servedName="sql-merged",
        source={"uri": "s3://example-adapters/llama3/sql-lora", "revision": "3"},
    )
    apply(cp, ns, merged)
    ad = wait_phase(cp, ns, "adapter", "sql", "Converting")
    assert cond(ad, "EngineBuilt")["reason"] == "Building" and "taskId" not in ad["status"]

    def two_builds() -> list[dict[str, Any]] | None:
        jobs = live_jobs(cp, ns, BUILDS)
        return jobs if len(jobs) == 2 else None

    jobs = wait_until(two_builds, 30, "two builds")
    mine = [j for j in jobs if j["metadata"]["labels"].get("trtfleet.io/adapter") == "sql"]
    assert len(mine) == 1 and mine[0]["metadata"]["ownerReferences"][0]["kind"] == "Adapter"
    finish_job_pod(cp, ns, mine[0]["metadata"]["name"], "build", exit_code=0)
    deployment = wait_until(lambda: get(cp, ns, "deployment", "sql-merged"), 30, "the merged Deployment")
    service = get(cp, ns, "service", "sql-merged")
    labels = service["metadata"]["labels"]
    assert (labels["trtfleet.io/basemodel"], labels["trtfleet.io/adapter"], labels["trtfleet.io/role"]) == (
        "llama3-8b",
        "sql",
        "merged",
    )
    assert deployment["spec"]["selector"]["matchLabels"]["trtfleet.io/role"] == "merged"
    base_service = get(cp, ns, "service", "llama3-8b")
    assert base_service["spec"]["selector"]["trtfleet.io/role"] == "base", "base and merged pods never mix"
    serve(cp, ns)
    wait_phase(cp, ns, "adapter", "sql", "Ready", timeout=90)


PEERING_CRD = """
apiVersion: apiextensions.k8s.io/v1
kind: CustomResourceDefinition
metadata: {name: kopfpeerings.kopf.dev}
spec:
  group: kopf.dev
  scope: Namespaced
  names: {kind: KopfPeering, plural: kopfpeerings, singular: kopfpeering}
  versions:
  - name: v1
    served: true
    storage: true
    schema:
      openAPIV3Schema:
        type: object
        properties:
          status: {type: object, x-kubernetes-preserve-unknown-fields: true}
"""


def test_standby_replica_takes_over(crds: ControlPlane, kube_namespace: str, tmp_path: Path) -> None:
    cp, ns = crds, kube_namespace
    cp.kubectl("apply", "-f", "-", input=PEERING_CRD)
    cp.wait_established("kopfpeerings.kopf.dev")
    wait_until(lambda: cp.kubectl("get", "kopfpeerings", "-n", ns, check=False).returncode == 0, 30, "served")
    apply(cp, ns, "apiVersion: kopf.dev/v1\nkind: KopfPeering\nmetadata: {name: trtfleet}\n")
    (tmp_path / "active").mkdir()
    (tmp_path / "standby").mkdir()
    active = OperatorProcess(cp, ns, tmp_path / "active", extra=("--peering", "trtfleet", "--priority", "100")).start()
    standby = OperatorProcess(cp, ns, tmp_path / "standby", extra=("--peering", "trtfleet", "--standby")).start()
    try:
        apply(cp, ns, llama_doc(ns, name="first"))
        wait_phase(cp, ns, "basemodel", "first", "Building")
        assert "Handler 'reconcile'" not in standby.log_tail(400), "the standby starts paused and stays so"
        active.stop(kill=True)
        apply(cp, ns, llama_doc(ns, name="second", engine={"maxBatchSize": 32}))
        wait_phase(cp, ns, "basemodel", "second", "Building", timeout=90)  # after the peer's lease expires
        assert "Resuming operations" in standby.log_tail(400)
    finally:
        active.stop()
        standby.stop()
