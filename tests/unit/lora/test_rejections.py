"""Adapters TRT-LLM cannot serve correctly are refused, each with its own error class, leaving nothing."""

from __future__ import annotations

import json
import shutil
import struct
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from safetensors.numpy import load_file, save_file
from trtfleet_engines.lora import convert as convert_module
from trtfleet_engines.lora.convert import ConversionOptions, convert_dir
from trtfleet_engines.lora.errors import (
    AdapterFormatError,
    DoraNotSupportedError,
    DtypeMismatchError,
    EmbeddingTargetError,
    LoraConversionError,
    ModulesToSaveError,
    NonFiniteWeightsError,
    RankTooLargeError,
    ShapeMismatchError,
    TargetModuleError,
    UnknownModuleError,
    UnsupportedAdapterError,
)
from trtfleet_engines.lora.peft import pattern_key, read_safetensors
from trtfleet_engines.modeldims import TINY_LLAMA_DIMENSIONS

from trtfleet.api.basemodel import Dtype, LoraModule, ModelDimensions

Q_A = "base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight"
Q_B = "base_model.model.model.layers.0.self_attn.q_proj.lora_B.weight"
Tensors = dict[str, np.ndarray[Any, Any]]


def make_variant(
    src: Path,
    dst: Path,
    *,
    config: Callable[[dict[str, Any]], None] | None = None,
    tensors: Callable[[Tensors], None] | None = None,
) -> Path:
    """A copy of the PEFT adapter ``src`` with its config and/or tensors edited."""
    dst.mkdir(parents=True)
    raw_config = json.loads((src / "adapter_config.json").read_text())
    if config is not None:
        config(raw_config)
    (dst / "adapter_config.json").write_text(json.dumps(raw_config))
    raw_tensors = dict(load_file(str(src / "adapter_model.safetensors")))
    if tensors is not None:
        tensors(raw_tensors)
    save_file(raw_tensors, str(dst / "adapter_model.safetensors"))
    return dst


def convert(src: Path, out: Path, **overrides: Any) -> None:
    settings: dict[str, Any] = {"dims": TINY_LLAMA_DIMENSIONS}
    settings.update(overrides)
    convert_dir(src, out, ConversionOptions(**settings))


def set_key(key: str, value: Any) -> Callable[[dict[str, Any]], None]:
    return lambda config: config.__setitem__(key, value)


def scale_tensor(key: str, factor: float) -> Callable[[Tensors], None]:
    return lambda tensors: tensors.__setitem__(key, tensors[key] * np.float32(factor))


def poison(key: str, value: float) -> Callable[[Tensors], None]:
    def edit(tensors: Tensors) -> None:
        tensors[key] = tensors[key].copy()
        tensors[key][0, 0] = value

    return edit


def add_tensor(key: str, shape: tuple[int, ...]) -> Callable[[Tensors], None]:
    return lambda tensors: tensors.__setitem__(key, np.zeros(shape, np.float32))


def drop_tensor(key: str) -> Callable[[Tensors], None]:
    return lambda tensors: tensors.__delitem__(key)


CASES: list[tuple[str, dict[str, Any], dict[str, Any], type[LoraConversionError], str]] = [
    ("dora", {"config": set_key("use_dora", True)}, {}, DoraNotSupportedError, "DoRA"),
    (
        "dora-magnitude",
        {"tensors": add_tensor("base_model.model.model.layers.0.self_attn.q_proj.lora_magnitude_vector", (64,))},
        {},
        DoraNotSupportedError,
        "magnitude",
    ),
    (
        "modules-to-save",
        {"config": set_key("modules_to_save", ["lm_head"])},
        {},
        ModulesToSaveError,
        "modules_to_save",
    ),
    (
        "embedding-target",
        {"config": set_key("target_modules", ["q_proj", "embed_tokens"])},
        {},
        EmbeddingTargetError,
        "embed_tokens",
    ),
    (
        "lm-head-weights",
        {"tensors": add_tensor("base_model.model.lm_head.lora_A.weight", (8, 64))},
        {},
        EmbeddingTargetError,
        "lm_head",
    ),
    (
        "unknown-module",
        {"tensors": add_tensor("base_model.model.model.layers.0.mlp.fc1.lora_A.weight", (8, 64))},
        {},
        UnknownModuleError,
        "fc1",
    ),
    (
        "not-lora",
        {"config": set_key("peft_type", "PREFIX_TUNING")},
        {},
        UnsupportedAdapterError,
        "PREFIX_TUNING",
    ),
    ("lora-bias", {"config": set_key("lora_bias", True)}, {}, UnsupportedAdapterError, "lora_bias"),
    (
        "module-not-in-engine",
        {},
        {"target_modules": (LoraModule.ATTN_Q, LoraModule.ATTN_V)},
        TargetModuleError,
        "lora module attn_k .* not enabled for this model",
    ),
    ("rank-above-max", {}, {"max_rank": 4}, RankTooLargeError, "max_lora_rank 4"),
    ("nan", {"tensors": poison(Q_A, float("nan"))}, {}, NonFiniteWeightsError, "NaN or Inf"),
    ("inf", {"tensors": poison(Q_B, float("inf"))}, {}, NonFiniteWeightsError, "NaN or Inf"),
    ("fp16-overflow", {"tensors": scale_tensor(Q_B, 1e8)}, {}, NonFiniteWeightsError, "overflow float16"),
    (
        "hidden-size-mismatch",
        {},
        {"dims": TINY_LLAMA_DIMENSIONS.model_copy(update={"hidden_size": 128, "head_dim": 32})},
        ShapeMismatchError,
        "maps 64 -> 64 features but TRT-LLM's attn_q for this base model maps 128 -> 128",
    ),
    (
        "too-few-layers",
        {},
        {"dims": TINY_LLAMA_DIMENSIONS.model_copy(update={"num_layers": 1})},
        ShapeMismatchError,
        "layer 1 but the base model has 1 layers",
    ),
    (
        "engine-dtype",
        {},
        {"dtype": Dtype.FLOAT16, "engine_dtype": Dtype.BFLOAT16},
        DtypeMismatchError,
        "same data type as base model",
    ),
    ("rank-disagrees-with-config", {"config": set_key("r", 4)}, {}, ShapeMismatchError, "gives rank 4"),
    ("missing-b", {"tensors": drop_tensor(Q_B)}, {}, AdapterFormatError, "needs both lora_A and lora_B"),
    (
        "a-b-rank-mismatch",
        {"tensors": lambda t: t.__setitem__(Q_B, np.zeros((64, 4), np.float32))},
        {},
        ShapeMismatchError,
        r"not \[r, in\] / \[out, r\]",
    ),
    ("bad-alpha", {"config": set_key("lora_alpha", "sixteen")}, {}, AdapterFormatError, "lora_alpha"),
]


@pytest.mark.parametrize(("edits", "overrides", "error", "text"), [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_rejected_with_its_own_error(
    edits: dict[str, Any],
    overrides: dict[str, Any],
    error: type[LoraConversionError],
    text: str,
    adapters_dir: Path,
    tmp_path: Path,
) -> None:
    src = make_variant(adapters_dir / "upper", tmp_path / "src", **edits)
    out = tmp_path / "work" / "out"
    with pytest.raises(error, match=text):
        convert(src, out, **overrides)
    assert not out.exists()
    assert not (tmp_path / "work").exists() or list((tmp_path / "work").iterdir()) == []


def test_torch_pickle_is_refused_without_loading_it(adapters_dir: Path, tmp_path: Path) -> None:
    src = tmp_path / "src"
    src.mkdir()
    shutil.copy(adapters_dir / "upper" / "adapter_config.json", src)
    (src / "adapter_model.bin").write_bytes(b"\x80\x02cposix\nsystem\nq\x00X\x05\x00\x00\x00falseq\x01\x85R.")
    with pytest.raises(AdapterFormatError, match="torch pickle.*safetensors"):
        convert(src, tmp_path / "out")
    assert not (tmp_path / "out").exists()


def test_failure_while_writing_leaves_no_output(
    adapters_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A write failing after the .npy files exist (disk full at the manifest) leaves no OUT_DIR, no temp."""

    def disk_full(*args: Any, **kwargs: Any) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(convert_module, "write_manifest", disk_full)
    with pytest.raises(OSError, match="No space left"):
        convert(adapters_dir / "upper", tmp_path / "out")
    assert list(tmp_path.iterdir()) == []


def _write_safetensors(path: Path, tensors: dict[str, tuple[str, tuple[int, ...], bytes]]) -> None:
    header: dict[str, Any] = {}
    offset, body = 0, b""
    for name, (dtype, shape, data) in tensors.items():
        header[name] = {"dtype": dtype, "shape": list(shape), "data_offsets": [offset, offset + len(data)]}
        offset += len(data)
        body += data
    raw = json.dumps(header).encode()
    path.write_bytes(struct.pack("<Q", len(raw)) + raw + body)


def test_bf16_and_fp16_safetensors_are_read_without_torch(tmp_path: Path) -> None:
    values = np.array([[1.0, -2.5], [0.15625, 3.0]], np.float32)
    bf16 = (values.view(np.uint32) >> 16).astype("<u2").tobytes()
    _write_safetensors(
        tmp_path / "t.safetensors",
        {"a": ("BF16", (2, 2), bf16), "b": ("F16", (2, 2), values.astype("<f2").tobytes())},
    )
    tensors = read_safetensors(tmp_path / "t.safetensors")
    np.testing.assert_array_equal(tensors["a"], values)
    np.testing.assert_array_equal(tensors["b"], values)
    assert tensors["a"].dtype == np.float32


def test_safetensors_with_unsupported_dtype_or_bad_offsets_is_refused(tmp_path: Path) -> None:
    _write_safetensors(tmp_path / "int.safetensors", {"a": ("I8", (2,), b"\x01\x02")})
    with pytest.raises(AdapterFormatError, match="F32, F16, BF16 or F64"):
        read_safetensors(tmp_path / "int.safetensors")
    _write_safetensors(tmp_path / "short.safetensors", {"a": ("F32", (4,), b"\x00" * 8)})
    with pytest.raises(AdapterFormatError, match="inconsistent data offsets"):
        read_safetensors(tmp_path / "short.safetensors")
    (tmp_path / "junk.safetensors").write_bytes(b"\xff" * 16)
    with pytest.raises(AdapterFormatError, match="not a safetensors file"):
        read_safetensors(tmp_path / "junk.safetensors")


@pytest.mark.parametrize(
    ("patterns", "path", "expected"),
    [
        (["q_proj"], "model.layers.0.self_attn.q_proj", "q_proj"),
        (["proj"], "model.layers.0.self_attn.q_proj", None),  # a suffix must start at a dot
        (["self_attn.q_proj"], "model.layers.3.self_attn.q_proj", "self_attn.q_proj"),
        (
            [r"layers\.1\.self_attn\.q_proj", "q_proj"],
            "model.layers.1.self_attn.q_proj",
            r"layers\.1\.self_attn\.q_proj",
        ),
        ([r"layers\.1\.self_attn\.q_proj", "q_proj"], "model.layers.11.self_attn.q_proj", "q_proj"),
        (["model.layers.0.mlp.down_proj"], "model.layers.0.mlp.down_proj", "model.layers.0.mlp.down_proj"),
        (["layers.0.mlp.down_proj"], "model.layers.10.mlp.down_proj", None),
    ],
)
def test_pattern_key_follows_peft(patterns: list[str], path: str, expected: str | None) -> None:
    assert pattern_key(dict.fromkeys(patterns, 1), path) == expected


def test_dims_of_another_model_are_reported_per_module() -> None:
    dims = ModelDimensions(
        hidden_size=4096,
        intermediate_size=14336,
        num_layers=32,
        num_attention_heads=32,
        num_kv_heads=8,
        vocab_size=128256,
    )
    assert convert_module._expected_dims(dims, LoraModule.ATTN_K, "k_proj") == (4096, 1024)
    assert convert_module._expected_dims(dims, LoraModule.MLP_GATE_UP, "gate_up_proj") == (4096, 2 * 14336)
    assert convert_module._expected_dims(dims, LoraModule.MLP_H_TO_4H, "gate_up_proj") == (4096, 2 * 14336)
    assert convert_module._expected_dims(dims, LoraModule.MLP_H_TO_4H, "gate_proj") == (4096, 14336)
    assert convert_module._expected_dims(dims, LoraModule.ATTN_QKV, "qkv_proj") == (4096, 4096 + 2 * 1024)
