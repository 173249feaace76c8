"""bench.routerwindow: the router's own CPU and its loop lag over a window, from /proc and its histogram."""

from __future__ import annotations

import math
import subprocess
import sys
from pathlib import Path

import pytest
from trtfleet_router.metrics import RouterMetrics

from bench.batch import main
from bench.batchreport import table
from bench.routerwindow import RouterWindow, cumulative_buckets, window_quantile

INF = math.inf


def test_a_window_quantile_is_over_the_samples_added_in_it_interpolated_in_a_bucket() -> None:
    before = [(0.001, 100.0), (0.01, 100.0), (0.1, 100.0), (INF, 100.0)]  # 100 samples before: left out
    after = [(0.001, 150.0), (0.01, 190.0), (0.1, 200.0), (INF, 200.0)]  # added: 50, 40, 10, 0
    assert window_quantile(before, after, 0.5) == pytest.approx(0.001)  # the 50th of 100: the first bound
    assert window_quantile(before, after, 0.7) == pytest.approx(0.001 + 0.009 * 20 / 40)
    assert window_quantile(before, after, 0.99) == pytest.approx(0.01 + 0.09 * 9 / 10)
    assert math.isnan(window_quantile(after, after, 0.99))  # nothing added
    assert math.isnan(window_quantile([], [], 0.5))
    beyond = [(0.001, 0.0), (0.01, 0.0), (0.1, 0.0), (INF, 5.0)]
    assert window_quantile([], beyond, 0.99) == 0.1  # in +Inf: the highest finite bound


def test_buckets_are_read_from_the_routers_own_exposition() -> None:
    metrics = RouterMetrics()
    before = cumulative_buckets(metrics.exposition().decode())
    assert before == []  # no sample yet: no bucket lines
    for lag in (0.0004, 0.0004, 0.003, 0.2):
        metrics.event_loop_lag.observe(lag)
    buckets = dict(cumulative_buckets(metrics.exposition().decode()))
    assert buckets[0.001] == 2 and buckets[0.005] == 3 and buckets[0.1] == 3 and buckets[0.25] == 4
    assert buckets[INF] == 4
    assert window_quantile(before, sorted(buckets.items()), 0.5) == pytest.approx(0.001)


def test_buckets_of_one_label_set_leave_the_others_out() -> None:
    metrics = RouterMetrics()
    for tenant, wait in (("A", 0.0004), ("A", 0.3), ("B", 0.0004), ("B", 0.003), ("B", 0.003)):
        metrics.queue_wait.labels("tiny", "interactive", tenant).observe(wait)
    text = metrics.exposition().decode()
    name = "trtfleet_router_queue_wait_seconds"
    b = dict(cumulative_buckets(text, name, {"tenant": "B"}))
    assert b[0.001] == 1 and b[0.005] == 3 and b[INF] == 3
    a = dict(cumulative_buckets(text, name, {"tenant": "A", "band": "interactive"}))
    assert a[0.001] == 1 and a[0.25] == 1 and a[0.5] == 2
    assert dict(cumulative_buckets(text, name))[INF] == 5  # no match: every label set
    assert cumulative_buckets(text, name, {"tenant": "C"}) == []


class _Fleet:
    """A stand-in for bench.realfleet.RealFleet's two calls: a real process as the router, a real RouterMetrics."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.metrics = RouterMetrics()

    def router_pid(self) -> int:
        return self.pid

    def router_metrics(self) -> str:
        return self.metrics.exposition().decode()


@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="needs Linux /proc")
def test_a_window_reports_the_router_processs_cpu_and_the_lag_sampled_in_it() -> None:
    spin = "import sys, time\nsys.stdin.readline()\nwhile time.process_time() < 0.3: pass\nprint('done', flush=True)\n"
    child = subprocess.Popen([sys.executable, "-c", spin], stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    try:
        fleet = _Fleet(child.pid)
        fleet.metrics.event_loop_lag.observe(0.5)  # before the window: not in it
        window = RouterWindow(fleet)
        assert child.stdin is not None and child.stdout is not None
        child.stdin.write(b"go\n")
        child.stdin.flush()
        assert child.stdout.readline() == b"done\n"
        for lag in [0.0002] * 98 + [0.02] * 2:
            fleet.metrics.event_loop_lag.observe(lag)
        summary = window.summary()
    finally:
        child.kill()
        child.wait()
    assert summary["router_cores"] > 0  # its 0.3 s of CPU over however long the window took
    assert summary["loop_lag_p50_ms"] == pytest.approx(50 / 98, abs=0.01)  # the 50th of 98 in the 0-1 ms bucket
    assert summary["loop_lag_p99_ms"] == pytest.approx(17.5)  # the 99th of 100: halfway through the 10-25 ms bucket


def test_the_table_shows_the_routers_share_with_tenths_of_a_millisecond_of_lag() -> None:
    header, _, row = table(
        [{"case": "interactive", "router_cores": 0.31, "loop_lag_p50_ms": 0.52, "loop_lag_p99_ms": 7.46}]
    ).splitlines()
    assert header.endswith("| router_cores | loop_lag_p50_ms | loop_lag_p99_ms |")
    assert row.endswith("| 0.31 | 0.5 | 7.5 |")
    assert "router_cores" not in table([{"case": "interactive"}])


@pytest.mark.parametrize("bad", ["20", "-21", "x"])
def test_router_nice_is_refused_out_of_range(bad: str) -> None:
    with pytest.raises(SystemExit):
        main(["--router-nice", bad])
