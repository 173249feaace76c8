"""The convert Job's ``--stage-peft`` (``runtime: pytorch``) on real files: it validates with the real
converter and stages the PEFT directory itself (DoRA refused before any pod could read it)."""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

from trtfleet_engines.reference.numpy_llama import SAMPLE_ADAPTERS_DIR
from trtfleet_operator.jobs import convert as convert_job

TRTFLEET = str(Path(sys.executable).parent / "trtfleet")


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
