"""``runtime: pytorch`` in the pure reconcilers: prepare Job lifecycle, options and trtllm-serve rollout,
PEFT staging of Adapters (table tests on plain objects, as the API server returns them)."""

from __future__ import annotations

import json
from dataclasses import replace
from datetime import timedelta
from typing import Any

import pytest
import yaml
from trtfleet_engines.pytorch.options import OPTIONS_FILE_NAME
from trtfleet_operator.artifacts import ArtifactSummary
from trtfleet_operator.config import BuildPolicy, Images, OperatorConfig
from trtfleet_operator.names import LABEL_OPTIONS_HASH, prepare_job_name
from trtfleet_operator.planning import plan_engine
from trtfleet_operator.reconcile.adapter import reconcile_adapter
from trtfleet_operator.reconcile.basemodel import BaseModelObserved, reconcile_basemodel
from trtfleet_operator.reconcile.types import AdapterObserved, Reconciliation

from tests.unit.operator.helpers import (
    NOW,
    adapter,
    as_created,
    by_kind,
    condition,
    job_pod,
    job_status,
    llama,
)
from trtfleet.api import AdapterStatus, BaseModelSpec, BaseModelStatus

CONFIG = OperatorConfig(build=BuildPolicy(backoff_limit=0, max_attempts=3, retry_base_s=60, retry_max_s=600))
Obj = dict[str, Any]


def torch_llama(**kwargs: Any) -> Obj:
    spec = {"runtime": "pytorch", **kwargs.pop("spec", {})}
    return llama(spec=spec, **kwargs)


def run(
    obj: Obj, observed: BaseModelObserved | None = None, now: Any = NOW, config: OperatorConfig = CONFIG
) -> Reconciliation:
    result = reconcile_basemodel(obj, observed or BaseModelObserved(basemodels=(obj,)), config, now)
    BaseModelStatus.model_validate(result.status)
    return result


def prepare_hash(obj: Obj) -> str:
    return plan_engine(BaseModelSpec.model_validate(obj["spec"])).engine_hash


def prepared(obj: Obj) -> BaseModelObserved:
    """Observed state once the first reconcile's prepare Job completed."""
    first = run(obj)
    job = job_status(by_kind(first.apply, "Job")[0], "complete")
    plan_cm = as_created(by_kind(first.apply, "ConfigMap")[0])
    return BaseModelObserved(basemodels=(obj,), build_jobs=(job,), plan_configmaps=(plan_cm,))


def test_pytorch_basemodel_starts_one_prepare_job_and_plans_lora_slots() -> None:
    obj = torch_llama()
    result = run(obj)
    assert sorted(o["kind"] for o in result.apply) == ["ConfigMap", "Job", "PodDisruptionBudget", "Service"]
    job = by_kind(result.apply, "Job")[0]
    assert job["metadata"]["name"] == prepare_job_name(prepare_hash(obj))
    container = job["spec"]["template"]["spec"]["containers"][0]
    assert container["name"] == "prepare"
    assert "nvidia.com/gpu" not in container["resources"].get("limits", {}), "staging alone needs no GPU"
    assert container["image"] == CONFIG.images.trtfleet, "staging runs in trtfleet's own image"
    assert condition(result.status, "EngineBuilt")["reason"] == "Preparing"
    assert condition(result.status, "Ready")["message"].startswith("waiting for checkpoint")
    assert result.status["phase"] == "Building"
    capacity = result.status["capacity"]
    assert 1 <= capacity["maxLoras"] <= capacity["maxCpuLoras"]
    assert capacity["loraDeviceAdapters"] >= capacity["maxLoras"], "pages hold at least max_loras adapters"
    service = by_kind(result.apply, "Service")[0]
    assert [p["name"] for p in service["spec"]["ports"]] == ["http"]


def test_prepared_checkpoint_rolls_out_trtllm_serve_with_its_options() -> None:
    obj = torch_llama()
    content_hash = prepare_hash(obj)
    result = run(obj, prepared(obj))
    assert condition(result.status, "EngineBuilt")["reason"] == "Prepared"
    assert result.counters == ("build_succeeded",)
    assert result.status["engine"]["uri"] == f"pvc://trtfleet-engines/checkpoints/{content_hash}/original"
    options = next(c for c in by_kind(result.apply, "ConfigMap") if c["metadata"]["name"].endswith("-llm-api-options"))
    rendered = yaml.safe_load(options["data"][OPTIONS_FILE_NAME])
    assert rendered["lora_config"]["max_loras"] == result.status["capacity"]["maxLoras"]
    deployment = by_kind(result.apply, "Deployment")[0]
    container = deployment["spec"]["template"]["spec"]["containers"][0]
    assert container["command"] == ["trtllm-serve"]
    assert container["args"][0] == f"/model-cache/checkpoints/{content_hash}/original"
    assert container["args"][container["args"].index("--config") + 1].endswith(OPTIONS_FILE_NAME)
    assert {container[p]["httpGet"]["path"] for p in ("startupProbe", "readinessProbe", "livenessProbe")} == {
        "/health"
    }
    mounts = {m["mountPath"]: m for m in container["volumeMounts"]}
    assert mounts["/artifacts"]["readOnly"] and mounts["/model-cache"]["readOnly"]


def test_options_change_rolls_the_pods_without_staging_again() -> None:
    obj = torch_llama()
    before = run(obj, prepared(obj))
    bigger = torch_llama(generation=2, spec={"engine": {"maxBatchSize": 128}})
    observed = prepared(obj)
    after = run(bigger, BaseModelObserved(basemodels=(bigger,), build_jobs=observed.build_jobs,
                                          plan_configmaps=observed.plan_configmaps))
    assert prepare_hash(bigger) == prepare_hash(obj)
    assert not [j for j in after.apply if j["kind"] == "Job"], "limits never re-stage the checkpoint"

    def options_hash(result: Reconciliation) -> str:
        cms = [c for c in by_kind(result.apply, "ConfigMap") if c["metadata"]["name"].endswith("-llm-api-options")]
        return str(cms[0]["metadata"]["labels"][LABEL_OPTIONS_HASH])

    def spec_hash(result: Reconciliation) -> str:
        return str(by_kind(result.apply, "Deployment")[0]["metadata"]["annotations"]["trtfleet.io/spec-hash"])

    assert options_hash(before) != options_hash(after)
    assert spec_hash(before) != spec_hash(after)


def test_failed_prepare_reports_the_termination_message_and_retries_after_backoff() -> None:
    obj = torch_llama()
    first = run(obj)
    failed = job_status(by_kind(first.apply, "Job")[0], "failed", at="2026-11-21T12:00:00Z")
    pod = job_pod(failed, "prepare", exit_code=1, message="fetching hf://meta-llama/x failed: 401 Unauthorized")
    observed = BaseModelObserved(basemodels=(obj,), build_jobs=(failed,), build_pods=(pod,))
    waiting = run(obj, observed)
    built = condition(waiting.status, "EngineBuilt")
    assert (built["reason"], waiting.status["phase"]) == ("PrepareRetrying", "Failed")
    assert "401 Unauthorized" in built["message"] and "prepare Job" in built["message"]
    assert waiting.requeue_after_s == pytest.approx(60)
    assert waiting.counters == ("build_failed",)
    retried = run(obj, observed, now=NOW + timedelta(seconds=61))
    assert [j["metadata"]["name"] for j in by_kind(retried.apply, "Job")] == [
        prepare_job_name(prepare_hash(obj), 2)
    ]


def test_two_basemodels_with_one_source_share_one_prepare_job() -> None:
    first = torch_llama(name="a")
    second = torch_llama(name="b", spec={"engine": {"maxBatchSize": 8}})
    result = run(first, BaseModelObserved(basemodels=(first, second)))
    owners = by_kind(result.apply, "Job")[0]["metadata"]["ownerReferences"]
    assert sorted(o["name"] for o in owners) == ["a", "b"]


MODELOPT_CONFIG = replace(CONFIG, images=Images(modelopt="registry.example/trtfleet-modelopt:1.3.0rc21"))


def test_quantized_prepare_runs_modelopt_on_the_spec_gpus() -> None:
    obj = torch_llama(spec={"quantization": {"mode": "fp8", "kvCacheDtype": "fp8"}})
    job = by_kind(run(obj, config=MODELOPT_CONFIG).apply, "Job")[0]
    pod = job["spec"]["template"]["spec"]
    container = pod["containers"][0]
    assert container["resources"]["limits"]["nvidia.com/gpu"] == 1
    assert container["image"] == MODELOPT_CONFIG.images.modelopt, "ModelOpt's image"
    # trtfleet is not in that image: its own Python and CLI come from trtfleet's image through an emptyDir
    assert container["command"] == ["/opt/trtfleet-cli/bin/trtfleet-python", "-m", "trtfleet_operator.jobs.prepare"]
    [init] = pod["initContainers"]
    assert init["image"] == MODELOPT_CONFIG.images.trtfleet
    assert init["command"] == ["cp", "-a", "/opt/trtfleet/cli/.", "/opt/trtfleet-cli"]
    assert {"name": "trtfleet-cli", "mountPath": "/opt/trtfleet-cli", "readOnly": True} in container["volumeMounts"]
    plan_cm = by_kind(run(obj, config=MODELOPT_CONFIG).apply, "ConfigMap")[0]
    assert "hf_ptq.py" in plan_cm["data"]["plan.json"]


def test_quantized_prepare_without_a_modelopt_image_is_refused_by_name() -> None:
    obj = torch_llama(spec={"quantization": {"mode": "int4_awq"}})
    result = run(obj)
    assert by_kind(result.apply, "Job") == []
    assert result.status["phase"] == "Failed"
    built = next(c for c in result.status["conditions"] if c["type"] == "EngineBuilt")
    assert built["reason"] == "ModelOptImageMissing"
    assert "images/modelopt.Dockerfile" in built["message"] and "operator.images.modelopt" in built["message"]
    assert obj["spec"]["engine"]["image"] in built["message"]


def test_unquantized_prepare_runs_in_trtfleets_image_without_the_cli_copy() -> None:
    job = by_kind(run(torch_llama()).apply, "Job")[0]
    pod = job["spec"]["template"]["spec"]
    assert pod["containers"][0]["image"] == CONFIG.images.trtfleet
    assert pod["containers"][0]["command"] == ["python3", "-m", "trtfleet_operator.jobs.prepare"]
    assert "initContainers" not in pod


def run_adapter(obj: Obj, observed: AdapterObserved, task_id: int | None = None) -> Reconciliation:
    result = reconcile_adapter(obj, observed, CONFIG, NOW, task_id=task_id)
    AdapterStatus.model_validate(result.status)
    return result


def test_adapter_of_a_pytorch_base_stages_its_peft_directory_with_a_pod_path() -> None:
    base = torch_llama()
    obj = adapter()
    job = by_kind(run_adapter(obj, AdapterObserved(basemodel=base)).apply, "Job")[0]
    args = job["spec"]["template"]["spec"]["containers"][0]["args"]
    assert "--stage-peft" in args and args[args.index("--out") + 1].endswith("-peft")
    report = ArtifactSummary(16, ("attn_k", "attn_q", "attn_v"), "ab" * 32, 123456, "float16").to_json()
    done = job_status(job, "complete")
    observed = AdapterObserved(
        basemodel=base, convert_jobs=(done,), convert_pods=(job_pod(job, "convert", exit_code=0, message=report),)
    )
    asking = run_adapter(obj, observed)
    assert asking.needs_task_id
    ready = run_adapter(obj, observed, task_id=7)
    artifact = ready.status["artifact"]
    assert artifact["path"] == args[args.index("--out") + 1], "pods read the adapter where the Job wrote it"
    assert artifact["uri"].endswith("-peft") and ready.status["taskId"] == 7
    assert ready.status["phase"] == "Ready"


def test_merged_adapter_on_a_pytorch_base_gets_its_own_prepared_checkpoint() -> None:
    obj, base = adapter(mode="merged"), torch_llama()
    result = run_adapter(obj, AdapterObserved(basemodel=base, basemodels=(base,), merged_adapters=(obj,)))
    assert result.status["phase"] == "Converting" and "taskId" not in result.status
    job = by_kind(result.apply, "Job")[0]
    plan = json.loads(by_kind(result.apply, "ConfigMap")[0]["data"]["plan.json"])
    assert plan["merge"]["adapter_uri"] == "s3://adapters/sql" and plan["merge"]["dtype"] == "float16"
    assert job["metadata"]["ownerReferences"][0]["kind"] == "Adapter"
    service = by_kind(result.apply, "Service")[0]
    assert [p["name"] for p in service["spec"]["ports"]] == ["http"]
    assert service["spec"]["selector"]["trtfleet.io/role"] == "merged"


def test_pytorch_base_refuses_a_rank_above_max_rank_before_a_pod_sees_it() -> None:
    base, obj = torch_llama(), adapter()
    job = by_kind(run_adapter(obj, AdapterObserved(basemodel=base)).apply, "Job")[0]
    report = ArtifactSummary(128, ("attn_q",), "ab" * 32, 1, "float16").to_json()
    observed = AdapterObserved(
        basemodel=base,
        convert_jobs=(job_status(job, "complete"),),
        convert_pods=(job_pod(job, "convert", exit_code=0, message=report),),
    )
    result = run_adapter(obj, observed, task_id=3)
    assert condition(result.status, "Validated")["reason"] == "RankTooHigh"
    assert "taskId" not in result.status and "path" in result.status["artifact"]
