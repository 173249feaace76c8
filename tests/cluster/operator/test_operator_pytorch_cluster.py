"""``runtime: pytorch`` against a real kube-apiserver + kube-controller-manager: ``kubectl apply`` of a
BaseModel and an Adapter gives the prepare Job, the LLM-API options ConfigMap, the trtllm-serve Deployment
and the Service (or with serving.server triton the llmapi repository, tritonserver and Triton's ports); the API
server itself refuses values the runtime cannot serve, with the CEL message.
The test plays the kubelet for Job pods (their termination messages), as the other operator cluster tests do.
"""

from __future__ import annotations

from typing import Any

import pytest
import yaml
from trtfleet_engines.pytorch.options import OPTIONS_FILE_NAME
from trtfleet_operator.artifacts import ArtifactSummary
from trtfleet_operator.names import prepare_job_name

from tests.cluster.operator.harness import (
    CONVERTS,
    PREPARES,
    OperatorProcess,
    adapter_doc,
    apply,
    cond,
    finish_job_pod,
    first_live_job,
    get,
    llama_doc,
    wait_phase,
    wait_until,
)
from tests.support.controlplane import ControlPlane

pytestmark = pytest.mark.cluster

def test_pytorch_basemodel_and_adapter_get_prepare_job_options_trtllm_serve_and_peft_path(
    operator: OperatorProcess,
) -> None:
    cp, ns = operator.cp, operator.namespace
    apply(cp, ns, llama_doc(ns, runtime="pytorch"))
    job = first_live_job(cp, ns, PREPARES, "the prepare Job")
    bm = wait_phase(cp, ns, "basemodel", "llama3-8b", "Building")
    content_hash = bm["status"]["engine"]["hash"]
    assert job["metadata"]["name"] == prepare_job_name(content_hash)
    container = job["spec"]["template"]["spec"]["containers"][0]
    assert container["command"] == ["python3", "-m", "trtfleet_operator.jobs.prepare"]
    assert cond(bm, "EngineBuilt")["reason"] == "Preparing"
    capacity = bm["status"]["capacity"]
    assert 1 <= capacity["maxLoras"] <= capacity["maxCpuLoras"]

    finish_job_pod(cp, ns, job["metadata"]["name"], "prepare", exit_code=0, message='{"staged": true}')
    deployment = wait_until(lambda: get(cp, ns, "deployment", "llama3-8b"), 30, "the trtllm-serve Deployment")
    serve = deployment["spec"]["template"]["spec"]["containers"][0]
    assert serve["command"] == ["trtllm-serve"]
    assert serve["args"][0] == f"/model-cache/checkpoints/{content_hash}/original"
    assert serve["args"][1:] == [
        "--backend", "pytorch", "--host", "0.0.0.0", "--port", "8000",
        "--config", f"/etc/trtfleet/llm-api/{OPTIONS_FILE_NAME}", "--served_model_name", "llama3-8b",
    ]
    assert serve["readinessProbe"]["httpGet"]["path"] == "/health"
    options = get(cp, ns, "configmap", "llama3-8b-llm-api-options")
    assert options is not None and "trtfleet.io/options-hash" in options["metadata"]["labels"]
    rendered = yaml.safe_load(options["data"][OPTIONS_FILE_NAME])
    assert rendered["lora_config"]["max_loras"] == capacity["maxLoras"]
    service = get(cp, ns, "service", "llama3-8b")
    assert [(p["name"], p["port"]) for p in service["spec"]["ports"]] == [("http", 8000)]
    assert cond(get(cp, ns, "basemodel", "llama3-8b"), "EngineBuilt")["reason"] == "Prepared"

    apply(cp, ns, adapter_doc("sql", "llama3-8b", source={"uri": "s3://adapters/llama3/sql", "revision": "3"}))
    convert = first_live_job(cp, ns, CONVERTS, "the convert Job")
    args = convert["spec"]["template"]["spec"]["containers"][0]["args"]
    assert "--stage-peft" in args
    summary = ArtifactSummary(16, ("attn_q", "attn_v"), "c0" * 32, 65536, "float16").to_json()
    finish_job_pod(cp, ns, convert["metadata"]["name"], "convert", exit_code=0, message=summary)
    ready = wait_phase(cp, ns, "adapter", "sql", "Ready")
    assert ready["status"]["artifact"]["path"] == args[args.index("--out") + 1]
    assert ready["status"]["taskId"] >= 1


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        pytest.param(
            {"quantization": {"mode": "none", "kvCacheDtype": "int8"}},
            "quantization.kvCacheDtype int8 is for runtime tensorrtllm only",
            id="int8-kv-cache",
        ),
        pytest.param(
            {"quantization": {"mode": "int4_weight_only", "kvCacheDtype": "auto"}},
            "quantization.mode int4_weight_only is for runtime tensorrtllm only",
            id="int4-weight-only",
        ),
    ],
)
def test_api_server_refuses_values_the_pytorch_runtime_cannot_serve(
    crds: ControlPlane, kube_namespace: str, spec: dict[str, Any], message: str
) -> None:
    refused = crds.kubectl(
        "apply", "-n", kube_namespace, "-f", "-",
        input=yaml.safe_dump(llama_doc(kube_namespace, runtime="pytorch", **spec)),
        check=False,
    )
    assert refused.returncode != 0 and message in refused.stderr, refused.stderr
    allowed = llama_doc(kube_namespace, runtime="pytorch", **spec)
    allowed["spec"]["runtime"] = "tensorrtllm"
    crds.kubectl("apply", "--dry-run=server", "-n", kube_namespace, "-f", "-", input=yaml.safe_dump(allowed))


def test_api_server_takes_the_triton_llmapi_server_only_for_pytorch(crds: ControlPlane, kube_namespace: str) -> None:
    triton = llama_doc(kube_namespace, runtime="pytorch", serving={"server": "triton"})
    crds.kubectl("apply", "--dry-run=server", "-n", kube_namespace, "-f", "-", input=yaml.safe_dump(triton))
    triton["spec"]["runtime"] = "tensorrtllm"
    refused = crds.kubectl("apply", "-n", kube_namespace, "-f", "-", input=yaml.safe_dump(triton), check=False)
    assert refused.returncode != 0 and "serving.server triton is for runtime pytorch only" in refused.stderr
    del triton["spec"]["serving"]["server"]
    crds.kubectl("apply", "--dry-run=server", "-n", kube_namespace, "-f", "-", input=yaml.safe_dump(triton))


def test_a_triton_served_pytorch_basemodel_gets_the_llmapi_repository_and_triton_ports(
    operator: OperatorProcess,
) -> None:
    cp, ns = operator.cp, operator.namespace
    apply(cp, ns, llama_doc(ns, runtime="pytorch", serving={"server": "triton"}))
    job = first_live_job(cp, ns, PREPARES, "the prepare Job")
    content_hash = wait_phase(cp, ns, "basemodel", "llama3-8b", "Building")["status"]["engine"]["hash"]
    finish_job_pod(cp, ns, job["metadata"]["name"], "prepare", exit_code=0, message='{"staged": true}')
    deployment = wait_until(lambda: get(cp, ns, "deployment", "llama3-8b"), 30, "the Triton Deployment")
    pod = deployment["spec"]["template"]["spec"]
    assert [c["name"] for c in pod["initContainers"]] == ["llmapi-repository"]
    (triton,) = pod["containers"]
    assert triton["command"] == ["tritonserver"] and "--model-repository=/triton-repository" in triton["args"]
    assert triton["readinessProbe"]["httpGet"]["path"] == "/v2/health/ready"
    options = get(cp, ns, "configmap", "llama3-8b-llm-api-options")
    assert options is not None
    model_yaml = yaml.safe_load(options["data"]["model.yaml"])
    assert model_yaml["model"] == f"/model-cache/checkpoints/{content_hash}/original"
    assert model_yaml["triton_config"] == {"max_batch_size": 0, "decoupled": True}
    service = get(cp, ns, "service", "llama3-8b")
    assert [(p["name"], p["port"]) for p in service["spec"]["ports"]] == [("http", 8000), ("grpc", 8001),
                                                                          ("metrics", 8002)]
