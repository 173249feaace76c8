"""The prepare Job with ``speculative.draft`` on real files: the draft is staged beside the model, once, and a
draft that does not fit the model (another vocabulary, another tokenizer, not an EAGLE-3 head) is refused with
exit 2 and removed, so nothing serves it."""

from __future__ import annotations

import json
import shutil
from dataclasses import asdict
from pathlib import Path
from typing import Any

import pytest
from trtfleet_engines.pytorch.serving import plan_prepare
from trtfleet_engines.reference.numpy_llama import TINY_LLAMA_DIR
from trtfleet_operator.jobs import prepare as prepare_job

from trtfleet.api import BaseModelSpec


def _draft_dir(tmp_path: Path, config_patch: dict[str, Any]) -> Path:
    draft = tmp_path / "draft-src"
    shutil.copytree(TINY_LLAMA_DIR, draft)
    config = json.loads((draft / "config.json").read_text()) | config_patch
    (draft / "config.json").write_text(json.dumps(config))
    return draft


def _prepare(tmp_path: Path, mode: str, draft: Path, base: Path = Path(TINY_LLAMA_DIR)) -> tuple[int, str, Any]:
    spec = BaseModelSpec.model_validate({
        "source": {"uri": f"file://{base}"}, "architecture": "llama", "runtime": "pytorch",
        "lora": {"enabled": False},
        "speculative": {"mode": mode, "maxDraftLen": 3, "draft": {"source": {"uri": f"file://{draft}"}}},
    })
    plan = asdict(plan_prepare(spec, cache_root=str(tmp_path / "cache")))
    path = tmp_path / "plan.json"
    path.write_text(json.dumps(plan))
    log = tmp_path / "termination-log"
    code = prepare_job.main(["--plan", str(path), "--termination-log", str(log)])
    return code, log.read_text(), plan


def test_a_fitting_draft_is_staged_beside_the_model_once(tmp_path: Path) -> None:
    draft = _draft_dir(tmp_path, {"num_hidden_layers": 1})
    code, report, plan = _prepare(tmp_path, "DraftTarget", draft)
    assert code == 0, report
    assert json.loads(report)["draft"] is True
    staged = Path(plan["draft"]["destination_dir"])
    assert staged == Path(plan["root_dir"]) / "draft"
    assert json.loads((staged / "config.json").read_text())["num_hidden_layers"] == 1
    code, report, _ = _prepare(tmp_path, "DraftTarget", draft)
    assert (code, json.loads(report)["draft"]) == (0, False), "a staged draft is never copied again"


@pytest.mark.parametrize(
    ("mode", "config_patch", "words"),
    [
        pytest.param("DraftTarget", {"vocab_size": 32000}, "vocabulary has 32000 tokens", id="vocabulary"),
        pytest.param("Eagle3", {"architectures": ["LlamaForCausalLM"]}, "not an EAGLE-3 head", id="not-eagle3"),
        pytest.param("Eagle3", {"architectures": ["LlamaForCausalLMEagle3"], "hidden_size": 128},
                     "hidden_size is 128", id="eagle3-of-another-model"),
    ],
)
def test_a_draft_that_does_not_fit_is_refused_and_removed(
    tmp_path: Path, mode: str, config_patch: dict[str, Any], words: str
) -> None:
    code, report, plan = _prepare(tmp_path, mode, _draft_dir(tmp_path, config_patch))
    assert code == prepare_job.SPEC_ERROR_EXIT_CODE
    assert words in report and "does not fit the model" in report
    assert not Path(plan["draft"]["destination_dir"]).exists()


def test_a_draft_with_another_tokenizer_is_refused(tmp_path: Path) -> None:
    base = tmp_path / "base-src"
    shutil.copytree(TINY_LLAMA_DIR, base)
    draft = _draft_dir(tmp_path, {})
    for directory, vocab in ((base, {"a": 0, "b": 1}), (draft, {"b": 0, "a": 1})):
        (directory / "tokenizer.json").write_text(json.dumps({"model": {"type": "BPE", "vocab": vocab}}))
    code, report, _ = _prepare(tmp_path, "DraftTarget", draft, base)
    assert code == prepare_job.SPEC_ERROR_EXIT_CODE and "tokenizer.json maps tokens differently" in report
