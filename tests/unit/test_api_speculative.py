"""``spec.speculative``: each refused combination gives its CEL message in Python, the accepted ones parse, and
every rule is a CEL rule of the generated CRD (the real API server evaluates them in
``tests/cluster/test_crds_speculative.py``)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pytest
from pydantic import ValidationError

from trtfleet.api import BaseModelSpec
from trtfleet.api.crdgen import structural_schema
from trtfleet.api.speculative import SPEC_RULES, SPECULATIVE_OWN_RULES, SpeculativeSpec

BASE: dict[str, Any] = {"source": {"uri": "hf://org/model"}, "architecture": "llama", "runtime": "pytorch"}
DRAFT = {"source": {"uri": "hf://org/draft"}}


@dataclass(frozen=True)
class Case:
    speculative: dict[str, Any]
    message: str
    runtime: str = "pytorch"
    lora: bool = True


REFUSED = [
    pytest.param(Case({"mode": "Eagle3"}, "speculative.draft is required for modes"), id="eagle3-without-draft"),
    pytest.param(Case({"mode": "NGram", "draft": DRAFT}, "not used by modes NGram, SA"), id="ngram-with-draft"),
    pytest.param(Case({"mode": "Eagle3", "draft": DRAFT, "ngram": {}}, "belong to modes NGram, Eagle3"),
                 id="ngram-settings-on-eagle3"),
    pytest.param(Case({"mode": "NGram", "maxConcurrency": 4, "draftLenSchedule": [{"maxBatchSize": 4, "draftLen": 3}]},
                      "mutually exclusive"), id="concurrency-and-schedule"),
    pytest.param(Case({"mode": "NGram", "draftLenSchedule": [{"maxBatchSize": 4, "draftLen": 2}]},
                      "smallest maxBatchSize must have draftLen equal to maxDraftLen"), id="schedule-start"),
    pytest.param(Case({"mode": "NGram", "draftLenSchedule": [{"maxBatchSize": 4, "draftLen": 3},
                                                             {"maxBatchSize": 8, "draftLen": 5}]},
                      "no entry may exceed it"), id="schedule-above-max"),
    pytest.param(Case({"mode": "NGram", "acceptanceRateThreshold": 0.3}, "needs acceptanceRateWindowSize"),
                 id="threshold-without-window"),
    pytest.param(Case({"mode": "Medusa", "draft": DRAFT}, "Medusa needs speculative.draft.numHeads", "tensorrtllm",
                      lora=False), id="medusa-without-heads"),
    pytest.param(Case({"mode": "Eagle3", "draft": DRAFT, "eagle3": {"useDynamicTree": True}},
                      "needs dynamicTreeMaxTopK"), id="tree-without-topk"),
    pytest.param(Case({"mode": "Medusa", "draft": {**DRAFT, "numHeads": 4}}, "runtime pytorch must be one of"),
                 id="medusa-on-pytorch"),
    pytest.param(Case({"mode": "NGram"}, "runtime tensorrtllm must be one of Medusa", "tensorrtllm"),
                 id="ngram-on-engines"),
    pytest.param(Case({"mode": "Eagle3", "draft": DRAFT}, "runtime reference must be one of NGram",
                      "reference"), id="eagle3-on-reference"),
    pytest.param(Case({"mode": "DraftTarget", "draft": DRAFT}, "other than NGram or Eagle3 with lora.enabled"),
                 id="draft-target-with-lora"),
    pytest.param(Case({"mode": "Medusa", "draft": {**DRAFT, "numHeads": 4}}, "other than NGram or Eagle3",
                      "tensorrtllm"), id="medusa-with-lora"),
    pytest.param(Case({"mode": "Medusa", "draft": {**DRAFT, "numHeads": 4}, "maxConcurrency": 2},
                      "PyTorch-backend controls", "tensorrtllm", lora=False), id="controls-on-engines"),
]


@pytest.mark.parametrize("case", REFUSED)
def test_refused_combinations_say_how_to_fix(case: Case) -> None:
    body = {**BASE, "runtime": case.runtime, "lora": {"enabled": case.lora}, "speculative": case.speculative}
    with pytest.raises(ValidationError, match=case.message):
        BaseModelSpec.model_validate(body)


ACCEPTED = [
    pytest.param("pytorch", True, {"mode": "NGram", "maxDraftLen": 4, "ngram": {"maxMatchingNgramSize": 3}},
                 id="ngram-lora"),
    pytest.param("pytorch", True, {"mode": "Eagle3", "draft": DRAFT, "acceptanceRateWindowSize": 64,
                                   "acceptanceRateThreshold": 0.2}, id="eagle3-lora-controls"),
    pytest.param("pytorch", True, {"mode": "DraftTarget", "draft": DRAFT, "allowUntestedWithLora": True},
                 id="draft-target-opt-in"),
    pytest.param("pytorch", False, {"mode": "MTP", "mtp": {"useRelaxedAcceptanceForThinking": True}}, id="mtp"),
    pytest.param("tensorrtllm", False, {"mode": "Medusa", "draft": {**DRAFT, "numHeads": 4},
                                        "medusaChoices": "{0}, {0, 0}"}, id="medusa"),
    pytest.param("reference", True, {"mode": "NGram", "draftLenSchedule": [{"maxBatchSize": 2, "draftLen": 3},
                                                                           {"maxBatchSize": 8, "draftLen": 1}]},
                 id="reference-ngram-schedule"),
]


@pytest.mark.parametrize(("runtime", "lora", "speculative"), ACCEPTED)
def test_accepted_combinations_parse(runtime: str, lora: bool, speculative: dict[str, Any]) -> None:
    spec = BaseModelSpec.model_validate({**BASE, "runtime": runtime, "lora": {"enabled": lora},
                                         "speculative": speculative})
    assert spec.speculative is not None
    assert spec.speculative.to_wire()["mode"] == speculative["mode"]


def test_the_schedule_reads_as_upstream_does() -> None:
    spec = SpeculativeSpec.model_validate({"mode": "NGram", "maxDraftLen": 4, "draftLenSchedule": [
        {"maxBatchSize": 8, "draftLen": 2}, {"maxBatchSize": 4, "draftLen": 4}, {"maxBatchSize": 32, "draftLen": 1}]})
    assert spec.schedule == {4: 4, 8: 2, 32: 1}
    assert [spec.draft_len_at(n) for n in (1, 4, 5, 8, 9, 32, 33)] == [4, 4, 2, 2, 1, 1, 0]
    cut = SpeculativeSpec.model_validate({"mode": "NGram", "maxDraftLen": 3, "maxConcurrency": 2})
    assert [cut.draft_len_at(n) for n in (1, 2, 3)] == [3, 3, 0]


def test_every_rule_is_a_cel_rule_of_the_crd() -> None:
    spec_rules = structural_schema(BaseModelSpec)["x-kubernetes-validations"]
    own_rules = structural_schema(BaseModelSpec)["properties"]["speculative"]["x-kubernetes-validations"]
    for rule in SPEC_RULES:
        assert rule.to_cel() in spec_rules, rule.rule_id
    for rule in SPECULATIVE_OWN_RULES:
        assert rule.to_cel() in own_rules, rule.rule_id
