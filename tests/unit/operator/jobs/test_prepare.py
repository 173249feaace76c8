"""The prepare Job's entrypoint (``runtime: pytorch``) on real files: it stages a checkpoint once, runs the
quantization argv of its plan, and says why it failed."""

from __future__ import annotations

import json
import sys
from dataclasses import asdict
from pathlib import Path

import pytest
from trtfleet_engines.pytorch.serving import plan_prepare
from trtfleet_engines.reference.numpy_llama import TINY_LLAMA_DIR
from trtfleet_operator.jobs import prepare as prepare_job

from trtfleet.api import BaseModelSpec


def write_plan(tmp_path: Path, source_uri: str, quantize_code: str | None = None) -> Path:
    """The prepare plan of ``source_uri``; ``quantize_code`` (Python, argv: staged dir, output dir) stands in
    for ModelOpt's script, which needs a GPU."""
    spec = BaseModelSpec.model_validate(
        {"source": {"uri": source_uri}, "architecture": "llama", "runtime": "pytorch"}
    )
    plan = asdict(plan_prepare(spec, cache_root=str(tmp_path / "cache")))
    if quantize_code is not None:
        output = str(Path(plan["root_dir"]) / "quantized")
        argv = [sys.executable, "-c", quantize_code, plan["stage"]["destination_dir"], output]
        plan["quantize"] = {"argv": argv, "output_dir": output}
    path = tmp_path / "plan.json"
    path.write_text(json.dumps(plan))
    return path


def prepare(tmp_path: Path, plan: Path) -> tuple[int, str]:
    log = tmp_path / "termination-log"
    code = prepare_job.main(["--plan", str(plan), "--termination-log", str(log)])
    return code, log.read_text()


def test_prepare_stages_the_checkpoint_once(tmp_path: Path) -> None:
    plan = write_plan(tmp_path, f"file://{TINY_LLAMA_DIR}")
    code, report = prepare(tmp_path, plan)
    assert code == 0, report
    staged = Path(json.loads(report)["serveDir"])
    assert (staged / "config.json").read_bytes() == (Path(TINY_LLAMA_DIR) / "config.json").read_bytes()
    assert json.loads(report)["staged"] is True
    code, report = prepare(tmp_path, plan)
    assert (code, json.loads(report)["staged"]) == (0, False), "a staged hash is never copied again"
    assert not list(staged.parent.glob(".*staging")), "no staging directory left behind"


def test_prepare_runs_the_quantization_argv_and_serves_its_output(tmp_path: Path) -> None:
    copy = "import shutil,sys; shutil.copytree(sys.argv[1], sys.argv[2])"
    code, report = prepare(tmp_path, write_plan(tmp_path, f"file://{TINY_LLAMA_DIR}", copy))
    assert code == 0, report
    assert json.loads(report)["quantized"] is True
    assert (Path(json.loads(report)["serveDir"]) / "config.json").is_file()
    assert json.loads(report)["serveDir"].endswith("/quantized")


@pytest.mark.parametrize(
    ("source", "quantize_code", "exit_code", "words"),
    [
        pytest.param("file:///nonexistent/model", None, 2, "no config.json", id="not-a-checkpoint"),
        pytest.param(f"file://{TINY_LLAMA_DIR}", "import sys; sys.exit('calibration OOM')", 1, "calibration OOM",
                     id="quantization-fails"),
        pytest.param(f"file://{TINY_LLAMA_DIR}", "pass", 1, "wrote no checkpoint", id="quantization-writes-nothing"),
    ],
)
def test_prepare_failures_say_why(
    tmp_path: Path, source: str, quantize_code: str | None, exit_code: int, words: str
) -> None:
    code, report = prepare(tmp_path, write_plan(tmp_path, source, quantize_code))
    assert code == exit_code and words in report


def test_an_unreadable_plan_fails_the_job_at_once(tmp_path: Path) -> None:
    plan = tmp_path / "plan.json"
    plan.write_text("{not json")
    code, report = prepare(tmp_path, plan)
    assert code == 2 and "unreadable" in report
