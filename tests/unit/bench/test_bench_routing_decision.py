"""bench/routing_decision.py runs and reports (tiny grid; the real figures come from running it)."""

from __future__ import annotations

import json

import pytest
from trtfleet_router.routing import policy_names

from bench import routing_decision


def test_micro_benchmark_smoke(capsys: pytest.CaptureFixture[str]) -> None:
    assert routing_decision.main(
        ["--policy", "all", "--grid", "4x50", "--requests", "300", "--warmup", "300", "--concurrency", "8",
         "--json"]
    ) == 0
    rows = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [row["policy"] for row in rows] == list(policy_names())
    for row in rows:
        assert 0 < row["route_p50_us"] <= row["route_p99_us"]
        assert row["fleet_memory_mib"] > 0 and 0 <= row["warm_share"] <= 1
