"""What the reconcilers read of Jobs and Pods, and the status patches they ask for."""

from __future__ import annotations

from trtfleet_operator.reconcile.types import failure_message, job_snapshot, status_patch, success_message

from tests.unit.operator.helpers import job_pod, job_status


def test_job_snapshot_reads_the_job_controller_status() -> None:
    job = {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {
            "name": "j",
            "namespace": "n",
            "labels": {"trtfleet.io/build-attempt": "3"},
            "annotations": {"trtfleet.io/engine-hash": "h"},
        },
    }
    running, done, failed = (job_snapshot(job_status(job, s)) for s in ("running", "complete", "failed"))
    assert (running.finished, running.active, running.attempt, running.engine_hash) == (False, 1, 3, "h")
    assert done.complete and not done.failed_final and done.finished_at == "2026-11-21T11:00:00Z"
    assert failed.failed_final and failed.failure_reason == "BackoffLimitExceeded"


def test_termination_messages() -> None:
    job = job_status(
        {"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": "j"}},
        "failed",
        message="Job has reached the specified backoff limit",
    )
    old = job_pod(job, "build", exit_code=1, message="first", finished_at="2026-11-21T10:00:00Z")
    new = job_pod(job, "build", exit_code=137, finished_at="2026-11-21T11:00:00Z")
    new["metadata"]["name"] = "j-second"
    snapshot = job_snapshot(job)
    assert failure_message(snapshot, [old, new], "build") == "pod j-second: exited with code 137 (Error)"
    assert failure_message(snapshot, [], "build").startswith("BackoffLimitExceeded: Job has reached")
    assert success_message([job_pod(job, "convert", exit_code=0, message=" {} \n")], "convert") == "{}"


def test_status_patch_sets_changes_and_nulls_removals_only_for_owned_keys() -> None:
    old = {"phase": "Ready", "taskId": 3, "nextTaskId": 9, "artifact": {"rank": 4}}
    new = {"phase": "Ready", "artifact": {"rank": 8}}
    assert status_patch(old, new, ("phase", "taskId", "artifact")) == {"taskId": None, "artifact": {"rank": 8}}
    assert status_patch(old, old, ("phase", "taskId")) == {}
