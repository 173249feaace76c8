"""Trace files for the autoscaling benchmark: the Azure and Mooncake readers, load scaling, the replayed trace."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bench.autoscale import main as autoscale_main
from bench.mooncake import MooncakeRow, assign_adapters, read_mooncake
from bench.tracefiles import ReplayScale, format_of, read_azure, read_trace_file, replay_trace, scale_load

AZURE_HEADER = "TIMESTAMP,ContextTokens,GeneratedTokens\n"


def _azure(tmp_path: Path, body: str, header: str = AZURE_HEADER) -> Path:
    path = tmp_path / "code.csv"
    path.write_text(header + body, encoding="utf-8")
    return path


def test_azure_rows_keep_their_times_and_token_counts(tmp_path: Path) -> None:
    path = _azure(tmp_path, "2023-11-16 18:17:03.9799600,4808,10\n2023-11-16 18:17:04.0319600,3180,8\n\n"
                            "2023-11-16 18:17:05,110,27\n")
    rows = read_azure(path)
    assert [(r.input_length, r.output_length, r.hash_ids) for r in rows] == [(4808, 10, ()), (3180, 8, ()),
                                                                            (110, 27, ())]
    gaps = [later.timestamp_ms - rows[0].timestamp_ms for later in rows]
    assert gaps == pytest.approx([0.0, 52.0, 1020.04])
    assert read_trace_file(path) == rows


@pytest.mark.parametrize(("body", "line", "why"), [
    pytest.param("2023-11-16 18:17:03.98,10,1\n2023-11-16 18:17:04,ten,1\n", 3, "invalid literal",
                 id="a-count-that-is-not-a-number"),
    pytest.param("2023-11-16 18:17:03.98,10,1\n2023-11-16 18:17:04,10,-1\n", 3, "GeneratedTokens is negative",
                 id="a-negative-count"),
    pytest.param("16/11/2023 18:17:03,10,1\n", 2, "does not match format", id="a-timestamp-of-another-form"),
    pytest.param("2023-11-16 18:17:03.9x,10,1\n", 2, "bad fraction", id="a-bad-fraction"),
    pytest.param("2023-11-16 18:17:03,10\n", 2, "2 fields, expected 3", id="a-missing-field"),
    pytest.param("2023-11-16 18:17:03,10,1,7\n", 2, "4 fields, expected 3", id="an-extra-field"),
])
def test_a_malformed_azure_row_is_refused_with_its_line(tmp_path: Path, body: str, line: int, why: str) -> None:
    path = _azure(tmp_path, body)
    with pytest.raises(ValueError, match=rf"code\.csv:{line}: not an Azure LLM trace row \(.*{why}"):
        read_azure(path)


def test_a_file_without_the_azure_header_is_refused(tmp_path: Path) -> None:
    path = _azure(tmp_path, "2023-11-16 18:17:03,10,1\n", header="time,prompt,output\n")
    with pytest.raises(ValueError, match=r"code\.csv:1: not an Azure LLM trace header"):
        read_azure(path)
    with pytest.raises(ValueError, match="header"):
        read_azure(_azure(tmp_path, "", header=""))


@pytest.mark.parametrize(("line", "why"), [
    pytest.param({"timestamp": 5, "input_length": 10, "output_length": 2}, "hash_ids", id="a-missing-field"),
    pytest.param({"timestamp": 5, "input_length": -10, "output_length": 2, "hash_ids": []}, "negative length",
                 id="a-negative-length"),
    pytest.param({"timestamp": 5, "input_length": 10, "output_length": 2, "hash_ids": "12"}, "not a list",
                 id="block-ids-that-are-not-a-list"),
    pytest.param({"timestamp": "soon", "input_length": 10, "output_length": 2, "hash_ids": []}, "could not convert",
                 id="a-time-that-is-not-a-number"),
    pytest.param([5, 10, 2], "list indices", id="not-an-object"),
])
def test_a_malformed_mooncake_row_is_refused_with_its_line(tmp_path: Path, line: object, why: str) -> None:
    path = tmp_path / "trace.jsonl"
    good = {"timestamp": 0, "input_length": 1024, "output_length": 4, "hash_ids": [0, 1]}
    path.write_text(f"{json.dumps(good)}\n\n{json.dumps(line)}\n", encoding="utf-8")
    with pytest.raises(ValueError, match=rf"trace\.jsonl:3: not a Mooncake trace row \(.*{why}"):
        read_mooncake(path)
    path.write_text(f"{json.dumps(good)}\nNaN\n", encoding="utf-8")
    with pytest.raises(ValueError, match=r"trace\.jsonl:2: not a Mooncake trace row"):
        read_mooncake(path)


def test_the_format_comes_from_the_name_or_is_asked_for(tmp_path: Path) -> None:
    assert format_of(Path("a.csv")) == "azure" and format_of(Path("b.jsonl")) == "mooncake"
    with pytest.raises(ValueError, match="--trace-format"):
        format_of(Path("c.txt"))
    path = tmp_path / "rows.txt"
    path.write_text(json.dumps({"timestamp": 0, "input_length": 8, "output_length": 2, "hash_ids": [3]}) + "\n")
    assert read_trace_file(path, "mooncake") == [MooncakeRow(0.0, 8, 2, (3,))]


ROWS = [
    MooncakeRow(0.0, 100, 10, (0, 1)),  # conversation A
    MooncakeRow(0.0, 200, 10, (5,)),  # conversation B, at the same time
    MooncakeRow(1000.0, 150, 10, (0, 1, 2)),  # conversation A, turn 2
    MooncakeRow(4000.0, 50, 10, ()),  # no blocks, the last arrival
]


def test_scaled_load_keeps_each_gap_and_makes_every_copy_its_own_conversation() -> None:
    scaled = scale_load(ROWS, 3.0, seed=1)
    assert len(scaled) == 12 and scaled == scale_load(ROWS, 3.0, seed=1)
    times = [r.timestamp_ms for r in scaled]
    assert times == sorted(times)
    # each row's copies lie between it and the next later arrival (the last row's: at its own time)
    for original, later in zip(ROWS, [1000.0, 1000.0, 4000.0, 4000.0], strict=True):
        copies = [r for r in scaled if r.input_length == original.input_length]
        assert len(copies) == 3 and original in copies  # the original keeps its time
        assert all(original.timestamp_ms <= r.timestamp_ms <= later for r in copies)
    first_blocks = {r.hash_ids[0] for r in scaled if r.hash_ids}
    assert first_blocks == {0, 5, 6, 11, 12, 17}  # A and B, each in three conversations (ids moved by 6)
    turns = [r.hash_ids for r in scaled if r.input_length == 150]
    assert sorted(turns) == [(0, 1, 2), (6, 7, 8), (12, 13, 14)]  # a copy of turn 2 extends its own copy of turn 1


def test_fractional_load_is_a_seeded_extra_copy_and_thinning_below_one() -> None:
    rows = [MooncakeRow(float(t), 10, 1, ()) for t in range(2000)]
    assert abs(len(scale_load(rows, 1.5, seed=2)) - 3000) < 5 * 22  # binomial, five standard deviations
    assert abs(len(scale_load(rows, 0.5, seed=2)) - 1000) < 5 * 22
    with pytest.raises(ValueError, match="positive"):
        scale_load(rows, 0.0, seed=2)


def test_the_replayed_trace_scales_time_and_lengths_and_draws_adapters_by_conversation() -> None:
    scale = ReplayScale(load_factor=2.0, time_factor=0.5, length_factor=0.5, num_adapters=50, seed=4)
    trace, cut = replay_trace(ROWS, scale)
    assert cut == 0 and len(trace) == 8
    assert max(r.t_s for r in trace) <= 2.0  # 4 s of trace at half time
    assert sorted(r.prompt_tokens for r in trace) == [25, 25, 50, 50, 75, 75, 100, 100]
    scaled = scale_load(ROWS, 2.0, seed=4)
    assert sorted(r.adapter for r in trace) == sorted(assign_adapters(scaled, 50, 1.0, 4))
    by_conversation: dict[int, set[str]] = {}
    for row, adapter in zip(scaled, assign_adapters(scaled, 50, 1.0, 4), strict=True):
        if row.hash_ids:
            by_conversation.setdefault(row.hash_ids[0], set()).add(adapter)
    assert all(len(adapters) == 1 for adapters in by_conversation.values())
    assert all(not r.blocks for r in trace)  # every prompt token is computed unless blocks are asked for
    with_blocks, _ = replay_trace(ROWS, ReplayScale(load_factor=2.0, length_factor=0.5, num_adapters=50, seed=4,
                                                    prefix_blocks=True))
    assert [r.adapter for r in with_blocks] == [r.adapter for r in trace]
    assert max(len(r.blocks) for r in with_blocks) == 3  # the 100 tokens of B: three full 32-token blocks


def test_the_cli_refuses_a_bad_trace_file_with_its_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = _azure(tmp_path, "2023-11-16 18:17:03,10,1\n2023-11-16 18:17:04,10\n")
    with pytest.raises(ValueError, match=r"code\.csv:3"):
        autoscale_main(["--trace-file", str(path), "--peak-pods", "2"])
    with pytest.raises(SystemExit):
        autoscale_main(["--trace-file", str(tmp_path / "t.txt")])
    assert "--trace-format" in capsys.readouterr().err
