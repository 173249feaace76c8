"""``spec.speculative`` against a real kube-apiserver + kube-controller-manager: ``kubectl apply`` of a BaseModel with
each supported mode renders the prepare Job (the draft staged beside the checkpoint), the LLM-API options, the
Medusa build plan or the reference engine's Triton config; a combination the image's release refuses gives its
``EngineBuilt`` condition and creates nothing. The test plays the kubelet for Job pods, as the other operator
cluster tests do."""

from __future__ import annotations

import json
from typing import Any

import pytest
import yaml
from trtfleet_engines.pytorch.options import OPTIONS_FILE_NAME
from trtfleet_engines.triton.render import render_configs

from tests.cluster.operator.harness import (
    BUILDS,
    PREPARES,
    OperatorProcess,
    apply,
    cond,
    example,
    finish_job_pod,
    first_live_job,
    get,
    items,
    llama_doc,
    wait_phase,
    wait_until,
)
from trtfleet.api import BaseModelSpec

pytestmark = pytest.mark.cluster

NEW = "nvcr.io/nvidia/tensorrt-llm/release:1.4.0rc4"
EAGLE3_DRAFT = {"source": {"uri": "hf://yuhuili/EAGLE3-LLaMA3.1-Instruct-8B", "revision": "r1"}}


def _plan(cp: Any, ns: str, content_hash: str) -> dict[str, Any]:
    configmaps = items(cp, ns, "configmap")
    plan = next(c for c in configmaps if c["metadata"]["name"].endswith(content_hash[:16]) and "plan.json" in c["data"])
    loaded: dict[str, Any] = json.loads(plan["data"]["plan.json"])
    return loaded


@pytest.mark.parametrize(
    ("speculative", "lora", "expected"),
    [
        pytest.param({"mode": "NGram", "maxDraftLen": 4, "ngram": {"maxMatchingNgramSize": 3}}, True,
                     {"decoding_type": "NGram", "max_draft_len": 4, "max_matching_ngram_size": 3,
                      "is_public_pool": True, "is_keep_all": True, "is_use_oldest": True}, id="ngram-lora"),
        pytest.param({"mode": "Eagle3", "draft": EAGLE3_DRAFT, "maxConcurrency": 8}, True,
                     {"decoding_type": "Eagle3", "max_draft_len": 3, "max_concurrency": 8}, id="eagle3-lora"),
        pytest.param({"mode": "DraftTarget", "maxDraftLen": 5, "allowUntestedWithLora": True,
                      "draft": {"source": {"uri": "hf://meta-llama/Llama-3.2-1B-Instruct"}}}, True,
                     {"decoding_type": "DraftTarget", "max_draft_len": 5}, id="draft-target-opt-in"),
        pytest.param({"mode": "MTP", "mtp": {"useRelaxedAcceptanceForThinking": True, "relaxedTopk": 10}}, False,
                     {"decoding_type": "MTP", "max_draft_len": 3, "use_relaxed_acceptance_for_thinking": True,
                      "relaxed_topk": 10, "relaxed_delta": 0.0}, id="mtp"),
    ],
)
def test_a_pytorch_mode_renders_its_options_and_stages_its_draft(
    operator: OperatorProcess, speculative: dict[str, Any], lora: bool, expected: dict[str, Any]
) -> None:
    cp, ns = operator.cp, operator.namespace
    apply(cp, ns, llama_doc(ns, runtime="pytorch", engine={"image": NEW}, lora={"enabled": lora},
                            speculative=speculative))
    job = first_live_job(cp, ns, PREPARES, "the prepare Job")
    bm = wait_phase(cp, ns, "basemodel", "llama3-8b", "Building")
    content_hash = bm["status"]["engine"]["hash"]
    capacity = bm["status"]["capacity"]
    assert capacity["draftKvCacheTokens"] == 64 * speculative.get("maxDraftLen", 3)
    assert capacity["decodeRequestsPerStep"] == 64
    plan = _plan(cp, ns, content_hash)
    draft = speculative.get("draft")
    if draft is None:
        assert "draft" not in plan
    else:
        assert plan["draft"]["source_uri"] == draft["source"]["uri"]
        assert plan["draft"]["destination_dir"] == f"/model-cache/checkpoints/{content_hash}/draft"

    finish_job_pod(cp, ns, job["metadata"]["name"], "prepare", exit_code=0, message='{"staged": true}')
    wait_until(lambda: get(cp, ns, "deployment", "llama3-8b"), 30, "the trtllm-serve Deployment")
    options = yaml.safe_load(get(cp, ns, "configmap", "llama3-8b-llm-api-options")["data"][OPTIONS_FILE_NAME])
    config = options["speculative_config"]
    if draft is not None:
        assert config.pop("speculative_model") == f"/model-cache/checkpoints/{content_hash}/draft"
    assert config == expected
    assert options.get("disable_overlap_scheduler", False) is (expected["decoding_type"] in ("NGram", "DraftTarget"))


def test_a_medusa_engine_is_planned_with_its_heads(operator: OperatorProcess) -> None:
    cp, ns = operator.cp, operator.namespace
    apply(cp, ns, llama_doc(ns, runtime="tensorrtllm", lora={"enabled": False}, speculative={
        "mode": "Medusa", "maxDraftLen": 4, "draft": {"source": {"uri": "hf://org/medusa-heads"}, "numHeads": 4},
        "medusaChoices": "{0}, {0, 0}"}))
    job = first_live_job(cp, ns, BUILDS, "the engine build Job")
    bm = wait_phase(cp, ns, "basemodel", "llama3-8b", "Building")
    assert bm["status"]["capacity"]["draftWeightsBytes"] > 0
    plan = _plan(cp, ns, bm["status"]["engine"]["hash"])
    argv = {step["name"]: step.get("argv") for step in plan["steps"]}
    assert "fetch-draft" in argv
    assert argv["convert-checkpoint"][1].endswith("examples/medusa/convert_checkpoint.py")
    build = argv["trtllm-build"]
    assert build[build.index("--speculative_decoding_mode") + 1] == "medusa"
    assert job["metadata"]["name"]


def test_a_reference_basemodel_drafts_by_prompt_lookup(operator: OperatorProcess) -> None:
    cp, ns = operator.cp, operator.namespace
    doc = example("basemodel-reference-tiny.yaml")
    doc["spec"]["speculative"] = {"mode": "NGram", "maxDraftLen": 4}
    apply(cp, ns, doc)
    repo = wait_until(lambda: get(cp, ns, "configmap", "tiny-model-repo"), 30, "the reference model repository")
    served = BaseModelSpec.model_validate_json(repo["data"]["basemodel.json"])  # what the worker renders from
    config = render_configs(served, "/engine")["tensorrt_llm"]
    assert served.speculative is not None and served.speculative.max_draft_len == 4
    assert "reference_speculative_config" in config and "NGram" in config


@pytest.mark.parametrize(
    ("image", "words"),
    [
        pytest.param("nvcr.io/nvidia/tritonserver:25.12-trtllm-python-py3", "holds TensorRT-LLM 1.2.1",
                     id="release-without-lora-speculation"),
        pytest.param("registry.local/trtllm:latest", "does not name its TensorRT-LLM release", id="unknown-release"),
    ],
)
def test_a_release_that_refuses_gives_its_condition_and_creates_nothing(
    operator: OperatorProcess, image: str, words: str
) -> None:
    cp, ns = operator.cp, operator.namespace
    apply(cp, ns, llama_doc(ns, runtime="pytorch", engine={"image": image}, speculative={"mode": "NGram"}))
    bm = wait_phase(cp, ns, "basemodel", "llama3-8b", "Failed")
    built = cond(bm, "EngineBuilt")
    assert built["status"] == "False" and built["reason"] == "UnsupportedByRelease"
    assert "lora-speculation-needs-1.3.0rc20" in built["message"] and words in built["message"]
    assert "1.3.0rc20 or later" in built["message"]
    assert items(cp, ns, "job") == []
    assert get(cp, ns, "deployment", "llama3-8b") is None
    assert get(cp, ns, "configmap", "llama3-8b-llm-api-options") is None
