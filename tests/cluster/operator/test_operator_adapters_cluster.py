"""Adapters against a real API server: task ids under contention and across a restart, conversion Jobs,
cross-object validation, and deletion ordering. Convert Jobs are pinned to a node pool that does not
exist; the test plays the kubelet and writes each pod's termination message (the manifest summary)."""

from __future__ import annotations

import json
import time
from typing import Any

import pytest
from trtfleet_operator.artifacts import ArtifactSummary

from tests.cluster.operator.harness import (
    CONVERTS,
    AsyncKube,
    OperatorProcess,
    adapter_doc,
    apply,
    apply_tiny,
    cond,
    finish_job_pod,
    get,
    items,
    live_jobs,
    wait_phase,
    wait_until,
)

pytestmark = pytest.mark.cluster

ADAPTERS = 200


def report(rank: int = 4) -> str:
    return ArtifactSummary(rank, ("attn_q", "attn_v"), "c0" * 32, 4096 * rank, "float16").to_json()


def test_200_adapters_get_distinct_task_ids_across_a_restart(operator: OperatorProcess) -> None:
    cp, ns = operator.cp, operator.namespace
    apply_tiny(cp, ns)
    wait_phase(cp, ns, "basemodel", "tiny", "Ready", timeout=60)
    names = [f"a{i:03d}" for i in range(ADAPTERS)]
    started = time.monotonic()
    cp.kubectl(
        "apply",
        "-n",
        ns,
        "-f",
        "-",
        input=json.dumps({"apiVersion": "v1", "kind": "List", "items": [adapter_doc(n) for n in names]}),
    )
    created_s = time.monotonic() - started

    def one_job_each() -> list[dict[str, Any]] | None:
        jobs = live_jobs(cp, ns, CONVERTS)
        owners = [j["metadata"]["labels"]["trtfleet.io/adapter"] for j in jobs]
        assert len(owners) == len(set(owners)), f"duplicate convert Jobs: {sorted(owners)}"
        return jobs if len(jobs) == ADAPTERS else None

    jobs = wait_until(one_job_each, 120, f"{ADAPTERS} convert Jobs")
    jobs_s = time.monotonic() - started
    kube = AsyncKube(cp)

    def finish(job_names: set[str]) -> None:
        def pending_pods() -> list[dict[str, Any]] | None:
            pods = [
                p
                for p in kube.list(ns, "v1", "Pod", CONVERTS)
                if p["metadata"]["labels"]["batch.kubernetes.io/job-name"] in job_names
                and p["status"].get("phase") == "Pending"
            ]
            assert len(pods) <= len(job_names), "more than one pod per Job"
            return pods if len(pods) == len(job_names) else None

        # The Job controller creates the pods of 200 Jobs over a few seconds: wait for one per Job.
        pods = wait_until(pending_pods, 120, "one pod per convert Job")
        kube.finish_pods(ns, pods, "convert", {name: report() for name in job_names})

    def task_ids() -> dict[str, int]:
        return {
            a["metadata"]["name"]: a["status"]["taskId"]
            for a in items(cp, ns, "adapters")
            if (a.get("status") or {}).get("taskId")
        }

    job_names = sorted(j["metadata"]["name"] for j in jobs)
    finish(set(job_names[: ADAPTERS // 2]))
    wait_until(lambda: len(task_ids()) >= ADAPTERS // 4, 120, "a quarter of the task ids")
    operator.restart(kill=True)  # mid-flight: allocations and conversions under way
    restarted_with = len(task_ids())
    finish(set(job_names[ADAPTERS // 2 :]))

    def all_ready() -> bool:
        jobs_now = live_jobs(cp, ns, CONVERTS)
        owners = [j["metadata"]["labels"]["trtfleet.io/adapter"] for j in jobs_now]
        assert len(owners) == len(set(owners)), "a second convert Job for an Adapter"
        adapters = items(cp, ns, "adapters")
        return sum((a.get("status") or {}).get("phase") == "Ready" for a in adapters) == ADAPTERS

    wait_until(all_ready, 300, f"{ADAPTERS} Adapters Ready")
    ready_s = time.monotonic() - started
    operator_cpu_s = operator.cpu_s()
    ids = task_ids()
    assert len(ids) == ADAPTERS and len(set(ids.values())) == ADAPTERS, "task ids are unique"
    counter = get(cp, ns, "basemodel", "tiny")["status"]["nextTaskId"]
    assert max(ids.values()) < counter, "the counter is past every id handed out"
    wait_until(lambda: live_jobs(cp, ns, CONVERTS) == [], 60, "finished convert Jobs cleaned up")
    sample = get(cp, ns, "adapter", "a000")
    assert sample["status"]["artifact"]["rank"] == 4 and sample["status"]["sourceKey"]
    assert sample["status"]["artifact"]["uri"].startswith("pvc://trtfleet-adapters/")
    print(
        f"\n{ADAPTERS} adapters: created in {created_s:.1f}s, all convert Jobs after {jobs_s:.1f}s, all Ready "
        f"after {ready_s:.1f}s (operator killed and restarted with {restarted_with} ids allocated; "
        f"ids 1..{max(ids.values())}, next {counter}); operator CPU {operator_cpu_s:.1f}s"
    )


def test_unknown_base_fails_creates_nothing_and_heals(operator: OperatorProcess) -> None:
    cp, ns = operator.cp, operator.namespace
    apply(cp, ns, (adapter_doc("orphan")))
    ad = wait_phase(cp, ns, "adapter", "orphan", "Failed")
    assert cond(ad, "Validated")["reason"] == "BaseModelNotFound"
    assert "tiny" in cond(ad, "Ready")["message"]
    assert items(cp, ns, "jobs") == []
    apply_tiny(cp, ns)
    wait_phase(cp, ns, "adapter", "orphan", "Converting", timeout=30)
    assert len(live_jobs(cp, ns, CONVERTS)) == 1


def test_rank_too_high_fails_without_task_id_or_jobs(operator: OperatorProcess) -> None:
    cp, ns = operator.cp, operator.namespace
    apply_tiny(cp, ns)
    apply(cp, ns, (adapter_doc("big")))
    job = wait_until(lambda: (live_jobs(cp, ns, CONVERTS) or [None])[0], 30, "the convert Job")
    finish_job_pod(cp, ns, job["metadata"]["name"], "convert", exit_code=0, message=report(rank=16))
    ad = wait_phase(cp, ns, "adapter", "big", "Failed")
    assert cond(ad, "Validated")["reason"] == "RankTooHigh"
    assert "rank 16 exceeds BaseModel tiny lora.maxRank 8" in cond(ad, "Validated")["message"]
    assert "taskId" not in ad["status"]
    wait_until(lambda: live_jobs(cp, ns, CONVERTS) == [], 30, "the convert Job deleted")
    assert get(cp, ns, "basemodel", "tiny")["status"].get("nextTaskId") is None, "no id was taken"


def test_conversion_failure_reports_the_message(operator: OperatorProcess) -> None:
    cp, ns = operator.cp, operator.namespace
    apply_tiny(cp, ns)
    apply(cp, ns, (adapter_doc("broken")))
    job = wait_until(lambda: (live_jobs(cp, ns, CONVERTS) or [None])[0], 30, "the convert Job")
    for _ in range(3):  # backoffLimit 2: three pods fail before the Job does
        finish_job_pod(
            cp,
            ns,
            job["metadata"]["name"],
            "convert",
            exit_code=1,
            message="trtfleet lora convert failed: adapter_config.json: not found",
        )
    ad = wait_phase(cp, ns, "adapter", "broken", "Failed", timeout=120)
    assert cond(ad, "Converted")["reason"] == "ConversionFailed"
    assert "adapter_config.json: not found" in cond(ad, "Converted")["message"]


def test_basemodel_deletion_waits_for_its_adapters(operator: OperatorProcess) -> None:
    cp, ns = operator.cp, operator.namespace
    apply_tiny(cp, ns)
    apply(cp, ns, (adapter_doc("keep")))
    wait_phase(cp, ns, "adapter", "keep", "Converting")
    cp.kubectl("delete", "basemodel", "tiny", "-n", ns, "--wait=false")
    blocked = wait_until(
        lambda: cond(get(cp, ns, "basemodel", "tiny"), "DeletionBlocked") or None, 30, "DeletionBlocked"
    )
    assert blocked["reason"] == "AdaptersRemaining" and "keep" in blocked["message"]
    assert "trtfleet.io/adapters" in get(cp, ns, "basemodel", "tiny")["metadata"]["finalizers"]
    cp.kubectl("delete", "adapter", "keep", "-n", ns, "--wait=true", "--timeout=30s")
    wait_until(lambda: get(cp, ns, "basemodel", "tiny") is None, 30, "the BaseModel gone")
