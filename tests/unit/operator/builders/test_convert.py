"""The convert Job as built: the base model's module mapping is part of the conversion (its Job, its
artifact)."""

from __future__ import annotations

import pytest
from trtfleet_operator.builders.convert import artifact_dir, build_convert_job, conversion_id, module_mapping
from trtfleet_operator.config import OperatorConfig

from tests.unit.operator.helpers import llama
from trtfleet.api import BaseModelSpec, Source


def _job_args(architecture: str) -> list[str]:
    base = BaseModelSpec.model_validate({**llama()["spec"], "architecture": architecture})
    job = build_convert_job(
        adapter="a", namespace="ns", owner={"uid": "u"}, source=Source(uri="s3://adapters/a"), source_key="k",
        basemodel="b", base=base, config=OperatorConfig(),
    )
    args: list[str] = job["spec"]["template"]["spec"]["containers"][0]["args"]
    return args


@pytest.mark.parametrize(("architecture", "mapping"), [("phi3", "phi3"), ("llama", None), ("qwen2", None)])
def test_the_module_mapping_is_part_of_the_conversion(architecture: str, mapping: str | None) -> None:
    base = BaseModelSpec.model_validate({**llama()["spec"], "architecture": architecture})
    assert module_mapping(base) == mapping
    args = _job_args(architecture)
    out = args[args.index("--out") + 1]
    if mapping:
        assert args[args.index("--architecture") + 1] == "phi3" and out.endswith("-float16-phi3")
        assert conversion_id("k", "float16", mapping) != conversion_id("k", "float16")
    else:
        assert "--architecture" not in args and out.endswith(f"/{artifact_dir('k', 'float16')}")
