"""``trtfleet lora convert | inspect | verify`` through the real entry point, and the cache-page report."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from trtfleet_engines.lora.inspect import CacheSettings, inspect_dir
from trtfleet_engines.modeldims import TINY_LLAMA_DIMENSIONS
from trtfleet_engines.reference.numpy_llama import TINY_LLAMA_DIR

from trtfleet.cli import main


def test_convert_verify_inspect(adapters_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "upper-trt"
    src = adapters_dir / "upper"
    assert main(["lora", "convert", str(src), str(out), "--base-config", str(TINY_LLAMA_DIR)]) == 0
    assert "14 rows, rank 8, float16" in capsys.readouterr().out
    assert main(["lora", "verify", str(out), "--source", str(src)]) == 0
    assert "ok (14 rows, rank 8, float16)" in capsys.readouterr().out

    assert main(["lora", "inspect", str(out), "--json", "--base-config", str(TINY_LLAMA_DIR)]) == 0
    converted = json.loads(capsys.readouterr().out)
    assert main(["lora", "inspect", str(src), "--json", "--base-config", str(TINY_LLAMA_DIR)]) == 0
    peft = json.loads(capsys.readouterr().out)
    assert converted.pop("kind") == "converted" and peft.pop("kind") == "peft"
    assert converted == peft
    assert converted["rank"] == 8 and converted["layers"] == [0, 1] and converted["rows"] == 14
    assert converted["weights_bytes"] == 14 * 8 * (64 + 176) * 2

    assert main(["lora", "inspect", str(out)]) == 0  # no base config: shapes come from manifest.json
    text = capsys.readouterr().out
    assert "rank:            8" in text and "lora cache:      1 page(s)" in text


def test_cli_errors_exit_1_with_the_reason(
    adapters_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "out"
    args = ["lora", "convert", str(adapters_dir / "upper"), str(out), "--max-rank", "4"]
    assert main(args) == 1
    assert "rank 8 is above the engine's max_lora_rank 4" in capsys.readouterr().err
    assert not out.exists()
    assert main(["lora", "convert", str(adapters_dir / "upper"), str(out), "--target-modules", "attn_q", "nope"]) == 1
    assert "unknown TRT-LLM lora module(s) ['nope']" in capsys.readouterr().err
    assert main(["lora", "convert", str(adapters_dir / "upper"), str(out), "--hidden-size", "64"]) == 1
    assert "missing --intermediate-size" in capsys.readouterr().err


def test_verify_detects_a_changed_file(adapters_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "out"
    assert main(["lora", "convert", str(adapters_dir / "json"), str(out), "--dtype", "bfloat16"]) == 0
    weights = out / "model.lora_weights.npy"
    data = bytearray(weights.read_bytes())
    data[-1] ^= 0x01
    weights.write_bytes(bytes(data))
    capsys.readouterr()
    assert main(["lora", "verify", str(out)]) == 1
    assert "model.lora_weights.npy: sha256" in capsys.readouterr().err


def test_cache_pages_follow_trtllm_geometry(adapters_dir: Path) -> None:
    """Tiny Llama, default 7 modules: d = q 128, k 96, v 96, o 128, gate/up/down 240 -> page width 96.

    optimal 8: slots/page = max(8 * (2+1+1+2+3+3+3) * 2 layers, ceil(64 * 240 / 96)) = 240; a rank-8 adapter
    takes 2 * (11+8+8+11+20+20+20) = 196 slots: one page. optimal 2: 160 slots/page, rows never split:
    2 pages.
    """
    report = inspect_dir(adapters_dir / "upper", dims=TINY_LLAMA_DIMENSIONS)
    assert (report.page_width, report.slots_per_page, report.cache_pages) == (96, 240, 1)
    small = inspect_dir(adapters_dir / "upper", dims=TINY_LLAMA_DIMENSIONS, settings=CacheSettings(2, 64, 64))
    assert (small.slots_per_page, small.cache_pages) == (160, 2)
    assert report.adapter_elements == 2 * 8 * (128 + 96 + 96 + 128 + 240 * 3)
