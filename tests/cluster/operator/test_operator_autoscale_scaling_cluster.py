"""Autoscaling on the real control plane, at a given size: ``kubectl scale`` drives ``spec.serving.replicas``
through the scale subresource, and a scale-down removes the pod whose warm adapters are worth least (the
router's per-pod warm demand, read by the operator, set as the pods' deletion cost)."""

from __future__ import annotations

import json
import subprocess
import urllib.request
from pathlib import Path
from typing import Any

import openai
import pytest
from trtfleet_operator.reconcile.deletioncost import DELETION_COST

from tests.cluster.operator.autoscale_support import (
    Router,
    autoscaling_operator,
    deployment_replicas,
    echo_upstream,
    stop_process,
    tiny,
)
from tests.cluster.operator.harness import OperatorProcess, apply, items, wait_phase, wait_until
from tests.support.controlplane import ControlPlane
from tests.unit.router.harness import write_artifact
from trtfleet.demand import parse_router_metrics

pytestmark = pytest.mark.cluster


def test_kubectl_scale_drives_the_deployment(operator: OperatorProcess) -> None:
    cp, ns = operator.cp, operator.namespace
    apply(cp, ns, tiny("fixed", 1, None))
    wait_phase(cp, ns, "basemodel", "fixed", "Ready", timeout=60)
    cp.kubectl("scale", "basemodel", "fixed", "-n", ns, "--replicas", "3")
    wait_until(lambda: deployment_replicas(cp, ns, "fixed") == (3, 3), 60, "the Deployment at 3 ready pods")

    def scale() -> dict[str, Any] | None:
        res = cp.kubectl("get", "--raw", f"/apis/trtfleet.io/v1alpha1/namespaces/{ns}/basemodels/fixed/scale")
        view = json.loads(res.stdout)
        return view if view.get("status", {}).get("replicas") == 3 else None

    view = wait_until(scale, 60, "the scale subresource to report 3 ready pods")
    assert view["spec"]["replicas"] == 3
    assert view["status"]["selector"] == "trtfleet.io/basemodel=fixed,trtfleet.io/role=base"

    # with autoscaling set, replicas is the operator's within [min, max]: out of range is refused
    apply(cp, ns, tiny("scaled", 1, {"minReplicas": 1, "maxReplicas": 2}))
    refused = cp.kubectl("scale", "basemodel", "scaled", "-n", ns, "--replicas", "5", check=False)
    assert refused.returncode != 0 and "operator's to set" in refused.stderr
    refused = cp.kubectl("apply", "-n", ns, "-f", "-", input=tiny("bad", 1, {"minReplicas": 3, "maxReplicas": 2}),
                         check=False)
    assert refused.returncode != 0 and "minReplicas must not exceed" in refused.stderr


def _warm_demand(router: Router) -> dict[str, float]:
    with urllib.request.urlopen(f"http://127.0.0.1:{router.metrics_port}/metrics", timeout=10) as response:
        return dict(parse_router_metrics(response.read().decode(), "tiny").pod_warm_demand)


def test_scale_down_removes_the_pod_whose_warm_adapters_are_worth_least(
    crds: ControlPlane, kube_namespace: str, tmp_path: Path, router: Router
) -> None:
    """Two kwok serving pods, each fronted in the router by an echo upstream named after it; adapter a1 is
    asked for, so one pod holds it warm. On the scale-down to one pod the operator sets the pods'
    deletion cost from the router's warm demand, and the ReplicaSet controller removes the other pod."""
    cp, ns = crds, kube_namespace
    operator = autoscaling_operator(cp, ns, tmp_path, router)
    echoes: list[subprocess.Popen[bytes]] = []
    try:
        apply(cp, ns, tiny("tiny", 2, None))
        wait_until(lambda: deployment_replicas(cp, ns, "tiny") == (2, 2), 90, "2 ready serving pods")
        selector = "trtfleet.io/basemodel=tiny,trtfleet.io/role=base"
        names = sorted(p["metadata"]["name"] for p in items(cp, ns, "pods", selector))
        assert len(names) == 2, names
        backends = []
        for name in names:
            echo, port = echo_upstream()
            echoes.append(echo)
            backends.append({"address": f"127.0.0.1:{port}", "podId": name})
        sha = write_artifact(tmp_path / "a1")
        router.set_backends(backends, [{"servedName": "a1", "taskId": 101, "artifact": str(tmp_path / "a1"),
                                        "sha256": sha}])
        client = openai.OpenAI(base_url=f"http://127.0.0.1:{router.http_port}/v1", api_key="x", max_retries=0,
                               timeout=60)

        answers: list[str] = []

        def ask() -> bool:
            try:
                answers.append(client.completions.create(model="a1", prompt="warm", max_tokens=8).choices[0].text)
            except openai.APIError as exc:
                answers.append(repr(exc))  # the router has not read the new fleet file yet
                return False
            return answers[-1].startswith("[101]")  # the echo upstream's answer with adapter task 101

        try:
            wait_until(ask, 30, "the router to serve a1")
        except AssertionError as exc:
            raise AssertionError(f"{answers[-3:]}\n{''.join(router.logs[-20:])}") from exc
        for _ in range(2):
            assert ask()
        warm = wait_until(lambda: (lambda w: w if set(w) == set(names) else None)(_warm_demand(router)), 30,
                          "the router's warm demand of both pods")
        hot = [name for name in names if warm[name] > 0]
        assert len(hot) == 1, warm  # the adapter-aware router kept a1 on one pod
        cold = next(name for name in names if name not in hot)

        apply(cp, ns, tiny("tiny", 2, {"minReplicas": 1, "maxReplicas": 2, "targetRequestsPerPod": 1,
                                       "scaleDownStabilizationSeconds": 2}))
        wait_until(lambda: deployment_replicas(cp, ns, "tiny") == (1, 1), 90, "the scale-down to 1 pod")
        left = wait_until(lambda: (lambda ps: ps if len(ps) == 1 else None)(
            [p for p in items(cp, ns, "pods", selector) if not p["metadata"].get("deletionTimestamp")]), 60,
            "one serving pod left")
        assert left[0]["metadata"]["name"] == hot[0], (hot, cold)
        assert left[0]["metadata"]["annotations"][DELETION_COST] == str(round(warm[hot[0]]))
    finally:
        for echo in echoes:
            stop_process(echo)
        operator.stop()
