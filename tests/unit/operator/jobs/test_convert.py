"""The convert Job's entrypoint: it reports a missing source, and converts a sample adapter into an artifact
whose summary matches its manifest."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from trtfleet_operator.artifacts import parse_summary
from trtfleet_operator.jobs import convert as convert_job


def test_convert_job_entrypoint_reports_a_missing_source(tmp_path: Path) -> None:
    log = tmp_path / "termination-log"
    code = convert_job.main(
        [
            "--source-uri",
            f"file://{tmp_path}/missing",
            "--out",
            str(tmp_path / "out"),
            "--dtype",
            "float16",
            "--termination-log",
            str(log),
            "--trtfleet",
            str(Path(sys.executable).parent / "trtfleet"),
        ]
    )
    assert code == 1
    assert log.read_text().startswith(f"trtfleet lora convert file://{tmp_path}/missing failed")


def test_convert_job_entrypoint_converts_a_sample_adapter(tmp_path: Path) -> None:
    from trtfleet_engines.reference.numpy_llama import SAMPLE_ADAPTERS_DIR

    samples = sorted(p for p in Path(SAMPLE_ADAPTERS_DIR).glob("*") if (p / "adapter_config.json").is_file())
    assert samples, "the committed sample adapters are missing (hack/gen_reference_assets.py makes them)"
    log = tmp_path / "termination-log"
    argv = [
        sys.executable,
        "-m",
        "trtfleet_operator.jobs.convert",
        "--source-uri",
        f"file://{samples[0]}",
        "--out",
        str(tmp_path / "out"),
        "--dtype",
        "float16",
        "--termination-log",
        str(log),
        "--trtfleet",
        str(Path(sys.executable).parent / "trtfleet"),
    ]
    subprocess.run(argv, check=True, capture_output=True, text=True)
    summary = parse_summary(log.read_text())
    assert summary.rank >= 1 and summary.modules and summary.dtype == "float16"
    manifest = json.loads((tmp_path / "out" / "manifest.json").read_text())
    assert summary.sha256 == manifest["outputs"]["model.lora_weights.npy"]["sha256"]
