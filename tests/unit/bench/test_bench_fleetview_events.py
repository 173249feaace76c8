"""bench.fleetview_events on a tiny stream: every event it publishes is applied by the other replica."""

from __future__ import annotations

import argparse

from bench import fleetview_events


def test_a_tiny_run_reports_each_figure() -> None:
    args = argparse.Namespace(
        pods=2, adapters=5, host_pages=4, zipf=1.0, requests=200, inflight=2, batch=8, repeats=1, seed=1
    )
    result = fleetview_events.run(args)
    assert set(result) == {"alone_us", "publish_us", "apply_us", "events_per_request", "publish_added_us"}
    assert 2.0 <= result["events_per_request"] <= 4.0  # acquire/put + release (+ loaded with weights)
    assert all(value > 0 for key, value in result.items() if key != "publish_added_us")
