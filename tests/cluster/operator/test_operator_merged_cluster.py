"""Merged Adapters on a real kube-apiserver + kube-controller-manager, per runtime: ``kubectl apply`` of a merged
Adapter on a ``pytorch`` BaseModel gives a prepare Job whose plan merges the adapter, then trtllm-serve pods
of its own under the served name without LoRA; on a ``reference`` BaseModel, a worker Deployment that merges
at start (nothing to build). The test plays the kubelet for Job pods, as the other operator cluster tests do.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
import yaml
from trtfleet_engines.pytorch.options import OPTIONS_FILE_NAME
from trtfleet_operator.names import plan_configmap_name

from tests.cluster.operator.harness import (
    PREPARES,
    OperatorProcess,
    adapter_doc,
    apply,
    apply_tiny,
    cond,
    finish_job_pod,
    get,
    items,
    llama_doc,
    wait_phase,
    wait_until,
)

pytestmark = pytest.mark.cluster


def merged_adapter(name: str, base: str, uri: str, served: str) -> dict[str, Any]:
    return adapter_doc(name, base, uri, mode="merged", servedName=served)


def test_merged_adapter_on_pytorch_gets_a_merging_prepare_job_and_trtllm_serve_without_lora(
    operator: OperatorProcess,
) -> None:
    cp, ns = operator.cp, operator.namespace
    apply(cp, ns, llama_doc(ns, runtime="pytorch"))
    apply(cp, ns, merged_adapter("sql", "llama3-8b", "s3://adapters/llama3/sql", "sql-merged"))
    ad = wait_phase(cp, ns, "adapter", "sql", "Converting")
    assert cond(ad, "EngineBuilt")["reason"] == "Preparing" and "taskId" not in ad["status"]
    mine = wait_until(
        lambda: [j for j in items(cp, ns, "jobs", PREPARES) if j["metadata"]["labels"].get("trtfleet.io/adapter")],
        30,
        "the merged prepare Job",
    )
    assert len(mine) == 1 and mine[0]["metadata"]["ownerReferences"][0]["kind"] == "Adapter"
    engine_hash = mine[0]["metadata"]["annotations"]["trtfleet.io/engine-hash"]
    plan = json.loads(get(cp, ns, "configmap", plan_configmap_name(engine_hash))["data"]["plan.json"])
    assert plan["merge"]["adapter_uri"] == "s3://adapters/llama3/sql" and plan["merge"]["dtype"] == "float16"

    finish_job_pod(cp, ns, mine[0]["metadata"]["name"], "prepare", exit_code=0, message='{"merged": true}')
    deployment = wait_until(lambda: get(cp, ns, "deployment", "sql-merged"), 30, "the merged Deployment")
    serve = deployment["spec"]["template"]["spec"]["containers"][0]
    assert serve["args"][0] == f"/model-cache/checkpoints/{engine_hash}/merged"
    assert serve["args"][-2:] == ["--served_model_name", "sql-merged"]
    options = yaml.safe_load(get(cp, ns, "configmap", "sql-merged-llm-api-options")["data"][OPTIONS_FILE_NAME])
    assert "lora_config" not in options
    service = get(cp, ns, "service", "sql-merged")
    assert service["spec"]["selector"]["trtfleet.io/role"] == "merged"
    assert [p["name"] for p in service["spec"]["ports"]] == ["http"]
    assert wait_phase(cp, ns, "adapter", "sql", "Pending")["status"]["phase"] == "Pending"


def test_merged_adapter_on_reference_gets_a_worker_that_merges_at_start(operator: OperatorProcess) -> None:
    cp, ns = operator.cp, operator.namespace
    apply_tiny(cp, ns)
    apply(cp, ns, merged_adapter("shout", "tiny", "file:///opt/trtfleet/adapters/upper", "tiny-shout"))
    deployment = wait_until(lambda: get(cp, ns, "deployment", "shout-merged"), 30, "the merged worker Deployment")
    container = deployment["spec"]["template"]["spec"]["containers"][0]
    assert container["command"] == ["trtfleet", "worker"]
    assert container["args"][-4:] == [
        "--merged-adapter", "/opt/trtfleet/adapters/upper", "--merged-adapter-name", "tiny-shout",
    ]
    spec = json.loads(get(cp, ns, "configmap", "shout-merged-model-repo")["data"]["basemodel.json"])
    assert spec["lora"]["enabled"] is False
    ad = wait_until(lambda: (get(cp, ns, "adapter", "shout") or {}).get("status", {}).get("conditions") and
                    get(cp, ns, "adapter", "shout"), 30, "the merged Adapter's status")
    assert cond(ad, "EngineBuilt")["reason"] == "NotNeeded"
    assert ad["status"]["phase"] in ("Pending", "Ready")  # Ready once a node runs the worker pods
    assert not [j for j in items(cp, ns, "jobs", PREPARES) if j["metadata"]["labels"].get("trtfleet.io/adapter")]
