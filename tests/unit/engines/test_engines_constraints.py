"""The release-constraint table: what TRT-LLM 1.2.1 refuses is refused in planning, what it silently changes
(paged context FMHA off) flows into the build argv and the rendered config (issue 20, items 2-5)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import pytest
from google.protobuf import text_format
from pydantic import ValidationError
from tritonclient.grpc import model_config_pb2
from trtfleet_engines.constraints import BUILD_RULES, RUNTIME_RULES, engine_features, release_violations
from trtfleet_engines.errors import ReleaseConstraintError
from trtfleet_engines.plan import CommandStep, plan_engine_build
from trtfleet_engines.triton import render_configs

from trtfleet.api.basemodel import BaseModelSpec
from trtfleet.api.crdgen import structural_schema

MakeSpec = Callable[..., BaseModelSpec]


def quant(mode: str = "none", kv: str = "auto", gpu: str = "H100-80GB", **serving: Any) -> dict[str, Any]:
    return {
        "quantization": {"mode": mode, "kvCacheDtype": kv},
        "engine": {"gpu": {"product": gpu}},
        "serving": serving,
    }


@dataclass(frozen=True)
class Refused:
    patch: dict[str, Any]
    rule_id: str
    fragments: tuple[str, ...] = field(default=())


REFUSED = [
    pytest.param(Refused(quant("int8_weight_only", gpu="B200"), "sm100-no-int-weights",
                         ("INT8/INT4 quantization is not supported on SM>=100", "on B200 use")), id="b200-int8-wo"),
    pytest.param(Refused(quant("int4_weight_only", gpu="B200"), "sm100-no-int-weights"), id="b200-int4-wo"),
    pytest.param(Refused(quant("int4_awq", gpu="B200"), "sm100-no-int-weights", ("W4A16_AWQ",)), id="b200-awq"),
    pytest.param(Refused(quant("none", "int8", gpu="B200"), "sm100-no-int8-kv"), id="b200-int8-kv"),
    pytest.param(Refused(quant("fp8", gpu="A100-80GB"), "fp8-needs-sm89", ("needs a GPU with fp8",)), id="fp8-a100"),
    pytest.param(Refused(quant("none", "fp8", gpu="A10G"), "fp8-kv-needs-sm89"), id="fp8-kv-a10g"),
    pytest.param(
        Refused(quant("none", "int8", enableChunkedContext=True), "chunked-context-needs-paged-context-fmha",
                ("remove serving.enableChunkedContext", "int8-kv-no-paged-context-fmha",
                 "Chunked context requires context FMHA")),
        id="int8-kv-explicit-chunked",
    ),
    pytest.param(
        Refused(quant("int4_awq", "fp8", enableKvCacheReuse=True), "kv-reuse-needs-paged-context-fmha",
                ("remove serving.enableKvCacheReuse", "fp8-kv-without-fp8-weights-no-paged-context-fmha")),
        id="awq-fp8-kv-explicit-reuse",
    ),
]


@pytest.mark.parametrize("case", REFUSED)
def test_the_release_refuses_before_a_job_starts(make_spec: MakeSpec, case: Refused) -> None:
    spec = make_spec(case.patch)
    with pytest.raises(ReleaseConstraintError) as caught:
        plan_engine_build(spec)
    assert caught.value.rule_id == case.rule_id
    message = str(caught.value)
    assert f"[{case.rule_id}]" in message and "TensorRT-LLM 1.2.1" in message
    for fragment in case.fragments:
        assert fragment in message


@pytest.mark.parametrize(
    "patch",
    [
        pytest.param(quant("fp8", "fp8", gpu="B200"), id="b200-fp8"),
        pytest.param(quant("none", gpu="B200"), id="b200-fp16"),
        pytest.param(quant("int8_weight_only", "int8", gpu="H100-80GB"), id="h100-int8-int8-kv"),
        pytest.param(quant("none", "int8", enableChunkedContext=False, enableKvCacheReuse=False), id="explicit-off"),
        pytest.param(quant("fp8", "fp8", gpu="L4", enableChunkedContext=True), id="fp8-fp8-chunked"),
    ],
)
def test_the_release_accepts(make_spec: MakeSpec, patch: dict[str, Any]) -> None:
    spec = make_spec(patch)
    assert release_violations(spec) == ()
    assert plan_engine_build(spec).steps  # planning does not raise and plans a build


@dataclass(frozen=True)
class Features:
    mode: str
    kv: str
    paged: bool


FEATURES = [
    Features("none", "auto", True),
    Features("fp8", "auto", True),
    Features("fp8", "fp8", True),
    Features("none", "int8", False),
    Features("int8_weight_only", "int8", False),
    Features("none", "fp8", False),
    Features("int8_weight_only", "fp8", False),
    Features("int4_weight_only", "fp8", False),
    Features("int4_awq", "fp8", False),
]


@pytest.mark.parametrize("case", FEATURES, ids=[f"{c.mode}-{c.kv}" for c in FEATURES])
def test_unset_options_follow_paged_context_fmha(make_spec: MakeSpec, case: Features) -> None:
    spec = make_spec(quant(case.mode, case.kv))
    features = engine_features(spec)
    assert (features.paged_context_fmha, features.chunked_context, features.kv_cache_reuse) == (case.paged,) * 3
    argv = next(s for s in plan_engine_build(spec).steps if isinstance(s, CommandStep) and s.name == "trtllm-build")
    flag = argv.argv[argv.argv.index("--use_paged_context_fmha") + 1]
    assert flag == ("enable" if case.paged else "disable")
    config = text_format.Parse(render_configs(spec, "/e")["tensorrt_llm"], model_config_pb2.ModelConfig())
    rendered = {k: v.string_value for k, v in config.parameters.items()}
    expected = "true" if case.paged else "false"
    assert (rendered["enable_chunked_context"], rendered["enable_kv_cache_reuse"]) == (expected, expected)


def test_the_rendered_config_says_why_a_feature_is_off(make_spec: MakeSpec) -> None:
    text = render_configs(make_spec(quant("none", "int8")), "/e")["tensorrt_llm"]
    comments = [line for line in text.splitlines() if line.startswith("# ")]
    assert any("int8-kv-no-paged-context-fmha" in line and "builder.py@" in line for line in comments)
    reuse = "# enable_kv_cache_reuse false (kv-reuse-needs-paged-context-fmha)"
    assert any(line.startswith(reuse) for line in comments)


def test_explicit_false_is_kept_on_a_capable_engine(make_spec: MakeSpec) -> None:
    features = engine_features(make_spec(quant(enableChunkedContext=False, enableKvCacheReuse=False)))
    assert features.paged_context_fmha and not features.chunked_context and not features.kv_cache_reuse


def test_every_rule_names_an_upstream_source() -> None:
    for rule in BUILD_RULES:
        assert rule.fix and ("@" in rule.upstream or rule.upstream.startswith("hardware")), rule.rule_id
    for runtime_rule in RUNTIME_RULES:
        assert "@" in runtime_rule.upstream or ".md" in runtime_rule.upstream, runtime_rule.rule_id
    ids = [r.rule_id for r in BUILD_RULES] + [r.rule_id for r in RUNTIME_RULES]
    assert len(ids) == len(set(ids))


@pytest.mark.parametrize("fraction", [1.0, 1.5])
def test_kv_cache_fraction_must_stay_below_one(make_spec: MakeSpec, fraction: float) -> None:
    with pytest.raises(ValidationError, match="kvCacheFreeGpuMemFraction must be smaller than 1.0"):
        make_spec({"serving": {"kvCacheFreeGpuMemFraction": fraction}})
    make_spec({"serving": {"kvCacheFreeGpuMemFraction": 0.99}})


def test_kv_cache_fraction_schema_is_exclusive() -> None:
    """The CRD (apiextensions/v1: a bound plus a boolean) refuses 1.0 at ``kubectl apply`` too."""
    spec = structural_schema(BaseModelSpec)
    fraction = spec["properties"]["serving"]["properties"]["kvCacheFreeGpuMemFraction"]
    assert (fraction["maximum"], fraction["exclusiveMaximum"]) == (1, True)
    assert (fraction["minimum"], fraction["exclusiveMinimum"]) == (0, True)
