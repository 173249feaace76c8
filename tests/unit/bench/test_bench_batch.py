"""bench.batch's pure parts: the batch input (deterministic, valid lines) and the table."""

from __future__ import annotations

import json

from bench.batch import BatchScenario, batch_input, table
from trtfleet.batch.lines import parse_input


def test_batch_input_is_deterministic_and_valid() -> None:
    scenario = BatchScenario(lines=50, seed=3)
    data = batch_input(scenario, ["a", "b", "c"])
    assert data == batch_input(scenario, ["a", "b", "c"])
    parsed = parse_input(data, batch_id="b", endpoint="/v1/completions", serves=lambda m: m in "abc")
    assert len(parsed.lines) == 50 and not parsed.rejected
    assert {json.loads(line)["body"]["model"] for line in data.splitlines()} == {"a", "b", "c"}


def test_table_has_one_row_per_case() -> None:
    text = table([{"case": "batch grouped", "lines_per_s": 12.5, "ttft_p99_ms": float("nan")}])
    assert text.splitlines()[2].startswith("| batch grouped | 12.5 |")
