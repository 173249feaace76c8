"""The Triton llmapi model's ``model.yaml`` and server: the trtllm-serve options plus model and triton_config."""

from __future__ import annotations

import yaml
from trtfleet_engines.pytorch.llmapi import (
    build_llmapi_model_config,
    llmapi_probes,
    render_llmapi_model_yaml,
    repository_script,
    triton_argv,
)
from trtfleet_engines.pytorch.options import build_llm_api_options

from trtfleet.api import BaseModelSpec

SPEC = BaseModelSpec.model_validate(
    {"source": {"uri": "hf://meta-llama/Meta-Llama-3-8B-Instruct"}, "architecture": "llama",
     "serving": {"server": "triton"}}
)


def test_model_yaml_is_the_trtllm_serve_options_plus_model_backend_and_triton_config() -> None:
    config = build_llmapi_model_config(SPEC, checkpoint_dir="/model-cache/checkpoints/h/original")
    extra = {k: v for k, v in config.items() if k not in build_llm_api_options(SPEC)}
    assert extra == {
        "model": "/model-cache/checkpoints/h/original",
        "backend": "pytorch",
        "triton_config": {"max_batch_size": 0, "decoupled": True},
    }


def test_rendered_model_yaml_is_deterministic_and_parses_back() -> None:
    first = render_llmapi_model_yaml(SPEC, checkpoint_dir="/c")
    assert first == render_llmapi_model_yaml(SPEC, checkpoint_dir="/c")
    assert yaml.safe_load(first) == build_llmapi_model_config(SPEC, checkpoint_dir="/c")


def test_repository_script_copies_the_template_then_our_model_yaml() -> None:
    script = repository_script(repository_dir="/repo", model_yaml_path="/etc/o/model.yaml", template_dir="/t/m/")
    lines = script.splitlines()
    assert lines == [
        "set -eu",
        "mkdir -p /repo/tensorrt_llm",
        "cp -R /t/m/. /repo/tensorrt_llm/",
        "cp /etc/o/model.yaml /repo/tensorrt_llm/1/model.yaml",
    ]


def test_tritonserver_keeps_auto_complete_and_probes_ready() -> None:
    argv = triton_argv(repository_dir="/repo")
    assert argv[0] == "tritonserver" and "--model-repository=/repo" in argv
    assert not any("auto-complete" in arg for arg in argv)
    probes = llmapi_probes()
    assert (probes.startup.path, probes.readiness.path, probes.liveness.path) == (
        "/v2/health/ready", "/v2/health/ready", "/v2/health/live"
    )
