"""BaseModel reconciler: observed state -> objects to apply/delete, status, events (table tests)."""

from __future__ import annotations

from datetime import timedelta

import pytest
from trtfleet_operator.config import BuildPolicy, OperatorConfig
from trtfleet_operator.names import build_job_name
from trtfleet_operator.planning import plan_engine
from trtfleet_operator.reconcile.basemodel import BaseModelObserved, deletion_blocked, reconcile_basemodel
from trtfleet_operator.reconcile.types import Reconciliation

from tests.unit.operator.helpers import (
    NOW,
    as_created,
    by_kind,
    condition,
    deployment_status,
    job_pod,
    job_status,
    llama,
    tiny,
)
from trtfleet.api import BaseModelStatus

CONFIG = OperatorConfig(build=BuildPolicy(backoff_limit=0, max_attempts=3, retry_base_s=60, retry_max_s=600))


def run(obj: dict, observed: BaseModelObserved | None = None, now=NOW) -> Reconciliation:  # type: ignore[no-untyped-def]
    result = reconcile_basemodel(obj, observed or BaseModelObserved(basemodels=(obj,)), CONFIG, now)
    BaseModelStatus.model_validate(result.status)  # always a status the CRD accepts
    return result


def first_build(obj: dict) -> tuple[dict, dict]:  # type: ignore[type-arg]
    """The plan ConfigMap and Job the first reconcile of ``obj`` creates."""
    result = run(obj)
    return by_kind(result.apply, "ConfigMap")[0], by_kind(result.apply, "Job")[0]


def test_new_basemodel_creates_one_build_job_and_waits() -> None:
    obj = llama()
    result = run(obj)
    kinds = sorted(o["kind"] for o in result.apply)
    assert kinds == ["ConfigMap", "Job", "PodDisruptionBudget", "Service"]
    job = by_kind(result.apply, "Job")[0]
    engine_hash = plan_engine_hash(obj)
    assert job["metadata"]["name"] == build_job_name(engine_hash) == f"trtfleet-build-{engine_hash[:16]}"
    assert job["spec"]["template"]["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpu"] == 1
    assert result.status["phase"] == "Building"
    assert condition(result.status, "CapacityPlanned")["status"] == "True"
    assert condition(result.status, "EngineBuilt")["reason"] == "Building"
    assert condition(result.status, "Ready")["reason"] == "WaitingForEngine"
    assert result.status["engine"]["buildJob"] == job["metadata"]["name"]
    assert result.status["observedGeneration"] == 1
    assert result.counters == ("build_started",)
    assert "Building" in {e.reason for e in result.events}
    assert not by_kind(result.apply, "Deployment")


def plan_engine_hash(obj: dict) -> str:  # type: ignore[type-arg]
    from trtfleet.api import BaseModelSpec

    return plan_engine(BaseModelSpec.model_validate(obj["spec"])).engine_hash


def test_spec_that_does_not_fit_fails_and_creates_nothing() -> None:
    obj = llama(spec={"engine": {"gpu": {"product": "A10G"}, "maxSeqLen": 131072}})
    result = run(obj)
    assert result.apply == ()
    assert result.status["phase"] == "Failed"
    planned = condition(result.status, "CapacityPlanned")
    assert (planned["status"], planned["reason"]) == ("False", "DoesNotFit")
    assert "engine.maxSeqLen 131072" in planned["message"]
    assert any(e.type == "Warning" and e.reason == "DoesNotFit" for e in result.events)


def test_unknown_gpu_is_a_capacity_failure_with_the_planner_reason() -> None:
    result = run(llama(spec={"engine": {"gpu": {"product": "Z9000"}}}))
    planned = condition(result.status, "CapacityPlanned")
    assert (result.status["phase"], planned["reason"]) == ("Failed", "UnknownGpu")
    assert "Z9000" in planned["message"]


def test_running_job_reports_progress_and_creates_nothing_new() -> None:
    obj = llama()
    cm, job = first_build(obj)
    observed = BaseModelObserved(
        basemodels=(obj,), build_jobs=(job_status(job, "running"),), plan_configmaps=(as_created(cm),)
    )
    result = run(obj, observed)
    assert not by_kind(result.apply, "Job") and not by_kind(result.apply, "ConfigMap")
    built = condition(result.status, "EngineBuilt")
    assert built["reason"] == "Building" and "1 active pod" in built["message"]
    assert result.status["phase"] == "Building"


def test_completed_job_records_the_engine_and_serves_it() -> None:
    obj = llama()
    cm, job = first_build(obj)
    observed = BaseModelObserved(
        basemodels=(obj,), build_jobs=(job_status(job, "complete"),), plan_configmaps=(as_created(cm),)
    )
    result = run(obj, observed)
    record = [c for c in by_kind(result.apply, "ConfigMap") if c["metadata"]["name"].startswith("trtfleet-engine-")]
    assert len(record) == 1 and record[0]["data"]["builtAt"] == "2026-11-21T11:00:00Z"
    deployment = by_kind(result.apply, "Deployment")[0]
    assert deployment["spec"]["replicas"] == 2
    assert result.counters[0] == "build_succeeded"
    assert condition(result.status, "EngineBuilt")["status"] == "True"
    assert result.status["engine"]["builtAt"] == "2026-11-21T11:00:00Z"
    assert result.status["phase"] == "Pending"  # rolling out


def serving_observed(obj: dict, ready: int, **kwargs) -> tuple[BaseModelObserved, dict]:  # type: ignore[no-untyped-def,type-arg]
    """Observed state with the engine recorded and the Deployment the reconciler wants, with ``ready`` pods."""
    cm, job = first_build(obj)
    built = run(obj, BaseModelObserved(basemodels=(obj,), build_jobs=(job_status(job, "complete"),)))
    record = as_created(next(c for c in built.apply if c["metadata"]["name"].startswith("trtfleet-engine-")))
    deployment = by_kind(built.apply, "Deployment")[0]
    observed = BaseModelObserved(
        basemodels=(obj,), engine_records=(record,), deployment=deployment_status(deployment, ready=ready, **kwargs)
    )
    return observed, deployment


def test_ready_when_the_rollout_is_complete() -> None:
    obj = llama()
    observed, _ = serving_observed(obj, ready=2)
    result = run(obj, observed)
    assert result.status["phase"] == "Ready"
    assert condition(result.status, "Ready")["reason"] == "RolloutComplete"
    assert result.status["readyReplicas"] == 2 and result.status["replicas"] == 2
    assert result.status["capacity"]["kvCacheTokens"] > 0
    assert not by_kind(result.apply, "Job")


@pytest.mark.parametrize(
    ("ready", "updated", "progressing", "was", "phase", "reason"),
    [
        (1, 2, "NewReplicaSetAvailable", None, "Degraded", "ReplicasUnavailable"),
        (1, 2, "ReplicaSetUpdated", "Ready", "Degraded", "ReplicasUnavailable"),
        (1, 2, "ReplicaSetUpdated", None, "Pending", "RollingOut"),
        (2, 1, "ReplicaSetUpdated", "Ready", "Pending", "RollingOut"),
        (2, 2, "NewReplicaSetAvailable", "Degraded", "Ready", "RolloutComplete"),
    ],
)
def test_rollout_states(ready: int, updated: int, progressing: str, was: str | None, phase: str, reason: str) -> None:
    obj = llama(status={"phase": was} if was else None)
    observed, _ = serving_observed(obj, ready=ready, updated=updated, progressing=progressing)
    result = run(obj, observed)
    assert (result.status["phase"], condition(result.status, "Ready")["reason"]) == (phase, reason)


def test_replicas_change_keeps_the_engine_and_the_pod_template() -> None:
    obj = llama()
    observed, deployment = serving_observed(obj, ready=2)
    scaled = llama(generation=2, spec={"serving": {"replicas": 5}})
    result = run(scaled, observed)
    new = by_kind(result.apply, "Deployment")[0]
    assert new["spec"]["replicas"] == 5
    assert new["spec"]["template"] == deployment["spec"]["template"]
    assert not by_kind(result.apply, "Job")
    assert result.status["phase"] == "Pending"


def test_engine_change_builds_anew_and_keeps_serving_the_old_engine() -> None:
    obj = llama()
    observed, deployment = serving_observed(obj, ready=2)
    bigger = llama(generation=2, spec={"engine": {"maxBatchSize": 128}})
    result = run(
        bigger,
        BaseModelObserved(basemodels=(bigger,), engine_records=observed.engine_records, deployment=observed.deployment),
    )
    job = by_kind(result.apply, "Job")[0]
    assert job["metadata"]["name"] != build_job_name(plan_engine_hash(obj))
    assert not by_kind(result.apply, "Deployment"), "the old Deployment is left serving"
    assert result.status["phase"] == "Building"
    assert "still serving engine" in condition(result.status, "Ready")["message"]
    assert condition(result.status, "Ready")["status"] == "True"


def test_new_engine_rolls_the_pods_once_built() -> None:
    obj = llama()
    _, old_deployment = serving_observed(obj, ready=2)
    bigger = llama(generation=2, spec={"engine": {"maxBatchSize": 128}})
    observed, new_deployment = serving_observed(bigger, ready=2)
    old_hash = old_deployment["spec"]["template"]["metadata"]["annotations"]["trtfleet.io/spec-hash"]
    new_hash = new_deployment["spec"]["template"]["metadata"]["annotations"]["trtfleet.io/spec-hash"]
    assert old_hash != new_hash
    assert (
        old_deployment["spec"]["template"]["metadata"]["labels"]["trtfleet.io/engine-hash"]
        != new_deployment["spec"]["template"]["metadata"]["labels"]["trtfleet.io/engine-hash"]
    )


def test_superseded_build_is_deleted_when_nobody_else_wants_it() -> None:
    obj = llama()
    cm, job = first_build(obj)
    bigger = llama(generation=2, spec={"engine": {"maxBatchSize": 128}})
    running = job_status(job, "running")
    result = run(
        bigger, BaseModelObserved(basemodels=(bigger,), build_jobs=(running,), plan_configmaps=(as_created(cm),))
    )
    deleted = {(r.kind, r.name) for r in result.delete}
    assert ("Job", job["metadata"]["name"]) in deleted
    assert ("ConfigMap", cm["metadata"]["name"]) in deleted
    assert len(by_kind(result.apply, "Job")) == 1


def test_build_shared_by_two_basemodels_is_handed_over_not_deleted() -> None:
    first, second = llama(), llama(name="llama3-8b-copy")
    cm, job = first_build(first)
    shared_job = job_status(job, "running")
    # the second BaseModel wants the same engine: it becomes an owner, no second Job.
    result = run(
        second,
        BaseModelObserved(basemodels=(first, second), build_jobs=(shared_job,), plan_configmaps=(as_created(cm),)),
    )
    assert not by_kind(result.apply, "Job")
    owners = {tuple(o["name"] for o in s.owners) for s in result.set_owners}
    assert owners == {("llama3-8b", "llama3-8b-copy")}
    # the first one changes engine: the old build stays, owned by the second only.
    shared_job["metadata"]["ownerReferences"] = list(result.set_owners[0].owners)
    bigger = llama(generation=2, spec={"engine": {"maxBatchSize": 128}})
    moved = run(
        bigger,
        BaseModelObserved(basemodels=(bigger, second), build_jobs=(shared_job,), plan_configmaps=(as_created(cm),)),
    )
    assert not [r for r in moved.delete if r.kind == "Job"]
    handed = [s for s in moved.set_owners if s.ref.kind == "Job"]
    assert [o["name"] for o in handed[0].owners] == ["llama3-8b-copy"]


def test_failed_build_reports_the_termination_message_then_retries_with_backoff() -> None:
    obj = llama()
    cm, job = first_build(obj)
    failed = job_status(job, "failed", at="2026-11-21T11:59:30Z")
    pod = job_pod(job, "build", exit_code=1, message="step 4/5 (trtllm-build) exited with code 1: out of memory")
    observed = BaseModelObserved(
        basemodels=(obj,), build_jobs=(failed,), plan_configmaps=(as_created(cm),), build_pods=(pod,)
    )
    waiting = run(obj, observed)
    built = condition(waiting.status, "EngineBuilt")
    assert waiting.status["phase"] == "Failed"
    assert built["reason"] == "BuildRetrying" and "out of memory" in built["message"]
    assert waiting.requeue_after_s == pytest.approx(30.0)
    assert "build_failed" in waiting.counters and not by_kind(waiting.apply, "Job")

    later = run(obj, observed, now=NOW + timedelta(seconds=31))
    retry = by_kind(later.apply, "Job")
    assert [j["metadata"]["name"] for j in retry] == [build_job_name(plan_engine_hash(obj), 2)]
    assert retry[0]["metadata"]["labels"]["trtfleet.io/build-attempt"] == "2"
    assert [r.name for r in later.delete] == [job["metadata"]["name"]]
    assert later.status["phase"] == "Building"


def test_retries_stop_after_max_attempts() -> None:
    obj = llama()
    _, job = first_build(obj)
    from trtfleet_operator.names import LABEL_BUILD_ATTEMPT

    assert job["metadata"]["labels"][LABEL_BUILD_ATTEMPT] == "1"  # the attempt count lives on the Job
    job["metadata"]["labels"][LABEL_BUILD_ATTEMPT] = "3"
    failed = job_status(job, "failed", message="the Job failed")
    result = run(obj, BaseModelObserved(basemodels=(obj,), build_jobs=(failed,)), now=NOW + timedelta(days=1))
    built = condition(result.status, "EngineBuilt")
    assert built["reason"] == "BuildFailed" and "no retries left" in built["message"]
    assert not by_kind(result.apply, "Job") and result.requeue_after_s is None


def test_reference_runtime_serves_without_a_build() -> None:
    obj = tiny()
    result = run(obj)
    assert not by_kind(result.apply, "Job")
    deployment = by_kind(result.apply, "Deployment")[0]
    container = deployment["spec"]["template"]["spec"]["containers"][0]
    assert container["command"] == ["trtfleet", "worker"]
    assert "nvidia.com/gpu" not in str(container.get("resources", {}))
    # numpy in the worker reads these at import: one BLAS thread, no spinning ones (reference/threads.py)
    assert {e["name"]: e["value"] for e in container["env"]} == {"OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1"}
    assert condition(result.status, "EngineBuilt")["reason"] == "NotNeeded"


def test_status_is_stable_when_nothing_changes() -> None:
    obj = llama()
    observed, _ = serving_observed(obj, ready=2)
    first = run(obj, observed)
    again = run(llama(status=first.status), observed, now=NOW + timedelta(minutes=5))
    assert again.status == first.status
    assert again.events == ()


def test_deletion_blocked_names_the_adapters() -> None:
    obj = llama(status={"phase": "Ready", "nextTaskId": 7})
    result = deletion_blocked(obj, ["b", "a"], NOW)
    blocked = condition(result.status, "DeletionBlocked")
    assert blocked["reason"] == "AdaptersRemaining" and "a, b" in blocked["message"]
    assert "nextTaskId" not in result.status
    assert result.events[0].type == "Warning"
