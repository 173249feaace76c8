"""``trtfleet lora merge`` (Adapter mode: merged), proven through the numpy Llama against the real PEFT
models' logits: the merged base model, with no adapter, answers like the base model with the adapter."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from trtfleet_engines.lora.errors import (
    AdapterFormatError,
    BaseModelFormatError,
    BaseModelMismatchError,
    OutputExistsError,
)
from trtfleet_engines.lora.merge import (
    MERGE_RECORD,
    SAFETENSORS_INDEX,
    RawTensor,
    merge_dir,
    read_safetensors_raw,
    to_float32,
    write_safetensors,
)
from trtfleet_engines.reference.llama_weights import LlamaConfig
from trtfleet_engines.reference.numpy_llama import TINY_LLAMA_DIR, LlamaWeights, TinyLlama, greedy_generate
from trtfleet_engines.reference.tokenizer import decode, prompt_ids

from tests.unit.lora.test_convert import SAMPLE_ADAPTERS, assert_logits_close, prefill_logits
from trtfleet.api.basemodel import Dtype

BASE = Path(TINY_LLAMA_DIR)


def merged_model(out: Path) -> TinyLlama:
    # Our reader: safetensors' numpy loader has no bfloat16.
    tensors, _ = read_safetensors_raw(out / "model.safetensors")
    config = LlamaConfig.from_hf_config(out / "config.json")
    return TinyLlama(LlamaWeights.from_hf_state_dict(config, {n: to_float32(n, t) for n, t in tensors.items()}))


@pytest.mark.parametrize("dtype", [Dtype.FLOAT16, Dtype.BFLOAT16])
@pytest.mark.parametrize("name", SAMPLE_ADAPTERS)
def test_merged_model_reproduces_peft_logits(
    name: str, dtype: Dtype, adapters_dir: Path, expected_outputs: dict[str, Any], tmp_path: Path
) -> None:
    result = merge_dir(BASE, adapters_dir / name, tmp_path / "merged", dtype)
    assert result.modules == len(result.changed) > 0
    model = merged_model(tmp_path / "merged")
    want = expected_outputs["models"][name]
    for prompt, logits in zip(expected_outputs["logit_prompts"], want["logits"], strict=True):
        assert_logits_close(prefill_logits(model, prompt, None), logits, dtype)


@pytest.mark.parametrize("name", SAMPLE_ADAPTERS)
def test_merged_model_greedy_outputs_match_peft(
    name: str, adapters_dir: Path, expected_outputs: dict[str, Any], tmp_path: Path
) -> None:
    merge_dir(BASE, adapters_dir / name, tmp_path / "merged", Dtype.FLOAT16)
    model = merged_model(tmp_path / "merged")
    want = expected_outputs["models"][name]
    for prompt, want_ids, want_text in zip(
        expected_outputs["prompts"], want["output_ids"], want["outputs"], strict=True
    ):
        got = greedy_generate(model, prompt_ids(prompt), expected_outputs["max_new_tokens"])
        assert got == want_ids, f"{name} {prompt!r}: {decode(got)!r} != {want_text!r}"


def test_untouched_tensors_and_files_are_copied_byte_for_byte(adapters_dir: Path, tmp_path: Path) -> None:
    result = merge_dir(BASE, adapters_dir / "upper", tmp_path / "merged", Dtype.FLOAT16)
    before, _ = read_safetensors_raw(BASE / "model.safetensors")
    after, _ = read_safetensors_raw(tmp_path / "merged" / "model.safetensors")
    assert list(after) == list(before)
    for name, tensor in before.items():
        if name in result.changed:
            assert after[name].dtype == "F16" and after[name].shape == tensor.shape
        else:
            assert (after[name].dtype, after[name].shape, bytes(after[name].data)) == (
                tensor.dtype, tensor.shape, bytes(tensor.data)
            )  # fmt: skip
    assert (tmp_path / "merged" / "config.json").read_bytes() == (BASE / "config.json").read_bytes()
    record = json.loads((tmp_path / "merged" / MERGE_RECORD).read_text())
    assert record["dtype"] == "float16" and record["merged_weights"] == list(result.changed)
    assert set(record["adapter"]["sha256"]) == {"adapter_config.json", "adapter_model.safetensors"}


def _sharded_base(tmp_path: Path) -> Path:
    """The tiny model split into two shards with an index, as large HF checkpoints come."""
    tensors, metadata = read_safetensors_raw(BASE / "model.safetensors")
    names = list(tensors)
    shards = {"model-00001-of-00002.safetensors": names[::2], "model-00002-of-00002.safetensors": names[1::2]}
    base = tmp_path / "sharded"
    base.mkdir()
    (base / "config.json").write_bytes((BASE / "config.json").read_bytes())
    (base / "tokenizer").mkdir()
    (base / "tokenizer" / "vocab.txt").write_text("a\nb\n")
    total = 0
    for shard, members in shards.items():
        total += write_safetensors(base / shard, {n: tensors[n] for n in members}, metadata)
    index = {"metadata": {"total_size": total}, "weight_map": {n: s for s, ms in shards.items() for n in ms}}
    (base / SAFETENSORS_INDEX).write_text(json.dumps(index))
    return base


def test_sharded_checkpoints_keep_their_shards(
    adapters_dir: Path, expected_outputs: dict[str, Any], tmp_path: Path
) -> None:
    base = _sharded_base(tmp_path)
    result = merge_dir(base, adapters_dir / "reverse", tmp_path / "merged", Dtype.FLOAT16)
    out = tmp_path / "merged"
    assert result.shards == ("model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors")
    index = json.loads((out / SAFETENSORS_INDEX).read_text())
    sizes = sum(len(t.data) for shard in result.shards for t in read_safetensors_raw(out / shard)[0].values())
    assert index["metadata"]["total_size"] == sizes < json.loads((base / SAFETENSORS_INDEX).read_text())[
        "metadata"
    ]["total_size"]  # fmt: skip
    assert (out / "tokenizer" / "vocab.txt").read_text() == "a\nb\n"
    merged: dict[str, Any] = {}
    for shard in result.shards:
        merged.update({n: t for n, t in read_safetensors_raw(out / shard)[0].items()})
    single = tmp_path / "single"
    merge_dir(BASE, adapters_dir / "reverse", single, Dtype.FLOAT16)
    for name, tensor in read_safetensors_raw(single / "model.safetensors")[0].items():
        assert bytes(merged[name].data) == bytes(tensor.data), name


def test_an_adapter_of_another_model_is_refused(adapters_dir: Path, tmp_path: Path) -> None:
    tensors, metadata = read_safetensors_raw(BASE / "model.safetensors")
    # A base model with one layer fewer: the adapter's layer-1 modules have no weight.
    fewer = tmp_path / "fewer"
    fewer.mkdir()
    write_safetensors(fewer / "model.safetensors", {n: t for n, t in tensors.items() if ".layers.1." not in n}, None)
    with pytest.raises(BaseModelMismatchError, match=r"model\.layers\.1\..*another base model"):
        merge_dir(fewer, adapters_dir / "upper", tmp_path / "out", Dtype.FLOAT16)
    # A base model whose q_proj is shaped differently.
    other = tmp_path / "other"
    other.mkdir()
    name = "model.layers.0.self_attn.q_proj.weight"
    rows, cols = tensors[name].shape
    wider = RawTensor("F32", (rows, cols * 2), np.zeros((rows, cols * 2), np.float32).tobytes())
    write_safetensors(other / "model.safetensors", {**tensors, name: wider}, metadata)
    with pytest.raises(BaseModelMismatchError, match="q_proj"):
        merge_dir(other, adapters_dir / "upper", tmp_path / "out", Dtype.FLOAT16)
    assert not (tmp_path / "out").exists()
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".out")] == []  # no staging left


def test_bad_inputs_and_existing_output(adapters_dir: Path, tmp_path: Path) -> None:
    pickled = tmp_path / "pickled"
    pickled.mkdir()
    (pickled / "pytorch_model.bin").write_bytes(b"\x80\x04")
    with pytest.raises(BaseModelFormatError, match="torch pickle"):
        merge_dir(pickled, adapters_dir / "upper", tmp_path / "out", Dtype.FLOAT16)
    with pytest.raises(AdapterFormatError):
        merge_dir(BASE, tmp_path, tmp_path / "out", Dtype.FLOAT16)  # not an adapter directory
    out = tmp_path / "out"
    out.mkdir()
    (out / "keep").write_text("x")
    with pytest.raises(OutputExistsError):
        merge_dir(BASE, adapters_dir / "upper", out, Dtype.FLOAT16)
    assert (out / "keep").read_text() == "x"
    merge_dir(BASE, adapters_dir / "upper", out, Dtype.FLOAT16, replace=True)
    assert not (out / "keep").exists() and (out / "model.safetensors").is_file()


def test_cli_merges_and_reports_errors(adapters_dir: Path, tmp_path: Path) -> None:
    command = [sys.executable, "-m", "trtfleet", "lora", "merge", "--base", str(BASE), "--adapter"]
    ok = subprocess.run(
        [*command, str(adapters_dir / "json"), "--out", str(tmp_path / "m"), "--dtype", "bfloat16"],
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    assert ok.returncode == 0, ok.stderr
    assert "14 adapter modules merged into 14 weights (bfloat16)" in ok.stdout
    failed = subprocess.run(
        [*command, str(tmp_path / "missing"), "--out", str(tmp_path / "n")], capture_output=True, text=True, check=False
    )
    assert failed.returncode == 1 and "trtfleet lora:" in failed.stderr and "not a directory" in failed.stderr
