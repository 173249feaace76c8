"""Rollouts on a full GPU pool, against the real Deployment controller and kube-scheduler with kwok nodes.

A node pool of exactly ``replicas`` GPUs (a kwok node advertising 2 ``nvidia.com/gpu`` and the GPU product
label) runs a ``pytorch`` BaseModel of 2 one-GPU pods. A serving change then rolls the pods:

* with ``serving.rollout.strategy: Surge`` (the default) the surge pod finds no free GPU and stays Pending
  (Unschedulable), and the rollout stalls: the trap this setting exists for;
* switched to ``Replace`` the same rollout goes through one pod at a time: the Deployment never has more
  pods than replicas, and both end on the new template, Ready.

kwok runs every pod: the prepare Job's (completed at once) and the serving pods.
"""

from __future__ import annotations

import pytest

from tests.cluster.operator.harness import (
    PREPARES,
    Obj,
    OperatorProcess,
    apply,
    bound_claims,
    first_live_job,
    get,
    items,
    llama_doc,
    patch,
    wait_phase,
    wait_until,
)
from tests.support.controlplane import eventually

pytestmark = pytest.mark.cluster

SPEC_HASH = "trtfleet.io/spec-hash"


def _serving_pods(operator: OperatorProcess) -> list[Obj]:
    return [p for p in items(operator.cp, operator.namespace, "pods", "trtfleet.io/basemodel=llama3-8b")
            if not p["metadata"].get("deletionTimestamp")]


def _unschedulable(pod: Obj) -> bool:
    return any(c["type"] == "PodScheduled" and c["status"] == "False" and c.get("reason") == "Unschedulable"
               for c in pod["status"].get("conditions") or [])


def test_a_full_pool_rolls_one_pod_at_a_time_with_replace_and_stalls_with_surge(operator: OperatorProcess) -> None:
    cp, ns = operator.cp, operator.namespace
    cp.add_node(f"full-{ns}", gpus=2, labels={"nvidia.com/gpu.product": f"H100-{ns}"})
    bound_claims(cp, ns, ("trtfleet-engines", "trtfleet-adapters"))
    apply(cp, ns, llama_doc(ns, runtime="pytorch", serving={"replicas": 2, "kvCacheFreeGpuMemFraction": 0.85}))
    first_live_job(cp, ns, PREPARES, "the prepare Job")  # kwok runs and completes its pod on the pool's node
    wait_phase(cp, ns, "basemodel", "llama3-8b", "Ready", timeout=120)
    deployment = get(cp, ns, "deployment", "llama3-8b")
    assert deployment is not None
    assert deployment["spec"]["strategy"]["rollingUpdate"] == {"maxSurge": 1, "maxUnavailable": 0}
    pod_spec = deployment["spec"]["template"]["spec"]
    requests = pod_spec["containers"][0]["resources"]["requests"]
    assert requests["cpu"] == "2" and requests["memory"] == "20Gi"  # 4Gi host LoRA tier + 16Gi process
    old_hash = deployment["spec"]["template"]["metadata"]["annotations"][SPEC_HASH]

    # Surge on a full pool: the new pod waits for a GPU that never frees; the old pods keep serving.
    patch(cp, ns, "basemodel", "llama3-8b", {"spec": {"serving": {"kvCacheFreeGpuMemFraction": 0.8}}})
    stuck = wait_until(lambda: [p for p in _serving_pods(operator) if _unschedulable(p)], 90,
                       "the surge pod to be Unschedulable")
    assert len(stuck) == 1
    assert len(_serving_pods(operator)) == 3

    # Replace: the Deployment takes one old pod down, its replacement gets that GPU, and so on.
    patch(cp, ns, "basemodel", "llama3-8b", {"spec": {"serving": {"rollout": {"strategy": "Replace"}}}})
    most = 0

    def rolled() -> bool:
        nonlocal most
        pods = _serving_pods(operator)
        most = max(most, len([p for p in pods if not _unschedulable(p)]))
        current = get(cp, ns, "deployment", "llama3-8b") or {}
        new_hash = current["spec"]["template"]["metadata"]["annotations"][SPEC_HASH]
        status = current.get("status") or {}
        return (new_hash != old_hash and current["spec"]["strategy"]["rollingUpdate"] ==
                {"maxSurge": 0, "maxUnavailable": 1} and status.get("updatedReplicas") == 2
                and status.get("readyReplicas") == 2 and status.get("replicas") == 2)

    eventually(rolled, timeout=180, what="the Replace rollout to finish on the full pool")
    final = _serving_pods(operator)
    assert len(final) == 2 and not any(_unschedulable(p) for p in final)
    assert most <= 2, "no more scheduled pods than replicas at any time"
    wait_phase(cp, ns, "basemodel", "llama3-8b", "Ready", timeout=60)
