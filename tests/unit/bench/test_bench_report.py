"""Report plumbing and the real-run helpers that need no process: sections, counters, CSV, splits."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from bench import calibrate, loadgen_external, replay, report
from bench.realfleet import parse_counters
from bench.traces import TraceRequest


def test_write_section_replaces_only_its_own_block(tmp_path: Path) -> None:
    doc = tmp_path / "benchmarks.md"
    report.write_section("bound", "first", doc)
    text = doc.read_text()
    for _key, heading, page in report.SECTIONS:
        assert (heading in text) == (page == "routing")  # the page's headings are there from the start
    doc.write_text(text.replace("## Routing quality (real runs)\n", "## Routing quality (real runs)\n\nhand-written\n"))
    report.write_section("bound", "second", doc)
    report.write_section("routing", "ROUTING-BODY", doc)
    text = doc.read_text()
    assert "second" in text and "first" not in text and "ROUTING-BODY" in text
    assert "hand-written" in text
    assert text.index("## Routing quality (real runs)") < text.index("ROUTING-BODY") < text.index("## Offline bound")
    assert text.index("## Offline bound") < text.index("second")


def test_each_section_has_its_page() -> None:
    assert report.page_of("sim") == report.PAGES / "simulation.md"
    assert report.page_of("batch").name == "batch.md"
    with pytest.raises(KeyError, match="unknown benchmark section"):
        report.page_of("nope")


def test_table_formats_numbers() -> None:
    rows = [{"policy": "x", "rate": 0.123456, "bytes": 1234567, "nan": float("nan")}]
    text = report.table(rows, [("policy", "policy"), ("rate", "rate"), ("bytes", "bytes"), ("nan", "n")])
    assert text.splitlines()[2] == "| x | 0.123 | 1,234,567 | - |"


def test_parse_counters_sums_labelled_samples() -> None:
    text = "\n".join([
        "# HELP trtfleet_router_adapter_loads_total Requests that carried weights.",
        'trtfleet_router_adapter_loads_total{adapter="a"} 3.0',
        'trtfleet_router_adapter_loads_total{adapter="b"} 4.0',
        'trtfleet_router_adapter_loads_created{adapter="a"} 1.7e9',
        "trtfleet_router_weight_bytes_sent_total 100.0",
    ])
    assert parse_counters(text, "trtfleet_router_adapter_loads") == 7.0
    assert parse_counters(text, "trtfleet_router_weight_bytes_sent") == 100.0
    assert parse_counters(text, "missing") == 0.0


def test_real_run_summary_counts_stored_loads() -> None:
    samples = [replay.Sample(0, 200, 0.01, 0.1, 5, 5), replay.Sample(1, 200, 0.02, 0.2, 5, 5),
               replay.Sample(2, 503, error="http 503"), replay.Sample(3, 200, 0.03, 0.3, 5, 5)]
    counters = {"hits": 1, "misses": 0, "cold_starts": 3, "cache_full": 1, "weight_bytes": 3000.0}
    row = replay.summarize_samples("p", samples, counters, duration_s=1.0)
    assert row["loads"] == 2 and row["weight_sends"] == 3
    assert row["hit_rate"] == pytest.approx(0.25)
    assert row["effective_hit_rate"] == pytest.approx(1 - (2 + 1) / 4)
    assert row["output_tokens_per_s"] == pytest.approx(15.0)


def test_measured_step_uses_streamed_chunks() -> None:
    samples = [replay.Sample(0, 200, 0.1, 1.1, 99, 11), replay.Sample(1, 200, 0.1, 0.5, 99, 5),
               replay.Sample(2, 200, 0.1, 0.1, 1, 1)]
    assert calibrate.measured_step_s(samples) == pytest.approx(0.1)


def test_azure_csv_keeps_times_and_lengths(tmp_path: Path) -> None:
    trace = [TraceRequest(0.0, "r0", "a", 10, 5), TraceRequest(1.25, "r1", "b", 20, 7)]
    path = tmp_path / "trace.csv"
    loadgen_external.azure_csv(trace, path)
    lines = path.read_text().splitlines()
    assert lines[0] == "TIMESTAMP,ContextTokens,GeneratedTokens"
    assert lines[1] == "2026-01-01 00:00:00.000000,10,5"
    assert lines[2] == "2026-01-01 00:00:01.250000,20,7"


def test_dyadic_split_sums_to_exactly_one() -> None:
    weights = np.array([1 / (i + 1) for i in range(50)])
    split = loadgen_external.dyadic_split([f"s{i}" for i in range(50)], weights / weights.sum())
    assert sum(entry["split"] for entry in split) == 1.0  # inference-perf compares with == 1.0
    assert all(entry["split"] > 0 for entry in split)


def test_blocks_under_one_heading_keep_the_sections_order(tmp_path: Path) -> None:
    fresh = tmp_path / "fresh.md"
    report.write_section("replicas-sim", "simulated", fresh)
    text = fresh.read_text()
    assert text.count("## Router replicas") == 1
    order = [text.index(f"<!-- bench:{key}:start -->") for key in ("replicas-real-shadow", "replicas-real-peers",
                                                                     "replicas-sim")]
    assert order == sorted(order) and "simulated" in text
    written = tmp_path / "written.md"
    written.write_text("# Benchmarks\n\n## Router replicas\n\nhand-written summary\n")
    report.write_section("replicas-sim", "BODY-SIM", written)
    report.write_section("replicas-real-shadow", "BODY-REAL", written)
    report.write_section("replicas-real-peers", "BODY-PEERS", written)
    text = written.read_text()
    assert text.count("## Router replicas") == 1 and "hand-written summary" in text
    assert text.index("BODY-REAL") < text.index("BODY-PEERS") < text.index("BODY-SIM")
