"""``trtfleet worker --runtime pytorch --server triton`` builds the llmapi repository with the worker's flags."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pytest
import yaml
from trtfleet_engines.reference.cli import build_repository, configure
from trtfleet_engines.reference.errors import RepositoryError
from trtfleet_engines.reference.numpy_llama import SAMPLE_ADAPTERS_DIR


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


def test_a_merged_adapter_gets_the_merged_model_and_no_lora_config(tmp_path: Path) -> None:
    adapter = SAMPLE_ADAPTERS_DIR / "upper"
    repo = build_repository(args("--runtime", "pytorch", "--server", "triton", "--merged-adapter", str(adapter)),
                            tmp_path / "models")
    model_yaml = yaml.safe_load((repo / "tensorrt_llm" / "1" / "model.yaml").read_text())
    assert Path(model_yaml["model"]) == tmp_path / "merged-model"
    assert json.loads((tmp_path / "merged-model" / "merge.json").read_text())["dtype"] == "base"
    assert "lora_config" not in model_yaml


def test_a_served_name_that_contradicts_the_merged_adapter_is_refused(tmp_path: Path) -> None:
    flags = args("--runtime", "pytorch", "--server", "triton", "--merged-adapter", str(SAMPLE_ADAPTERS_DIR / "upper"),
                 "--merged-adapter-name", "shout", "--served-model-name", "tiny")
    with pytest.raises(RepositoryError, match="--served-model-name tiny differs .* shout"):
        build_repository(flags, tmp_path / "models")
