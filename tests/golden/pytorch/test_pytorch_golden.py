"""Golden files of the PyTorch-backend planning: options YAML, capacity plan, serving argv/probes/prepare.

Each ``<case>/input.yaml`` is a BaseModel; ``<case>/expected/`` holds what trtfleet renders for it.
Regenerate on purpose with ``pytest tests/golden/pytorch --update-golden`` and review the diff like code.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tests.support.golden import check_golden_dir
import yaml
from trtfleet_engines.pytorch.capacity import plan_pytorch_capacity
from trtfleet_engines.pytorch.options import OPTIONS_FILE_NAME, render_llm_api_options
from trtfleet_engines.pytorch.serving import plan_prepare, probes, serve_argv

from trtfleet.api import BaseModel

pytestmark = pytest.mark.golden

HERE = Path(__file__).resolve().parent
CASES = sorted(p.name for p in HERE.iterdir() if (p / "input.yaml").is_file())
CACHE_ROOT = "/var/lib/trtfleet/models"
OPTIONS_PATH = f"/etc/trtfleet/{OPTIONS_FILE_NAME}"


def _json(value: Any) -> str:
    return json.dumps(value, indent=2, sort_keys=True) + "\n"


def render_case(case: str) -> dict[str, str]:
    model = BaseModel.model_validate(yaml.safe_load((HERE / case / "input.yaml").read_text()))
    spec = model.spec
    capacity = plan_pytorch_capacity(spec)
    prepare = plan_prepare(spec, cache_root=CACHE_ROOT)
    serving = {
        "argv": list(serve_argv(checkpoint_dir=prepare.serve_checkpoint_dir, options_path=OPTIONS_PATH,
                                served_model_name=model.metadata["name"])),
        "probes": {name: getattr(probes(), name).to_kubernetes() for name in ("startup", "readiness", "liveness")},
        "prepare": {
            "contentHash": prepare.content_hash,
            "stage": {"sourceUri": prepare.stage.source_uri, "revision": prepare.stage.revision,
                      "destinationDir": prepare.stage.destination_dir},
            "quantize": None if prepare.quantize is None else list(prepare.quantize.argv),
            "serveCheckpointDir": prepare.serve_checkpoint_dir,
        } | ({} if prepare.draft is None else {"draft": {"sourceUri": prepare.draft.source_uri,
                                                          "revision": prepare.draft.revision,
                                                          "destinationDir": prepare.draft.destination_dir}}),
    }
    draft_dir = None if prepare.draft is None else prepare.draft.destination_dir
    return {
        OPTIONS_FILE_NAME: render_llm_api_options(spec, capacity, draft_dir=draft_dir),
        "capacity.json": _json(capacity.to_json_dict()),
        "serving.json": _json(serving),
    }


def test_cases_exist() -> None:
    assert {"reference-tiny", "llama-fp16-tp1-lora", "llama70b-fp8-kv-fp8", "qwen2-int8wo-lora-disabled"} <= set(CASES)


@pytest.mark.parametrize("case", CASES)
def test_golden(case: str, update_golden: bool) -> None:
    files = render_case(case)
    options = yaml.safe_load(files[OPTIONS_FILE_NAME])
    assert options["return_perf_metrics"] is True
    check_golden_dir(HERE / case / "expected", files, update=update_golden, case=case)
