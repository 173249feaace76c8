"""Speculative decoding in the engine tooling: the release table, the options and Triton renderings, the
Medusa build plan, the prepare plan and the capacity planners' accounting of drafts."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pytest
from trtfleet_engines.capacity import plan_capacity
from trtfleet_engines.constraints import TrtllmRelease, image_release, speculative_violations
from trtfleet_engines.errors import ReleaseConstraintError, SpecError
from trtfleet_engines.plan import plan_engine_build
from trtfleet_engines.pytorch.capacity import plan_pytorch_capacity
from trtfleet_engines.pytorch.options import build_llm_api_options
from trtfleet_engines.pytorch.serving import plan_prepare, prepare_hash
from trtfleet_engines.speculation import draft_problems, tokens_per_step
from trtfleet_engines.triton.render import render_configs

from trtfleet.api.basemodel import BaseModelSpec, SpeculativeMode

MakeSpec = Callable[..., BaseModelSpec]
NEW = "nvcr.io/nvidia/tensorrt-llm/release:1.3.0rc21"
NEWEST = "nvcr.io/nvidia/tensorrt-llm/release:1.4.0rc4"
EAGLE3 = {"mode": "Eagle3", "draft": {"source": {"uri": "hf://yuhuili/EAGLE3-LLaMA3.1-Instruct-8B"}}}
MEDUSA = {"mode": "Medusa", "maxDraftLen": 3, "draft": {"source": {"uri": "hf://org/medusa"}, "numHeads": 4}}


@pytest.mark.parametrize(
    ("image", "release"),
    [
        ("nvcr.io/nvidia/tensorrt-llm/release:1.3.0rc21", "1.3.0rc21"),
        ("registry.local/mirror/trtllm:1.4.0rc4", "1.4.0rc4"),
        ("nvcr.io/nvidia/tritonserver:25.12-trtllm-python-py3", "1.2.1"),
        ("nvcr.io/nvidia/tritonserver:26.03-trtllm-python-py3", None),
        ("registry.local/trtllm:latest", None),
        ("registry.local/trtllm", None),
    ],
)
def test_the_release_an_image_names(image: str, release: str | None) -> None:
    found = image_release(image)
    assert (None if found is None else str(found)) == release


def test_release_candidates_come_before_the_release() -> None:
    rc20, rc9, final = (TrtllmRelease.parse(t) for t in ("1.3.0rc20", "1.3.0rc9", "1.3.0"))
    assert rc9 and rc20 and final and rc9.key < rc20.key < final.key


@dataclass(frozen=True)
class ReleaseCase:
    patch: dict[str, Any]
    rule: str | None


RELEASE_CASES = [
    pytest.param(ReleaseCase({"engine": {"image": NEW}, "speculative": {"mode": "NGram"}}, None), id="ngram-lora-new"),
    pytest.param(ReleaseCase({"speculative": {"mode": "NGram"}}, "lora-speculation-needs-1.3.0rc20"),
                 id="ngram-lora-on-1.2.1"),
    pytest.param(ReleaseCase({"engine": {"image": "registry.local/trtllm:latest"}, "speculative": EAGLE3},
                             "lora-speculation-needs-1.3.0rc20"), id="eagle3-lora-unknown-release"),
    pytest.param(ReleaseCase({"lora": {"enabled": False}, "speculative": {"mode": "NGram"}}, None),
                 id="ngram-without-lora-on-1.2.1"),
    pytest.param(ReleaseCase({"engine": {"image": NEW}, "speculative": {
        "mode": "NGram", "acceptanceRateWindowSize": 32, "acceptanceRateThreshold": 0.3}},
        "acceptance-controls-need-1.3.0rc29"), id="acceptance-controls-on-rc21"),
    pytest.param(ReleaseCase({"engine": {"image": NEWEST}, "speculative": {
        "mode": "NGram", "acceptanceRateWindowSize": 32, "acceptanceRateThreshold": 0.3}}, None),
        id="acceptance-controls-on-1.4"),
]


@pytest.mark.parametrize("case", RELEASE_CASES)
def test_the_release_table_for_pytorch(make_spec: MakeSpec, case: ReleaseCase) -> None:
    spec = make_spec({"runtime": "pytorch", **case.patch})
    messages = speculative_violations(spec)
    assert [m[1:m.index("]")] for m in messages] == ([] if case.rule is None else [case.rule])
    for message in messages:
        assert ": use an image" in message or "tag the image" in message


@pytest.mark.parametrize(
    ("patch", "rule"),
    [
        ({"architecture": "mistral"}, "medusa-needs-llama"),
        ({"quantization": {"mode": "int8_weight_only"}}, "medusa-unquantized"),
    ],
)
def test_medusa_engines_the_release_refuses(make_spec: MakeSpec, patch: dict[str, Any], rule: str) -> None:
    spec = make_spec({"lora": {"enabled": False}, "speculative": MEDUSA, **patch})
    with pytest.raises(ReleaseConstraintError) as refused:
        plan_engine_build(spec)
    assert refused.value.rule_id == rule


def test_a_draft_of_another_vocabulary_is_refused_at_planning(make_spec: MakeSpec) -> None:
    spec = make_spec({"runtime": "pytorch", "lora": {"enabled": False}, "speculative": {
        "mode": "DraftTarget", "draft": {"source": {"uri": "hf://meta-llama/Llama-2-7b-hf"}}}})
    assert any("[draft-vocabulary]" in m and "32000" in m for m in speculative_violations(
        spec, base_vocab=128256, draft_vocab=32000))


def test_the_options_render_speculative_config_exactly(make_spec: MakeSpec) -> None:
    spec = make_spec({"runtime": "pytorch", "engine": {"image": NEWEST}, "speculative": {
        "mode": "NGram", "maxDraftLen": 4, "ngram": {"maxMatchingNgramSize": 3, "isPublicPool": False},
        "draftLenSchedule": [{"maxBatchSize": 8, "draftLen": 4}, {"maxBatchSize": 32, "draftLen": 1}],
        "acceptanceRateWindowSize": 64, "acceptanceRateThreshold": 0.25}})
    options = build_llm_api_options(spec)
    assert options["speculative_config"] == {
        "decoding_type": "NGram", "max_draft_len": 4, "max_matching_ngram_size": 3, "is_public_pool": False,
        "is_keep_all": True, "is_use_oldest": True, "draft_len_schedule": {8: 4, 32: 1},
        "acceptance_rate_window_size": 64, "acceptance_rate_threshold": 0.25,
    }
    assert options["disable_overlap_scheduler"] is True


def test_a_draft_model_is_read_from_its_staged_directory(make_spec: MakeSpec) -> None:
    spec = make_spec({"runtime": "pytorch", "engine": {"image": NEW}, "speculative": EAGLE3})
    prepare = plan_prepare(spec, cache_root="/cache")
    assert prepare.draft is not None and prepare.draft.destination_dir == f"{prepare.root_dir}/draft"
    options = build_llm_api_options(spec, draft_dir=prepare.draft.destination_dir)
    assert options["speculative_config"] == {"decoding_type": "Eagle3", "max_draft_len": 3,
                                             "speculative_model": prepare.draft.destination_dir}
    assert "disable_overlap_scheduler" not in options
    with pytest.raises(SpecError, match="staged directory"):
        build_llm_api_options(spec)


def test_the_prepare_hash_covers_the_draft_only(make_spec: MakeSpec) -> None:
    plain = make_spec({"runtime": "pytorch"})
    ngram = make_spec({"runtime": "pytorch", "speculative": {"mode": "NGram"}})
    eagle = make_spec({"runtime": "pytorch", "speculative": EAGLE3})
    other = make_spec({"runtime": "pytorch", "speculative": {
        **EAGLE3, "draft": {"source": {"uri": EAGLE3["draft"]["source"]["uri"], "revision": "r2"}}}})
    assert prepare_hash(plain) == prepare_hash(ngram), "a model-free mode stages nothing more"
    assert len({prepare_hash(plain), prepare_hash(eagle), prepare_hash(other)}) == 3
    assert "draft" not in plan_prepare(plain, cache_root="/c").to_dict()


def test_a_medusa_engine_is_converted_with_its_heads_and_built_for_them(make_spec: MakeSpec) -> None:
    plan = plan_engine_build(make_spec({"lora": {"enabled": False}, "speculative": MEDUSA}))
    steps = {step.name: step for step in plan.steps}
    assert steps["fetch-draft"].local_dir == "/work/draft"  # type: ignore[union-attr]
    convert = steps["convert-checkpoint"].argv  # type: ignore[union-attr]
    assert convert[1].endswith("examples/medusa/convert_checkpoint.py")
    assert convert[convert.index("--medusa_model_dir") + 1] == "/work/draft"
    assert convert[convert.index("--num_medusa_heads") + 1] == "4"
    build = steps["trtllm-build"].argv  # type: ignore[union-attr]
    assert build[build.index("--speculative_decoding_mode") + 1] == "medusa"
    assert build[build.index("--max_draft_len") + 1] == "3"


def test_the_triton_config_names_the_decoding_mode(make_spec: MakeSpec) -> None:
    spec = make_spec({"lora": {"enabled": False}, "speculative": {**MEDUSA, "medusaChoices": "{0}, {0, 0}, {1}"}})
    config = render_configs(spec, "/trtfleet/artifact/engine")["tensorrt_llm"]
    assert 'key: "decoding_mode"\n  value: { string_value: "medusa" }' in config
    assert 'value: { string_value: "{0}, {0, 0}, {1}" }' in config


def test_the_reference_engine_gets_the_same_speculative_config(make_spec: MakeSpec) -> None:
    spec = make_spec({"runtime": "reference", "engine": {"gpu": {"product": "cpu"}},
                      "source": {"uri": "file:///opt/trtfleet/models/tiny-llama"},
                      "speculative": {"mode": "NGram", "maxDraftLen": 5}})
    config = render_configs(spec, "/models/tiny")["tensorrt_llm"]
    assert "reference_speculative_config" in config and "decoding_mode" not in config
    assert '\\"max_draft_len\\":5' in config or '"max_draft_len":5' in config


def test_capacity_counts_the_draft(make_spec: MakeSpec) -> None:
    base = make_spec({"runtime": "pytorch", "lora": {"enabled": False}})
    drafted = make_spec({"runtime": "pytorch", "lora": {"enabled": False}, "speculative": {
        "mode": "DraftTarget", "maxDraftLen": 4, "draft": {"source": {"uri": "hf://meta-llama/Llama-3.2-1B-Instruct"}}}})
    plain, plan = plan_pytorch_capacity(base), plan_pytorch_capacity(drafted)
    assert plan.speculation is not None
    assert 2.0e9 < plan.speculation.draft_weights_bytes < 3.0e9, "a 1.2B draft in fp16"
    assert plan.free_bytes == plain.free_bytes - plan.speculation.draft_weights_bytes
    assert plan.kv_bytes_per_token > plain.kv_bytes_per_token, "the draft model caches its own K/V"
    assert plan.speculation.draft_kv_cache_tokens == 64 * 4
    assert plan.speculation.decode_requests_per_step == 64


def test_capacity_warns_when_max_num_tokens_cannot_hold_a_batch_of_drafts(make_spec: MakeSpec) -> None:
    spec = make_spec({"lora": {"enabled": False}, "engine": {"maxNumTokens": 128, "maxInputLen": 64},
                      "speculative": MEDUSA})
    plan = plan_capacity(spec)
    assert plan.verdict == "ok"
    assert plan.to_status()["decodeRequestsPerStep"] == 32
    assert any("engine.maxNumTokens 128 lets one step verify 32" in w for w in plan.warnings)


def test_an_unplanned_draft_is_a_warning(make_spec: MakeSpec) -> None:
    spec = make_spec({"runtime": "pytorch", "lora": {"enabled": False}, "speculative": {
        "mode": "PARD", "draft": {"source": {"uri": "hf://org/unknown-pard"}}}})
    plan = plan_pytorch_capacity(spec)
    assert plan.verdict == "ok" and any("set speculative.draft.dimensions" in w for w in plan.warnings)


def test_expected_tokens_per_step() -> None:
    assert tokens_per_step(0.0, 4) == 1.0
    assert tokens_per_step(1.0, 4) == 5.0
    assert tokens_per_step(0.5, 2) == pytest.approx(1.75, abs=1e-12)


def test_draft_problems_name_the_misfit() -> None:
    base = {"vocab_size": 260, "hidden_size": 64, "intermediate_size": 176, "num_hidden_layers": 2,
            "num_attention_heads": 4}
    assert draft_problems(SpeculativeMode.DRAFT_TARGET, base, {**base, "num_hidden_layers": 1}) == []
    assert draft_problems(SpeculativeMode.NGRAM, base, {"vocab_size": 1}) == []
