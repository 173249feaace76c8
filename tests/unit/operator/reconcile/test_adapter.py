"""Adapter reconciler: base model, convert Job and its report -> Job, status, task-id request."""

from __future__ import annotations

import json
from typing import Any

import pytest
from trtfleet_operator.artifacts import ArtifactSummary
from trtfleet_operator.config import OperatorConfig
from trtfleet_operator.reconcile.adapter import reconcile_adapter
from trtfleet_operator.reconcile.types import AdapterObserved, Reconciliation

from tests.unit.operator.helpers import NOW, adapter, by_kind, condition, job_pod, job_status, llama, tiny
from trtfleet.api import AdapterStatus

CONFIG = OperatorConfig()
MODULES = ("attn_k", "attn_q", "attn_v")


def run(obj: dict[str, Any], observed: AdapterObserved, task_id: int | None = None) -> Reconciliation:
    result = reconcile_adapter(obj, observed, CONFIG, NOW, task_id=task_id)
    AdapterStatus.model_validate(result.status)
    return result


def summary(rank: int = 16, modules: tuple[str, ...] = MODULES, dtype: str = "float16") -> str:
    return ArtifactSummary(rank, modules, "ab" * 32, 123456, dtype).to_json()


def converted(obj: dict[str, Any], base: dict[str, Any], report: str) -> tuple[AdapterObserved, dict[str, Any]]:
    """Observed state after the convert Job the first reconcile created completed with ``report``."""
    job = by_kind(run(obj, AdapterObserved(basemodel=base)).apply, "Job")[0]
    done = job_status(job, "complete")
    return AdapterObserved(
        basemodel=base, convert_jobs=(done,), convert_pods=(job_pod(job, "convert", exit_code=0, message=report),)
    ), done


def test_unknown_base_fails_and_creates_nothing() -> None:
    result = run(adapter("nope"), AdapterObserved(basemodel=None))
    assert result.apply == () and result.delete == () and not result.needs_task_id
    assert result.status["phase"] == "Failed"
    assert condition(result.status, "Validated")["reason"] == "BaseModelNotFound"
    assert condition(result.status, "Ready")["reason"] == "BaseModelNotFound"
    assert result.events[0].type == "Warning"


def test_lora_disabled_base_is_refused() -> None:
    result = run(adapter(), AdapterObserved(basemodel=llama(spec={"lora": {"enabled": False}})))
    assert (result.status["phase"], condition(result.status, "Validated")["reason"]) == ("Failed", "LoraNotEnabled")
    assert result.apply == ()


def test_first_reconcile_starts_a_convert_job() -> None:
    result = run(adapter(), AdapterObserved(basemodel=llama()))
    job = by_kind(result.apply, "Job")[0]
    container = job["spec"]["template"]["spec"]["containers"][0]
    assert container["image"] == CONFIG.images.trtfleet
    assert container["args"][:2] == ["--source-uri", "s3://adapters/sql"]
    assert "--dtype" in container["args"] and "float16" in container["args"]
    assert container["terminationMessagePolicy"] == "FallbackToLogsOnError"
    assert job["metadata"]["ownerReferences"][0]["kind"] == "Adapter"
    assert result.status["phase"] == "Converting" and "taskId" not in result.status


def test_reference_base_converts_in_the_worker_image() -> None:
    obj = adapter("tiny", source={"uri": "file:///opt/trtfleet/adapters/json"})
    job = by_kind(run(obj, AdapterObserved(basemodel=tiny())).apply, "Job")[0]
    assert job["spec"]["template"]["spec"]["containers"][0]["image"] == CONFIG.images.worker


def test_valid_conversion_asks_for_a_task_id_then_is_ready() -> None:
    obj, base = adapter(), llama()
    observed, job = converted(obj, base, summary())
    first = run(obj, observed)
    assert first.needs_task_id and first.status["phase"] == "Converting"
    ready = run(obj, observed, task_id=7)
    assert not ready.needs_task_id
    assert ready.status["phase"] == "Ready" and ready.status["taskId"] == 7
    assert ready.status["artifact"]["rank"] == 16 and ready.status["artifact"]["uri"].startswith("pvc://")
    assert ready.status["sourceKey"] and ready.status["servedName"] == "sql"
    assert [r.name for r in ready.delete] == [job["metadata"]["name"]], "the finished Job is cleaned up"


def test_ready_adapter_keeps_its_task_id_and_creates_nothing() -> None:
    obj, base = adapter(), llama()
    observed, _ = converted(obj, base, summary())
    ready = run(obj, observed, task_id=7)
    again = run(adapter(status=ready.status), AdapterObserved(basemodel=base))
    assert again.status == ready.status and again.apply == () and not again.needs_task_id


@pytest.mark.parametrize(
    ("report", "reason", "words"),
    [
        (summary(rank=128), "RankTooHigh", "rank 128 exceeds BaseModel llama3-8b lora.maxRank 64"),
        (summary(modules=("attn_q", "attn_qkv")), "ModulesNotTargeted", "attn_qkv"),
    ],
)
def test_invalid_artifact_fails_without_task_id_and_leaves_no_job(report: str, reason: str, words: str) -> None:
    obj, base = adapter(), llama()
    observed, job = converted(obj, base, report)
    result = run(obj, observed)
    assert not result.needs_task_id and "taskId" not in result.status
    assert result.status["phase"] == "Failed"
    assert condition(result.status, "Validated")["reason"] == reason
    assert words in condition(result.status, "Ready")["message"]
    assert [r.name for r in result.delete] == [job["metadata"]["name"]]
    # level-based: with the Job gone and the artifact recorded, nothing is created again
    again = run(adapter(status=result.status), AdapterObserved(basemodel=base))
    assert again.apply == () and again.status["phase"] == "Failed"


def test_artifact_in_the_wrong_dtype_is_refused_and_the_job_kept() -> None:
    obj, base = adapter(), llama()
    observed, _ = converted(obj, base, summary(dtype="bfloat16"))
    result = run(obj, observed)
    assert condition(result.status, "Converted")["reason"] == "DtypeMismatch"
    assert "artifact" not in result.status and result.delete == ()


def test_raising_max_rank_heals_a_rank_too_high_adapter() -> None:
    obj, base = adapter(), llama()
    observed, _ = converted(obj, base, summary(rank=128))
    failed = run(obj, observed)
    healed = run(adapter(status=failed.status), AdapterObserved(basemodel=llama(spec={"lora": {"maxRank": 128}})))
    assert healed.needs_task_id


def test_failed_conversion_reports_the_message() -> None:
    obj, base = adapter(), llama()
    job = by_kind(run(obj, AdapterObserved(basemodel=base)).apply, "Job")[0]
    pod = job_pod(job, "convert", exit_code=1, message="trtfleet lora convert s3://adapters/sql failed: no adapter")
    result = run(obj, AdapterObserved(basemodel=base, convert_jobs=(job_status(job, "failed"),), convert_pods=(pod,)))
    assert condition(result.status, "Converted")["reason"] == "ConversionFailed"
    assert "no adapter" in condition(result.status, "Converted")["message"]
    assert result.apply == () and result.delete == ()


def test_completed_job_without_report_is_a_conversion_failure() -> None:
    obj, base = adapter(), llama()
    observed, _ = converted(obj, base, "")
    result = run(obj, observed)
    assert condition(result.status, "Converted")["reason"] == "ConversionFailed"
    assert "summary" in condition(result.status, "Converted")["message"]


def test_new_source_converts_again_and_gets_a_new_task_id() -> None:
    obj, base = adapter(), llama()
    observed, _ = converted(obj, base, summary())
    ready = run(obj, observed, task_id=7)
    moved = adapter(generation=2, status=ready.status, source={"uri": "s3://adapters/sql", "revision": "4"})
    converting = run(moved, AdapterObserved(basemodel=base))
    assert by_kind(converting.apply, "Job"), "a new Job for the new revision"
    assert converting.status["taskId"] == 7, "the old triple stays until the new one is ready"
    assert converting.status["phase"] == "Converting"
    new_observed, _ = converted(moved, base, summary())
    renewed = run(moved, new_observed)
    assert renewed.needs_task_id and "taskId" not in renewed.status
    assert renewed.status["sourceKey"] != ready.status["sourceKey"]
    assert run(moved, new_observed, task_id=8).status["taskId"] == 8


def test_merged_mode_builds_its_own_engine() -> None:
    obj, base = adapter(mode="merged"), llama()
    result = run(obj, AdapterObserved(basemodel=base, basemodels=(base,), merged_adapters=(obj,)))
    kinds = sorted(o["kind"] for o in result.apply)
    assert kinds == ["ConfigMap", "Job", "PodDisruptionBudget", "Service"]
    service = by_kind(result.apply, "Service")[0]
    assert service["metadata"]["labels"]["trtfleet.io/adapter"] == "sql"
    assert service["metadata"]["labels"]["trtfleet.io/role"] == "merged"
    assert result.status["phase"] == "Converting" and "taskId" not in result.status
    job = by_kind(result.apply, "Job")[0]
    assert job["metadata"]["ownerReferences"][0]["kind"] == "Adapter"


def test_merged_mode_on_reference_runtime_serves_the_worker_merge_without_a_job() -> None:
    obj = adapter("tiny", name="shout", mode="merged", source={"uri": "file:///opt/trtfleet/adapters/upper"})
    obj["spec"]["servedName"] = "tiny-upper-merged"
    base = tiny()
    result = run(obj, AdapterObserved(basemodel=base, basemodels=(base,), merged_adapters=(obj,)))
    assert sorted(o["kind"] for o in result.apply) == ["ConfigMap", "Deployment", "PodDisruptionBudget", "Service"]
    assert result.status["phase"] == "Pending" and "taskId" not in result.status
    assert condition(result.status, "EngineBuilt")["reason"] == "NotNeeded"
    deployment = by_kind(result.apply, "Deployment")[0]
    assert deployment["metadata"]["name"] == "shout-merged"
    assert deployment["spec"]["selector"]["matchLabels"]["trtfleet.io/role"] == "merged"
    args = deployment["spec"]["template"]["spec"]["containers"][0]["args"]
    merged_flags = ["--merged-adapter", "/opt/trtfleet/adapters/upper", "--merged-adapter-name", "tiny-upper-merged"]
    assert args[-4:] == merged_flags
    spec = json.loads(by_kind(result.apply, "ConfigMap")[0]["data"]["basemodel.json"])
    assert spec["lora"]["enabled"] is False  # the merged worker runs without the LoRA cache


def test_back_to_dynamic_removes_the_merged_pods_once_served_hot_swapped() -> None:
    obj, base = adapter(), llama()
    observed, _ = converted(obj, base, summary())
    ready = run(obj, observed, task_id=7)
    leftover = {"apiVersion": "apps/v1", "kind": "Deployment",
                "metadata": {"name": "sql-merged", "namespace": "default", "uid": "d-1"}}
    again = run(adapter(status=ready.status), AdapterObserved(basemodel=base, deployment=leftover))
    assert again.status["phase"] == "Ready"
    assert sorted((r.kind, r.name) for r in again.delete) == [
        ("ConfigMap", "sql-merged-llm-api-options"), ("ConfigMap", "sql-merged-model-repo"),
        ("Deployment", "sql-merged"), ("PodDisruptionBudget", "sql-merged"), ("Service", "sql-merged"),
    ]
    assert next(r for r in again.delete if r.kind == "Deployment").uid == "d-1"  # only that Deployment
