"""Module ids and dims the TRT-LLM runtime expects (issue 20, items 6 and 8).

* Phi-3: ``examples/hf_lora_convert.py`` maps ``gate_up_proj`` -> ``mlp_h_to_4h`` (5) and
  ``Phi3ForCausalLM.trtllm_modules_to_hf_modules`` (tensorrt_llm/models/phi3/model.py@c4dc529f) maps
  ``mlp_h_to_4h`` <-> ``gate_up_proj``; phi3/convert.py@89fd9b74 stores the fused weight as [up; gate], so B's
  halves are swapped exactly as ``preprocess_lora_weights`` does. The Llama family keeps lora_helper's default
  ``gate_up_proj`` <-> ``mlp_gate_up`` (18).
* attn_dense: ``loraModule.cpp`` sizes it hidden x hidden; an o_proj adapter with heads x head_dim != hidden
  is refused (the runtime would read its rows with the wrong width).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from trtfleet_engines.lora.convert import ConversionOptions, convert_adapter, stored_to_float32
from trtfleet_engines.lora.errors import ShapeMismatchError, TargetModuleError
from trtfleet_engines.lora.peft import parse_peft_adapter, read_peft_dir
from trtfleet_engines.modeldims import TINY_LLAMA_DIMENSIONS

from trtfleet.api.basemodel import Architecture, LoraModule, ModelDimensions
from trtfleet.loracache import lora_module_shapes

ALL_MODULES = tuple(LoraModule)


@pytest.mark.parametrize(
    ("architecture", "module_id"),
    [
        pytest.param(Architecture.PHI3, 5, id="phi3-mlp_h_to_4h"),
        pytest.param(Architecture.LLAMA, 18, id="llama-mlp_gate_up"),
        pytest.param(None, 18, id="default-mlp_gate_up"),
    ],
)
def test_fused_gate_up_maps_per_architecture_with_b_halves_swapped(
    fixtures_dir: Path, architecture: Architecture | None, module_id: int
) -> None:
    adapter = parse_peft_adapter(*read_peft_dir(fixtures_dir / "fused"))
    options = ConversionOptions(target_modules=ALL_MODULES, dims=TINY_LLAMA_DIMENSIONS, architecture=architecture)
    converted = convert_adapter(adapter, options)
    fused = [i for i, row in enumerate(converted.rows) if converted.config[0, i, 0] == module_id]
    assert len(fused) == TINY_LLAMA_DIMENSIONS.num_layers
    index = fused[0]
    row = converted.rows[index]
    assert (row.in_dim, row.out_dim) == (TINY_LLAMA_DIMENSIONS.hidden_size, 2 * TINY_LLAMA_DIMENSIONS.intermediate_size)
    module = next(m for m in adapter.modules if m.hf_module == "gate_up_proj" and m.layer == row.layer)
    b = stored_to_float32(converted.weights[0, index])[row.rank * row.in_dim : row.elements]
    b = b.reshape(row.out_dim, row.rank)
    half = row.out_dim // 2
    hf_b = module.b * module.scale  # HF rows are [gate; up]; TRT-LLM's fused layer holds [up; gate]
    np.testing.assert_allclose(b[:half], hf_b[half:], atol=1e-3)
    np.testing.assert_allclose(b[half:], hf_b[:half], atol=1e-3)


def test_phi3_fused_gate_up_needs_mlp_h_to_4h_enabled(fixtures_dir: Path) -> None:
    adapter = parse_peft_adapter(*read_peft_dir(fixtures_dir / "fused"))
    modules = tuple(m for m in LoraModule if m is not LoraModule.MLP_H_TO_4H)
    options = ConversionOptions(target_modules=modules, dims=TINY_LLAMA_DIMENSIONS, architecture=Architecture.PHI3)
    with pytest.raises(TargetModuleError, match="lora module mlp_h_to_4h .* not enabled"):
        convert_adapter(adapter, options)


# A model whose attention width differs from hidden, as gemma-7b (16 x 256 = 4096 vs hidden 3072), scaled down.
WIDE_HEADS = ModelDimensions(
    hidden_size=8, intermediate_size=16, num_layers=1, num_attention_heads=2, num_kv_heads=2, head_dim=8,
    vocab_size=32,
)


def _o_proj_adapter(in_dim: int, out_dim: int, rank: int = 2) -> dict[str, np.ndarray]:
    key = "base_model.model.model.layers.0.self_attn.o_proj"
    rng = np.random.default_rng(0)
    return {
        f"{key}.lora_A.weight": rng.standard_normal((rank, in_dim)).astype(np.float32),
        f"{key}.lora_B.weight": rng.standard_normal((out_dim, rank)).astype(np.float32),
    }


def test_attn_dense_is_sized_hidden_by_hidden_in_the_cache_geometry() -> None:
    (dense,) = lora_module_shapes(WIDE_HEADS, [LoraModule.ATTN_DENSE])
    assert (dense.in_dim, dense.out_dim) == (8, 8)  # not heads x head_dim = 16


def test_o_proj_wider_than_hidden_is_refused_with_the_reason() -> None:
    config = {"peft_type": "LORA", "r": 2, "lora_alpha": 4, "target_modules": ["o_proj"]}
    adapter = parse_peft_adapter(config, _o_proj_adapter(16, 8))
    options = ConversionOptions(dims=WIDE_HEADS)
    with pytest.raises(ShapeMismatchError, match="TRT-LLM sizes attn_dense hidden x hidden"):
        convert_adapter(adapter, options)


def test_o_proj_of_hidden_width_converts() -> None:
    dims = WIDE_HEADS.model_copy(update={"head_dim": 4})  # 2 x 4 = hidden 8
    config = {"peft_type": "LORA", "r": 2, "lora_alpha": 4, "target_modules": ["o_proj"]}
    converted = convert_adapter(parse_peft_adapter(config, _o_proj_adapter(8, 8)), ConversionOptions(dims=dims))
    assert converted.config[0].tolist() == [[4, 0, 2]]
