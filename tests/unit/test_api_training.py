"""``Adapter.spec.training.baseQuantization`` (QLoRA): defaults as bitsandbytes', refusals with clear messages."""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest
from pydantic import ValidationError

from trtfleet.api import AdapterSpec, BaseQuantizationSpec

SPEC = {"baseModel": "llama3-8b", "source": {"uri": "hf://org/adapter"}}


@dataclass(frozen=True)
class Refusal:
    quantization: dict[str, object]
    message: str
    mode: str = "dynamic"
    extra: dict[str, object] = field(default_factory=dict)


@pytest.mark.parametrize(
    "case",
    [
        pytest.param(Refusal({"quantType": "int4"}, "'nf4' or 'fp4'"), id="unknown-type"),
        pytest.param(Refusal({}, "quantType\n  Field required"), id="type-required"),
        pytest.param(Refusal({"quantType": "nf4", "blockSize": 100}, "32, 64, 128"), id="block-size"),
        pytest.param(Refusal({"quantType": "nf4", "computeDtype": "fp8"}, "'float16', 'bfloat16'"), id="dtype"),
        pytest.param(Refusal({"quantType": "nf4"}, "mode merged cannot be combined", mode="merged"), id="merged"),
        pytest.param(Refusal({"quantType": "nf4"}, "nor mode auto", mode="auto"), id="auto"),
        pytest.param(Refusal({"quantType": "nf4", "bits": 4}, "Extra inputs"), id="unknown-field"),
    ],
)
def test_refusals(case: Refusal) -> None:
    with pytest.raises(ValidationError, match=case.message):
        AdapterSpec.model_validate({**SPEC, "mode": case.mode, "training": {"baseQuantization": case.quantization}})


def test_defaults_are_bitsandbytes() -> None:
    spec = AdapterSpec.model_validate({**SPEC, "training": {"baseQuantization": {"quantType": "fp4"}}})
    quantization = spec.base_quantization
    assert quantization == BaseQuantizationSpec.model_validate(
        {"quantType": "fp4", "blockSize": 64, "doubleQuant": False, "computeDtype": "float32"}
    )
    assert quantization is not None and quantization.variant_text() == "fp4:64:float32"
    assert AdapterSpec.model_validate(SPEC).base_quantization is None
    assert AdapterSpec.model_validate({**SPEC, "training": {}}).base_quantization is None


def test_variant_text_is_what_the_engines_parse() -> None:
    from trtfleet_engines.lora.qlora_base import BaseQuantization

    spec = BaseQuantizationSpec.model_validate(
        {"quantType": "nf4", "blockSize": 128, "doubleQuant": True, "computeDtype": "bfloat16"}
    )
    assert spec.variant_text() == "nf4:128:double:bfloat16"
    assert BaseQuantization.parse(spec.variant_text()) == BaseQuantization("nf4", 128, True, "bfloat16")
