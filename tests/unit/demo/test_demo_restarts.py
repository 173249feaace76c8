"""The demo restarts a worker that exits on its own, as a kubelet would, and gives up after MAX_RESTARTS.

Real subprocesses (a tiny Python program stands in for ``trtfleet worker``); the waits poll conditions.
"""

from __future__ import annotations

import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from trtfleet.demo.errors import StartupError
from trtfleet.demo.processes import MAX_RESTARTS, Supervisor

pytestmark = pytest.mark.unit

WAIT_S = 60.0  # an upper bound for slow machines; every wait ends as soon as its condition holds


def _wait_for(condition: Callable[[], bool]) -> None:
    deadline = time.monotonic() + WAIT_S
    while not condition():
        assert time.monotonic() < deadline, "condition not reached"
        time.sleep(0.05)


def _crash_once(tmp_path: Path) -> list[str]:
    """Exits with 3 the first time (as a worker whose stub died), then runs until stopped."""
    marker = tmp_path / "crashed-once"
    program = (
        "import pathlib, sys, time\n"
        f"m = pathlib.Path({str(marker)!r})\n"
        "if not m.exists():\n"
        "    m.touch(); print('stub pid=1 (tensorrt_llm_0_0): killed by SIGBUS', flush=True); sys.exit(3)\n"
        "print('serving', flush=True)\n"
        "time.sleep(600)\n"
    )
    return [sys.executable, "-c", program]


def test_a_worker_that_exits_is_restarted_with_its_last_words_said(tmp_path: Path) -> None:
    notices: list[str] = []
    sup = Supervisor(tmp_path, threading.Event(), notice=notices.append, stop_timeout_s=5)
    try:
        worker = sup.spawn("worker-1", _crash_once(tmp_path), restart=True)
        _wait_for(lambda: worker.restarts == 1 and worker.running() and "serving" in worker.tail())
        sup.check_alive([worker])  # restarted: not an error
        assert len(notices) == 1
        assert "worker-1 exited with code 3" in notices[0]
        assert "killed by SIGBUS" in notices[0]
        assert f"restart 1 of {MAX_RESTARTS}" in notices[0]
    finally:
        sup.stop_all(5)
    assert not worker.running()


def test_a_worker_that_keeps_exiting_ends_the_demo(tmp_path: Path) -> None:
    sup = Supervisor(tmp_path, threading.Event(), stop_timeout_s=5)
    try:
        worker = sup.spawn("worker-1", [sys.executable, "-c", "import sys; print('no GPU'); sys.exit(1)"],
                           restart=True)
        _wait_for(lambda: worker.restarts == MAX_RESTARTS and not worker.running())
        with pytest.raises(StartupError, match="worker-1 exited with code 1") as caught:
            sup.check_alive([worker])
        assert "no GPU" in (caught.value.log_tail or "")
    finally:
        sup.stop_all(5)


def test_a_stopped_worker_and_other_children_are_never_restarted(tmp_path: Path) -> None:
    sup = Supervisor(tmp_path, threading.Event(), stop_timeout_s=5)
    try:
        worker = sup.spawn("worker-1", [sys.executable, "-c", "import time; time.sleep(600)"], restart=True)
        router = sup.spawn("router", [sys.executable, "-c", "import sys; sys.exit(2)"])
        _wait_for(lambda: router.returncode is not None)
        worker.stop(5)  # a scale-down
        assert sup.restart_exited() == []
        assert worker.restarts == 0 and not worker.running()
        with pytest.raises(StartupError, match="router exited with code 2"):
            sup.check_alive([router])
    finally:
        sup.stop_all(5)
