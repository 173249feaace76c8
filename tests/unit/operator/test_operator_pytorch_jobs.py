"""The ``runtime: pytorch`` Job entrypoints on real files: the prepare Job stages a checkpoint once, runs the
quantization argv of its plan, and says why it failed; the convert Job's ``--stage-peft`` validates with the
real converter and stages the PEFT directory itself (DoRA refused before any pod could read it)."""

from __future__ import annotations

import json
import shutil
import sys
from dataclasses import asdict
from pathlib import Path

import pytest
from trtfleet_engines.pytorch.serving import plan_prepare
from trtfleet_engines.reference.numpy_llama import SAMPLE_ADAPTERS_DIR, TINY_LLAMA_DIR
from trtfleet_operator.jobs import convert as convert_job
from trtfleet_operator.jobs import prepare as prepare_job

from trtfleet.api import BaseModelSpec

TRTFLEET = str(Path(sys.executable).parent / "trtfleet")


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


def stage_peft(tmp_path: Path, source: Path) -> tuple[int, str, Path]:
    out = tmp_path / "artifacts" / "adapter-peft"
    log = tmp_path / "log"
    code = convert_job.main(
        [
            "--source-uri", f"file://{source}",
            "--out", str(out),
            "--dtype", "float16",
            "--work", str(tmp_path / "work"),
            "--termination-log", str(log),
            "--trtfleet", TRTFLEET,
            "--stage-peft",
        ]
    )
    return code, log.read_text(), out


def test_stage_peft_validates_then_stages_the_peft_directory(tmp_path: Path) -> None:
    source = Path(SAMPLE_ADAPTERS_DIR) / "json"
    code, report, out = stage_peft(tmp_path, source)
    assert code == 0, report
    for name in ("adapter_config.json", "adapter_model.safetensors"):
        assert (out / name).read_bytes() == (source / name).read_bytes()
    assert (out / "manifest.json").is_file() and not (out / "model.lora_weights.npy").exists()
    summary = json.loads(report)
    assert summary["rank"] >= 1 and summary["dtype"] == "float16"


def test_stage_peft_refuses_dora_and_stages_nothing(tmp_path: Path) -> None:
    source = tmp_path / "dora"
    shutil.copytree(Path(SAMPLE_ADAPTERS_DIR) / "json", source)
    config = json.loads((source / "adapter_config.json").read_text())
    (source / "adapter_config.json").write_text(json.dumps({**config, "use_dora": True}))
    code, report, out = stage_peft(tmp_path, source)
    assert code == 1 and "dora" in report.lower()
    assert not out.exists()
