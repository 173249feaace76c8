"""bench.tenants: each tenant's router wait on the reference fleet, from two scrapes of the router's histogram."""

from __future__ import annotations

import pytest
from trtfleet_router.metrics import RouterMetrics

from bench.tenants import router_waits


def test_a_tenants_wait_counts_only_its_requests_that_started_after_the_first_scrape() -> None:
    metrics = RouterMetrics()
    waits = metrics.queue_wait
    for _ in range(50):
        waits.labels("tiny", "interactive", "B").observe(0.4)  # in the warm-up: left out
    before = metrics.exposition().decode()
    for _ in range(99):
        waits.labels("tiny", "interactive", "B").observe(0.0003)
    waits.labels("tiny", "interactive", "B").observe(0.2)
    for _ in range(100):
        waits.labels("tiny", "interactive", "A").observe(2.0)
    found = router_waits(before, metrics.exposition().decode(), ["A", "B", "C"])
    assert found["B"] == pytest.approx(0.0005)  # the 99th of 100 is in the first bucket (le 0.5 ms)
    assert found["A"] == pytest.approx(1.0 + 1.5 * 99 / 100)  # all in (1, 2.5]: interpolated
    assert found["C"] is None  # no request of its: no figure
    # from an empty first scrape: all 150 of B, the 148.5th in (250, 500] ms
    assert router_waits("", metrics.exposition().decode(), ["B"])["B"] == pytest.approx(0.25 + 0.25 * 48.5 / 50)
