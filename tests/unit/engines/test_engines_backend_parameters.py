"""Guard: every rendered ``tensorrt_llm`` config carries the parameters the C++ backend reads without a default.

The ``tensorrtllm`` backend's ``ModelState::GetParameter`` throws "Cannot find parameter with name: ..." for a
missing key, and ``ModelInstanceState::Create`` turns that into a load failure. The list below is every
``GetParameter`` call outside a ``try`` in ``getExecutorConfigFromParams`` and what it calls (lookahead
parameters only when ``decoding_mode`` is lookahead, which trtfleet never sets), read at the named commit.
docs/engine-fidelity.md records the same list and commit; the last test keeps the two in step.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from google.protobuf import text_format
from tritonclient.grpc import model_config_pb2
from trtfleet_engines.triton import render_configs

from trtfleet.api.basemodel import BaseModelSpec

MakeSpec = Callable[..., BaseModelSpec]

BACKEND_SOURCE = "triton_backend/inflight_batcher_llm/src/model_instance_state.cc@c8c6df08"
"""NVIDIA/TensorRT-LLM, the 1.x backend source (same logic as tensorrtllm_backend v0.19.0 = c1e19638)."""

READ_WITHOUT_DEFAULT: dict[str, frozenset[str] | None] = {
    # parameter -> accepted values (None: any string, "" included)
    "gpt_model_type": frozenset({"V1", "v1", "inflight_batching", "inflight_fused_batching"}),
    "tokenizer_dir": None,
    "xgrammar_tokenizer_info_path": None,
    "guided_decoding_backend": frozenset({"", "xgrammar"}),
}
BOOLEANS = {"True", "true", "TRUE", "1", "False", "false", "FALSE", "0"}
"""``GetParameter<bool>`` accepts these and throws on anything else."""
BOOLEAN_PARAMETERS = ("enable_kv_cache_reuse", "enable_chunked_context", "exclude_input_in_output")

DOCS = Path(__file__).resolve().parents[3] / "docs" / "engine-fidelity.md"

SPECS = [
    pytest.param({}, id="default"),
    pytest.param({"lora": {"enabled": False}}, id="no-lora"),
    pytest.param({"quantization": {"mode": "int8_weight_only", "kvCacheDtype": "int8"}}, id="int8-kv"),
    pytest.param({"quantization": {"mode": "fp8", "kvCacheDtype": "fp8"}, "dtype": "bfloat16"}, id="fp8"),
]


def _parameters(spec: BaseModelSpec) -> dict[str, str]:
    text = render_configs(spec, "/trtfleet/artifact/engine")["tensorrt_llm"]
    config = text_format.Parse(text, model_config_pb2.ModelConfig())
    assert config.backend == "tensorrtllm"
    return {key: value.string_value for key, value in config.parameters.items()}


@pytest.mark.parametrize("patch", SPECS)
def test_parameters_read_without_a_default_are_rendered(make_spec: MakeSpec, patch: dict[str, Any]) -> None:
    params = _parameters(make_spec(patch))
    missing = sorted(set(READ_WITHOUT_DEFAULT) - set(params))
    assert not missing, f"the C++ backend ({BACKEND_SOURCE}) cannot load without {missing}"
    for name, accepted in READ_WITHOUT_DEFAULT.items():
        if accepted is not None:
            assert params[name] in accepted, (name, params[name])
    for name in BOOLEAN_PARAMETERS:
        assert params[name] in BOOLEANS, (name, params[name])
    assert 0 < float(params["kv_cache_free_gpu_mem_fraction"]) < 1


def test_guided_decoding_stays_off(make_spec: MakeSpec) -> None:
    """Empty backend or info path: getGuidedDecodingConfigFromParams returns no config (no xgrammar file read)."""
    params = _parameters(make_spec())
    assert params["guided_decoding_backend"] == "" and params["xgrammar_tokenizer_info_path"] == ""


def test_docs_record_the_same_list_and_commit() -> None:
    text = DOCS.read_text(encoding="utf-8")
    assert BACKEND_SOURCE in text
    for name in READ_WITHOUT_DEFAULT:
        assert f"`{name}`" in text, name
