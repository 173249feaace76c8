"""The convert Job converts Phi-3's fused ``gate_up_proj`` to ``mlp_h_to_4h`` (5), in an artifact of its own."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
from trtfleet_operator.jobs import convert as convert_job

FUSED = Path(__file__).resolve().parents[3] / "fixtures" / "lora" / "fused"


def test_the_entrypoint_converts_a_phi3_fused_adapter_to_mlp_h_to_4h(tmp_path: Path) -> None:
    out = tmp_path / "out"
    code = convert_job.main(
        [
            "--source-uri", f"file://{FUSED}",
            "--out", str(out),
            "--dtype", "float16",
            "--architecture", "phi3",
            "--termination-log", str(tmp_path / "log"),
            "--trtfleet", str(Path(sys.executable).parent / "trtfleet"),
        ]
    )
    assert code == 0, (tmp_path / "log").read_text()
    config = np.load(out / "model.lora_config.npy", allow_pickle=False)
    module_ids = set(config[0, :, 0].tolist())
    assert 5 in module_ids and 18 not in module_ids
    assert "mlp_h_to_4h" in json.loads((tmp_path / "log").read_text())["modules"]
