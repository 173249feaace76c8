"""bench.cpushare: the CPU of a process tree as /proc counts it, and a burn that takes what it is asked for."""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from bench.batch import main
from bench.batchreport import table
from bench.cpushare import Burn, burn_list, cpu_set, pin_self, pin_split, pin_tree, renice_tree, tree_cpu_s

TICK_S = 1 / os.sysconf("SC_CLK_TCK")


def _stat(proc: Path, pid: int, comm: str, ppid: int, ticks: tuple[int, int, int, int]) -> None:
    (proc / str(pid)).mkdir()
    utime, stime, cutime, cstime = ticks
    # stat(5): pid (comm) state ppid pgrp session tty_nr tpgid flags minflt cminflt majflt cmajflt utime stime ...
    fields = ["S", ppid, 1, 1, 0, -1, 0, 0, 0, 0, 0, utime, stime, cutime, cstime, 20, 0, 1]
    (proc / str(pid) / "stat").write_text(f"{pid} ({comm}) " + " ".join(str(f) for f in fields) + "\n")


def test_tree_cpu_counts_the_descendants_of_the_root_only(tmp_path: Path) -> None:
    _stat(tmp_path, 10, "bench", 1, (500, 500, 0, 0))  # the root: left out
    _stat(tmp_path, 11, "tritonserver", 10, (100, 20, 0, 0))
    _stat(tmp_path, 12, "triton_python_backend_stub (x) y", 11, (30, 5, 7, 1))  # a grandchild, odd comm
    _stat(tmp_path, 13, "other", 1, (900, 900, 0, 0))  # not below the root
    (tmp_path / "self").mkdir()  # not a pid
    assert tree_cpu_s(10, proc=tmp_path) == pytest.approx((120 + 43) * TICK_S)
    assert tree_cpu_s(11, proc=tmp_path) == pytest.approx(43 * TICK_S)
    assert tree_cpu_s(13, proc=tmp_path) == 0.0
    assert tree_cpu_s(10, proc=tmp_path / "absent") == 0.0


@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="needs Linux /proc")
def test_tree_cpu_sees_a_real_child_spend_cpu() -> None:
    spin = "import time\nwhile time.process_time() < 0.3: pass\nprint('done', flush=True)\ntime.sleep(60)"
    child = subprocess.Popen([sys.executable, "-c", spin], stdout=subprocess.PIPE)
    try:
        assert child.stdout is not None and child.stdout.readline() == b"done\n"
        assert tree_cpu_s() >= 0.25  # its 0.3 s, to the tick, and whatever else this test process runs
    finally:
        child.kill()
        child.wait()


@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="needs Linux /proc")
@pytest.mark.timeout(120)
def test_a_burn_starts_one_process_per_started_core_spends_cpu_and_stops() -> None:
    with Burn(0.0) as nothing:
        assert nothing._processes == []
    before = tree_cpu_s()
    with Burn(1.5) as burn:
        processes = list(burn._processes)
        assert len(processes) == 2
        while tree_cpu_s() - before < 0.2:  # CPU, not a wall-clock window: waits for what it counts
            time.sleep(0.05)
    assert all(process.poll() is not None for process in processes)
    with pytest.raises(ValueError, match="between 0"):
        Burn(-1)


def test_burn_lists_are_cores_within_the_machine() -> None:
    assert burn_list("0.5, 1") == [0.5, 1.0]
    for bad in ("", "x", "-0.5", str((os.cpu_count() or 1) + 1)):
        with pytest.raises(argparse.ArgumentTypeError):
            burn_list(bad)
    with pytest.raises(SystemExit):
        main(["--cpu-burn", "many"])


def test_the_table_shows_the_cores_the_fleet_took() -> None:
    text = table([{"case": "interactive cpu=0.5", "ttft_p50_ms": 9.0, "fleet_cores": 0.71}])
    header, _, row = text.splitlines()
    assert header.split(" | ")[-1] == "fleet_cores |" and row.endswith("| 0.71 |")


def _nice_of(tid_dir: Path) -> int:
    text = (tid_dir / "stat").read_text()
    return int(text[text.rindex(")") + 2 :].split()[16])  # stat(5) field 19, the nice value


@contextmanager
def _family() -> Iterator[tuple[int, int, list[Path]]]:
    """A parent with a second thread and a child of its own: their pids, and every thread of both."""
    code = (
        "import subprocess, sys, threading, time\n"
        "threading.Thread(target=time.sleep, args=(60,), daemon=True).start()\n"
        "child = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)'])\n"
        "print(child.pid, flush=True)\n"
        "time.sleep(60)\n"
    )
    parent = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE)
    child_pid = None
    try:
        assert parent.stdout is not None
        child_pid = int(parent.stdout.readline())
        tasks = [*Path(f"/proc/{parent.pid}/task").iterdir(), *Path(f"/proc/{child_pid}/task").iterdir()]
        assert len(tasks) >= 3
        yield parent.pid, child_pid, tasks
    finally:
        parent.kill()
        parent.wait()
        if child_pid is not None:
            subprocess.run(["kill", "-9", str(child_pid)], check=False)


@pytest.mark.skipif(not Path("/proc/self/task").exists(), reason="needs Linux /proc")
def test_renice_sets_every_thread_of_a_process_and_of_its_children() -> None:
    with _family() as (parent, child, tasks):
        assert renice_tree(parent, 7) == len(tasks)
        assert [_nice_of(task) for task in tasks] == [7] * len(tasks)
        assert os.getpriority(os.PRIO_PROCESS, 0) != 7  # this test's own process is not below the parent
        with pytest.raises(ProcessLookupError, match="no thread of process"):
            renice_tree(child + 10**7, 7)  # above any pid Linux hands out (pid_max is at most 2**22)


@pytest.mark.skipif(not Path("/proc/self/task").exists(), reason="needs Linux /proc")
def test_pinning_allows_every_thread_of_a_process_and_of_its_children_only_the_cpus_given() -> None:
    last = max(os.sched_getaffinity(0))
    with _family() as (parent, child, tasks):
        assert pin_tree(parent, {last}) == len(tasks)
        assert [os.sched_getaffinity(int(task.name)) for task in tasks] == [{last}] * len(tasks)
        with pytest.raises(ProcessLookupError, match="no thread of process"):
            pin_tree(child + 10**7, {last})


@pytest.mark.skipif(not Path("/proc/self/task").exists(), reason="needs Linux /proc")
def test_a_split_puts_the_trees_named_apart_on_their_cpus_and_the_rest_and_this_process_on_the_others() -> None:
    allowed = os.sched_getaffinity(0)
    first, last = min(allowed), max(allowed)  # one CPU: the same, and the split still sets every thread
    sleepers = [subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"]) for _ in range(2)]
    try:
        pids = {"w0": sleepers[0].pid, "w1": sleepers[1].pid}
        assert pin_split(pids, ["w1", "w7"], {last}, {first}) == ["w1"]
        assert os.sched_getaffinity(sleepers[0].pid) == {first}
        assert os.sched_getaffinity(sleepers[1].pid) == {last}
        assert all(os.sched_getaffinity(int(task.name)) == {first} for task in Path("/proc/self/task").iterdir())
    finally:
        pin_self(allowed)
        for sleeper in sleepers:
            sleeper.kill()
            sleeper.wait()


def test_the_cpus_for_the_batch_pods_are_some_but_not_all_of_the_allowed_ones() -> None:
    allowed = sorted(os.sched_getaffinity(0))
    for bad in ("", "x", "1-", "-1", "3-1", ",".join(map(str, allowed)), str(allowed[-1] + 1)):
        with pytest.raises(argparse.ArgumentTypeError, match="some but not all"):
            cpu_set(bad)
    if len(allowed) > 1:  # a one-CPU machine has no valid split
        assert cpu_set(str(allowed[-1])) == {allowed[-1]}
        assert cpu_set(f" {allowed[0]}-{allowed[0]} ,") == {allowed[0]}
    with pytest.raises(SystemExit):  # the batch's pods are the fixed reserve's complement: none without one
        main(["--batch-pods-cpus", str(allowed[-1]), "--batch-reserve-pods", "auto"])
    with pytest.raises(SystemExit):  # the router's own CPUs only where the pods have theirs
        main(["--router-cpus", str(allowed[-1]), "--batch-reserve-pods", "2"])
