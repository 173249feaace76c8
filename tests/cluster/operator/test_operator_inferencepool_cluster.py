"""A BaseModel's InferencePool on the real API server, with GIE's own CRD (v1.6.2, from its Go module).

``kubectl apply`` of a BaseModel makes its pool: the selector picks exactly its serving pods (kwok runs them), the
target port is their HTTP port, the picker is the Service named by ``--inference-pool-picker``, owned by the
BaseModel (deleting it deletes the pool), ``failureMode`` following the spec. Without the CRD nothing is created and
``InferencePoolReady`` says why, with no error loop; installed later, the next reconcile creates the pool.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.cluster.operator.harness import (
    OperatorProcess,
    apply,
    apply_tiny,
    cond,
    get,
    items,
    patch,
    wait_until,
)
from tests.support import inferencepool
from tests.support.controlplane import ControlPlane

pytestmark = pytest.mark.cluster

PICKER = ["--inference-pool-picker", "trtfleet-epp:9002"]
PICKER_SERVICE = {
    "apiVersion": "v1",
    "kind": "Service",
    "metadata": {"name": "trtfleet-epp"},
    "spec": {"selector": {"app.kubernetes.io/component": "epp"},
             "ports": [{"name": "epp", "port": 9002, "targetPort": 9002, "appProtocol": "http2"}]},
}


@pytest.fixture
def pools_served(crds: ControlPlane) -> Iterator[ControlPlane]:
    with inferencepool.installed(crds) as cp:
        yield cp


@pytest.fixture
def pools_not_served(crds: ControlPlane) -> Iterator[ControlPlane]:
    """A cluster that does not serve InferencePools (the CRD removed, should an earlier test have left it), and
    removed again after the test, which installs it halfway."""
    inferencepool.remove(crds)
    try:
        yield crds
    finally:
        inferencepool.remove(crds)


@pytest.fixture
def picker_operator(crds: ControlPlane, kube_namespace: str, tmp_path: Path) -> Iterator[OperatorProcess]:
    """The operator rendering InferencePools; no traceback and no failed apply in its log afterwards."""
    process = OperatorProcess(crds, kube_namespace, tmp_path, extra=PICKER).start()
    try:
        yield process
    finally:
        process.stop()
    log = "\n".join(path.read_text(errors="replace") for path in process.logs)
    assert "Traceback" not in log and "apply failed" not in log, process.log_tail(120)


def _pool_condition(cp: ControlPlane, ns: str, reason: str) -> dict[str, str]:
    def probe() -> dict[str, str] | None:
        found = cond(get(cp, ns, "basemodel", "tiny"), "InferencePoolReady")
        return found if found.get("reason") == reason else None

    try:
        return dict(wait_until(probe, 60, f"InferencePoolReady {reason}"))
    except AssertionError as exc:
        now = cond(get(cp, ns, "basemodel", "tiny"), "InferencePoolReady")
        raise AssertionError(f"{exc}; now: {json.dumps(now)}") from exc


def test_a_basemodel_gets_its_inferencepool_and_takes_it_along(
    pools_served: ControlPlane, picker_operator: OperatorProcess, kube_namespace: str
) -> None:
    cp, ns = pools_served, kube_namespace
    apply(cp, ns, {**PICKER_SERVICE, "metadata": {"name": "trtfleet-epp", "namespace": ns}})
    apply_tiny(cp, ns)
    pool = wait_until(lambda: get(cp, ns, "inferencepool", "tiny"), 60, "InferencePool tiny")
    basemodel = get(cp, ns, "basemodel", "tiny")
    assert basemodel is not None
    (owner,) = pool["metadata"]["ownerReferences"]
    assert (owner["kind"], owner["name"], owner["uid"]) == ("BaseModel", "tiny", basemodel["metadata"]["uid"])
    assert pool["spec"]["endpointPickerRef"] == {
        "group": "", "kind": "Service", "name": "trtfleet-epp", "port": {"number": 9002},
        "failureMode": "FailClose"}
    assert pool["spec"]["appProtocol"] == "http"
    ready = _pool_condition(cp, ns, "Applied")
    assert ready["status"] == "True" and "port 8000" in ready["message"]

    # The selector, asked of the API server, is exactly the serving pods, on the port they serve HTTP on.
    selector = ",".join(f"{k}={v}" for k, v in sorted(pool["spec"]["selector"]["matchLabels"].items()))
    deployment = get(cp, ns, "deployment", "tiny")
    assert deployment is not None
    replicas = deployment["spec"]["replicas"]

    def selected() -> list[dict[str, Any]] | None:
        pods = items(cp, ns, "pods", selector)
        return pods if len(pods) == replicas else None

    pods = wait_until(selected, 90, f"{replicas} serving pods selected by the pool")
    owners = {o["name"] for p in pods for o in p["metadata"]["ownerReferences"]}
    assert len(owners) == 1 and all(o.startswith("tiny-") for o in owners)  # one ReplicaSet: tiny's
    for pod in pods:
        ports = {p["name"]: p["containerPort"] for c in pod["spec"]["containers"] for p in c.get("ports", ())}
        assert [{"number": ports["http"]}] == pool["spec"]["targetPorts"]

    # Level-based: a spec change reaches the pool, and no pod rolls for it.
    template_hash = deployment["spec"]["template"]["metadata"]["annotations"]["trtfleet.io/spec-hash"]
    patch(cp, ns, "basemodel", "tiny", {"spec": {"serving": {"gateway": {"failureMode": "FailOpen"}}}})
    wait_until(lambda: (get(cp, ns, "inferencepool", "tiny") or {}).get("spec", {}).get(
        "endpointPickerRef", {}).get("failureMode") == "FailOpen", 60, "failureMode FailOpen on the pool")
    after = get(cp, ns, "deployment", "tiny")
    assert after is not None
    assert after["spec"]["template"]["metadata"]["annotations"]["trtfleet.io/spec-hash"] == template_hash

    # Deleting the BaseModel deletes its pool (ownerReferences and the garbage collector).
    cp.kubectl("delete", "basemodel", "tiny", "-n", ns, "--wait=true", "--timeout=60s")
    wait_until(lambda: get(cp, ns, "inferencepool", "tiny") is None, 60, "the garbage collector to delete the pool")


def test_without_the_crd_nothing_is_made_and_the_condition_says_why(
    pools_not_served: ControlPlane, picker_operator: OperatorProcess, kube_namespace: str
) -> None:
    cp, ns = pools_not_served, kube_namespace
    apply_tiny(cp, ns)
    missing = _pool_condition(cp, ns, "CRDNotServed")
    assert missing["status"] == "False"
    assert "install the Gateway API Inference Extension's CRD" in missing["message"]
    # Serving goes on as without pools; no InferencePool exists (the API server has no such kind).
    wait_until(lambda: get(cp, ns, "deployment", "tiny"), 60, "Deployment tiny")
    assert not inferencepool.served(cp)
    events = json.loads(cp.kubectl("get", "events", "-n", ns, "--field-selector",
                                   "reason=CRDNotServed", "-o", "json").stdout)["items"]
    assert sum(e.get("count", 1) for e in events) == 1, "one Warning, not one per resync"

    # The CRD arrives: the next reconcile makes the pool. This namespace has no picker Service: it says so.
    inferencepool.install(cp)
    wait_until(lambda: get(cp, ns, "inferencepool", "tiny"), 60, "InferencePool tiny once the CRD is served")
    elsewhere = _pool_condition(cp, ns, "PickerServiceMissing")
    assert elsewhere["status"] == "False"
    assert f"Service trtfleet-epp port 9002, does not exist in namespace {ns}" in elsewhere["message"]
    apply(cp, ns, {**PICKER_SERVICE, "metadata": {"name": "trtfleet-epp", "namespace": ns}})
    assert _pool_condition(cp, ns, "Applied")["status"] == "True"
