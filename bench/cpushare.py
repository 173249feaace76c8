"""The CPU a benchmark's own processes take, and CPU taken on purpose: ``bench.batch``'s control on a small machine.

On the 2-core bench machine the reference workers, the router and the batch runner share two cores, so a batch
slows interactive requests on pods that run none of its lines (their steps and hops wait for a core). A GPU
fleet's pods do not share their host's CPU that way. Two tools tell the two costs apart:

* :func:`tree_cpu_s`: CPU seconds (user + system) used so far by this process's descendants (workers, their
  Python-backend stubs, routers, burners), read from ``/proc`` (Linux); a case's ``fleet_cores`` is its rise over
  a window divided by the window's length;
* :func:`renice_tree`: a process, its descendants and every thread of them at a lower priority (``bench.batch
  --batch-pods-nice``: the pods the reserve leaves to the batch run on CPU the others leave idle, as pods with
  their own host CPUs would);
* :func:`pin_tree`: a process, its descendants and every thread of them allowed only some CPUs (``bench.batch
  --batch-pods-cpus``: the pods the reserve leaves to the batch on their own cores, the rest of the fleet, the
  router and the load on the others: pods with their own compute, as near as two cores allow);
* :class:`Burn`: processes that keep ``cores`` of CPU busy, duty-cycled over :data:`PERIOD_S` (``bench.batch
  --cpu-burn``): the interactive load beside a burn that takes what a batch takes, without any batch line in the
  fleet.
"""

from __future__ import annotations

import argparse
import math
import os
import subprocess
import sys
from collections.abc import Callable, Collection, Mapping
from pathlib import Path
from typing import Final

PERIOD_S: Final = 0.01
"""A burner spins ``share`` of each period and sleeps the rest: about half a 20 ms pretend step, so its CPU comes
in bursts of the size a batch step's does, not as one long hold of a core."""

_LOOP: Final = """
import sys, time
share, period = float(sys.argv[1]), float(sys.argv[2])
while True:
    start = time.perf_counter()
    while time.perf_counter() - start < share * period:
        pass
    time.sleep(max(0.0, period - (time.perf_counter() - start)))
"""


def _stat_fields(pid: str, proc: Path) -> list[str] | None:
    try:
        text = (proc / pid / "stat").read_text()
    except OSError:  # gone since the listing
        return None
    return text[text.rindex(")") + 2 :].split()  # after "pid (comm) ": state, ppid, ...; comm may hold spaces


def _descendants(root: int, proc: Path) -> list[int]:
    parents: dict[int, int] = {}
    for entry in proc.iterdir():
        fields = _stat_fields(entry.name, proc) if entry.name.isdigit() else None
        if fields is not None:
            parents[int(entry.name)] = int(fields[1])
    found: list[int] = []
    frontier = {root}
    while frontier:
        children = [pid for pid, parent in parents.items() if parent in frontier]
        found += children
        frontier = set(children)
    return found


def _each_thread(root: int, apply: Callable[[int], object], what: str, proc: Path) -> int:
    """``apply(tid)`` on every thread of ``root`` and of its descendants; the count it succeeded on.
    ProcessLookupError when none (no such process, or none this process may change), so a run never reports
    pods set that are not."""
    count = 0
    for pid in [root, *_descendants(root, proc)]:
        try:
            tids = [int(task.name) for task in (proc / str(pid) / "task").iterdir()]
        except OSError:  # gone
            continue
        for tid in tids:
            try:
                apply(tid)
                count += 1
            except (ProcessLookupError, PermissionError):
                continue
    if count == 0:
        raise ProcessLookupError(f"no thread of process {root} could be set to {what}")
    return count


def renice_tree(root: int, nice: int, proc: Path = Path("/proc")) -> int:
    """Every thread of ``root`` and of its descendants at ``nice`` (Linux keeps a nice value per thread, and a
    new thread or child takes its creator's); the count of threads set (:func:`_each_thread`)."""
    return _each_thread(root, lambda tid: os.setpriority(os.PRIO_PROCESS, tid, nice), f"nice {nice}", proc)


def pin_tree(root: int, cpus: set[int], proc: Path = Path("/proc")) -> int:
    """Every thread of ``root`` and of its descendants allowed only ``cpus`` (affinity, too, is per thread and
    inherited by new threads and children); the count of threads set (:func:`_each_thread`)."""
    return _each_thread(root, lambda tid: os.sched_setaffinity(tid, cpus), f"CPUs {sorted(cpus)}", proc)


def pin_self(cpus: set[int]) -> None:
    """Every thread of this process allowed only ``cpus`` (its children are left as they are)."""
    for task in Path("/proc/self/task").iterdir():
        try:
            os.sched_setaffinity(int(task.name), cpus)
        except ProcessLookupError:  # a thread that ended since the listing
            continue


def pin_split(pids: Mapping[str, int], apart: Collection[str], cpus: set[int], others: set[int]) -> list[str]:
    """The process trees of ``pids`` whose names are in ``apart`` on ``cpus``; the other trees and this process
    (the load generator: its request threads are made by the threads pinned here) on ``others``. The names
    pinned apart, sorted."""
    for name, pid in pids.items():
        pin_tree(pid, cpus if name in apart else others)
    pin_self(others)
    return sorted(name for name in pids if name in apart)


def cpu_set(text: str) -> set[int]:
    """``--batch-pods-cpus``: CPUs as ``taskset -c`` writes them (``1``, ``2-3``, ``0,2``), each one this process
    may run on, and not all of them (the rest is for the router and the reserved pods)."""
    allowed = os.sched_getaffinity(0)
    cpus: set[int] = set()
    try:
        for part in (p.strip() for p in text.split(",") if p.strip()):
            low, dash, high = part.partition("-")
            cpus.update(range(int(low), int(high if dash else low) + 1))
    except ValueError:
        cpus = set()
    if not cpus or not cpus < allowed:
        raise argparse.ArgumentTypeError(
            f"CPUs like 1 or 2-3, some but not all of the {sorted(allowed)} this process may use, not {text!r}"
        )
    return cpus


def tree_cpu_s(root: int | None = None, proc: Path = Path("/proc")) -> float:
    """CPU seconds (user + system, of the processes and of their waited-for children) of ``root``'s live
    descendants, ``root`` (default: this process) left out; 0.0 where there is no ``/proc``."""
    if not proc.is_dir():
        return 0.0
    total = 0
    for pid in _descendants(os.getpid() if root is None else root, proc):
        fields = _stat_fields(str(pid), proc)
        if fields is not None:  # utime, stime, cutime, cstime: fields 14-17 of stat(5), here 11-14 after the state
            total += sum(int(value) for value in fields[11:15])
    return total / os.sysconf("SC_CLK_TCK")


def burn_list(text: str) -> list[float]:
    """``--cpu-burn``: cores, comma-separated, each from 0 to the machine's."""
    try:
        values = [float(value) for value in text.split(",") if value.strip()]
    except ValueError:
        values = [-1.0]
    if not values or not all(0.0 <= value <= (os.cpu_count() or 1) for value in values):
        raise argparse.ArgumentTypeError(f"cores from 0 to {os.cpu_count()}, comma-separated, not {text!r}")
    return values


class Burn:
    """``cores`` of CPU kept busy while open: ``ceil(cores)`` processes, each spinning its share of every
    :data:`PERIOD_S` (0: none)."""

    def __init__(self, cores: float) -> None:
        if not 0.0 <= cores <= (os.cpu_count() or 1):
            raise ValueError(f"a burn of {cores} cores: between 0 and the machine's {os.cpu_count()}")
        self.cores = cores
        self._processes: list[subprocess.Popen[bytes]] = []

    def __enter__(self) -> Burn:
        count = math.ceil(self.cores)
        for _ in range(count):
            share = self.cores / count
            self._processes.append(subprocess.Popen([sys.executable, "-c", _LOOP, f"{share:.4f}", str(PERIOD_S)]))
        return self

    def __exit__(self, *exc: object) -> None:
        processes, self._processes = self._processes, []
        for process in processes:
            process.kill()
        for process in processes:
            process.wait()
