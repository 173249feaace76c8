"""``trtfleet worker --runtime pytorch --server triton`` builds the llmapi repository with the worker's flags."""

from __future__ import annotations

import argparse
from pathlib import Path

import yaml
from trtfleet_engines.reference.cli import build_repository, configure


def args(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    configure(parser)
    return parser.parse_args(list(argv))


def test_pytorch_with_triton_builds_the_llmapi_model(tmp_path: Path) -> None:
    repo = build_repository(args("--runtime", "pytorch", "--server", "triton", "--max-loras", "1",
                                 "--max-cpu-loras", "2"), tmp_path)
    assert sorted(p.name for p in repo.iterdir()) == ["tensorrt_llm"]
    config = (repo / "tensorrt_llm" / "config.pbtxt").read_text()
    assert "decoupled: true" in config and '"--max-loras 1 --max-cpu-loras 2"' in config
    model_yaml = yaml.safe_load((repo / "tensorrt_llm" / "1" / "model.yaml").read_text())
    assert model_yaml["triton_config"] == {"max_batch_size": 0, "decoupled": True}
    assert (Path(model_yaml["model"]) / "config.json").is_file()


def test_the_triton_runtime_keeps_the_reference_models(tmp_path: Path) -> None:
    repo = build_repository(args(), tmp_path)
    assert "tensorrt_llm_bls" in {p.name for p in repo.iterdir()}
