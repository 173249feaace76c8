"""bench.triton_batcher: the two model configs differ only in the batcher; the summary counts stalls."""

from __future__ import annotations

from pathlib import Path

from trtfleet_engines.reference.repository import BOOTSTRAP_FILE
from trtfleet_engines.triton import pbtxt

from bench.triton_batcher import STALL_MS, VARIANTS, model_config, summarize, table, write_repository


def test_the_variants_differ_only_in_the_dynamic_batching_block() -> None:
    with_batcher = model_config("m", batcher=True, execute_ms=2.5)
    without = model_config("m", batcher=False, execute_ms=2.5)
    block = "\n".join(pbtxt.dynamic_batching(max_queue_delay_microseconds=100, max_queue_size=64)) + "\n"
    assert block in with_batcher and with_batcher.replace(block, "") == without
    assert "dynamic_batching" not in without
    assert 'string_value: "2.5"' in without and "count: 1 kind: KIND_CPU" in without


def test_repository_holds_both_models_with_the_bootstrap(tmp_path: Path) -> None:
    repo = write_repository(tmp_path, execute_ms=20)
    for name in VARIANTS:
        assert (repo / name / "1" / "model.py").read_text().count("_trtfleet_bootstrap") == 1
        assert (repo / name / "1" / BOOTSTRAP_FILE).is_file()
        assert f'name: "{name}"' in (repo / name / "config.pbtxt").read_text()
    assert "dynamic_batching" in (repo / "with_batcher" / "config.pbtxt").read_text()


def test_summary_counts_answers_at_the_stall_threshold() -> None:
    row = summarize([40.0, 38.0, STALL_MS, 541.0, 39.0])
    assert row["pairs"] == 5 and row["stalls"] == 2 and row["b_max_ms"] == 541.0
    assert row["b_p50_ms"] == 40.0
    text = table({"with_batcher": row})
    assert "| with_batcher | 5 | 40 |" in text and text.rstrip().endswith("| 2 |")
