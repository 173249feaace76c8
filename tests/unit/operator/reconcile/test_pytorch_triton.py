"""``runtime: pytorch`` with ``serving.server: triton``: the reconciler rolls out Triton with TRT-LLM's llmapi
model on the staged checkpoint, and switching server rolls the pods without staging again."""

from __future__ import annotations

from typing import Any

import yaml
from trtfleet_engines.pytorch.llmapi import MODEL_YAML_NAME, TEMPLATE_DIR
from trtfleet_operator.reconcile.basemodel import BaseModelObserved
from trtfleet_operator.reconcile.types import Reconciliation

from tests.unit.operator.helpers import by_kind
from tests.unit.operator.reconcile.test_pytorch_runtime import prepare_hash, prepared, run, torch_llama

Obj = dict[str, Any]


def triton_llama(**kwargs: Any) -> Obj:
    return torch_llama(spec={"serving": {"server": "triton"}, **kwargs.pop("spec", {})}, **kwargs)


def test_the_service_of_a_triton_pytorch_base_has_triton_ports_before_the_checkpoint_is_staged() -> None:
    result = run(triton_llama())
    service = by_kind(result.apply, "Service")[0]
    assert [p["name"] for p in service["spec"]["ports"]] == ["http", "grpc", "metrics"]


def test_prepared_checkpoint_rolls_out_triton_with_the_llmapi_model() -> None:
    obj = triton_llama()
    content_hash = prepare_hash(obj)
    result = run(obj, prepared(obj))
    options = next(c for c in by_kind(result.apply, "ConfigMap") if c["metadata"]["name"].endswith("-llm-api-options"))
    assert list(options["data"]) == [MODEL_YAML_NAME]
    model_yaml = yaml.safe_load(options["data"][MODEL_YAML_NAME])
    assert model_yaml["model"] == f"/model-cache/checkpoints/{content_hash}/original"
    assert model_yaml["backend"] == "pytorch"
    assert model_yaml["triton_config"] == {"max_batch_size": 0, "decoupled": True}
    assert model_yaml["lora_config"]["max_loras"] == result.status["capacity"]["maxLoras"]
    pod = by_kind(result.apply, "Deployment")[0]["spec"]["template"]["spec"]
    (init,) = pod["initContainers"]
    assert TEMPLATE_DIR in init["args"][0] and f"/etc/trtfleet/llm-api/{MODEL_YAML_NAME}" in init["args"][0]
    (container,) = pod["containers"]
    assert container["command"] == ["tritonserver"]
    assert "--model-repository=/triton-repository" in container["args"]
    assert not any("auto-complete" in arg for arg in container["args"]), "the model sets its policy there"
    assert [p["containerPort"] for p in container["ports"]] == [8000, 8001, 8002]
    assert container["startupProbe"]["httpGet"]["path"] == "/v2/health/ready"
    assert container["startupProbe"]["failureThreshold"] * container["startupProbe"]["periodSeconds"] >= 1800
    mounts = {m["mountPath"]: m for m in container["volumeMounts"]}
    assert mounts["/artifacts"]["readOnly"] and mounts["/model-cache"]["readOnly"]


def test_switching_server_rolls_the_pods_without_staging_again() -> None:
    obj = torch_llama()
    triton = triton_llama(generation=2)
    observed = prepared(obj)
    after = run(triton, BaseModelObserved(basemodels=(triton,), build_jobs=observed.build_jobs,
                                          plan_configmaps=observed.plan_configmaps))
    assert prepare_hash(triton) == prepare_hash(obj)
    assert not by_kind(after.apply, "Job"), "the server never re-stages the checkpoint"

    def spec_hash(result: Reconciliation) -> str:
        return str(by_kind(result.apply, "Deployment")[0]["metadata"]["annotations"]["trtfleet.io/spec-hash"])

    assert spec_hash(run(obj, prepared(obj))) != spec_hash(after)
