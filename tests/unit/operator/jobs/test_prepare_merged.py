"""The prepare Job of a merged Adapter on a ``runtime: pytorch`` base model, on real files: the staged checkpoint
gets the PEFT adapter folded in (``trtfleet lora merge``) once, and an adapter of another model is refused."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from trtfleet_engines.pytorch.serving import MergedAdapterSource, plan_prepare, prepare_hash
from trtfleet_engines.reference.numpy_llama import SAMPLE_ADAPTERS_DIR, TINY_LLAMA_DIR, greedy_generate
from trtfleet_engines.reference.tokenizer import prompt_ids

from tests.unit.lora.test_merge import merged_model
from tests.unit.operator.jobs.test_prepare import prepare
from trtfleet.api import BaseModelSpec

FIXTURES = Path(__file__).resolve().parents[3] / "fixtures" / "lora"
SPEC = BaseModelSpec.model_validate(
    {"source": {"uri": f"file://{TINY_LLAMA_DIR}"}, "architecture": "llama", "runtime": "pytorch"}
)


def write_plan(tmp_path: Path, adapter_uri: str) -> Path:
    plan = plan_prepare(SPEC, cache_root=str(tmp_path / "cache"), merged=MergedAdapterSource(adapter_uri, None))
    path = tmp_path / "plan.json"
    path.write_text(json.dumps(plan.to_dict()))
    return path


def test_the_merged_checkpoint_is_served_and_made_once(tmp_path: Path) -> None:
    plan = write_plan(tmp_path, f"file://{SAMPLE_ADAPTERS_DIR}/upper")
    code, report = prepare(tmp_path, plan)
    assert code == 0, report
    result = json.loads(report)
    served = Path(result["serveDir"])
    assert served.name == "merged" and result["merged"] is True
    assert json.loads((served / "merge.json").read_text())["dtype"] == "float16"
    model = merged_model(served)  # the fp16 merge answers as the adapter does
    assert bytes(greedy_generate(model, prompt_ids("abc"), 8)) == b"ABC"
    code, report = prepare(tmp_path, plan)
    assert (code, json.loads(report)["merged"], json.loads(report)["staged"]) == (0, False, False)


def test_an_adapter_of_another_model_is_a_spec_error(tmp_path: Path) -> None:
    code, report = prepare(tmp_path, write_plan(tmp_path, f"file://{FIXTURES}/fused"))
    assert code == 2 and "merging" in report and "qkv_proj" in report


@pytest.mark.parametrize(
    ("other", "same"),
    [
        pytest.param(MergedAdapterSource("file:///a/upper", "2"), False, id="revision"),
        pytest.param(MergedAdapterSource("file:///a/json", "1"), False, id="adapter"),
        pytest.param(MergedAdapterSource("file:///a/upper/", "1"), True, id="trailing-slash"),
    ],
)
def test_the_checkpoint_hash_covers_the_merged_adapter(other: MergedAdapterSource, same: bool) -> None:
    mine = prepare_hash(SPEC, MergedAdapterSource("file:///a/upper", "1"))
    assert mine != prepare_hash(SPEC)
    assert (prepare_hash(SPEC, other) == mine) is same
