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


def renice_tree(root: int, nice: int, proc: Path = Path("/proc")) -> int:
    """Every thread of ``root`` and of its descendants at ``nice`` (Linux keeps a nice value per thread, and a
    new thread or child takes its creator's); the count of threads set. ProcessLookupError when it set none (no
    such process, or none it may renice), so a run never reports pods niced that are not."""
    count = 0
    for pid in [root, *_descendants(root, proc)]:
        try:
            tids = [int(task.name) for task in (proc / str(pid) / "task").iterdir()]
        except OSError:  # gone
            continue
        for tid in tids:
            try:
                os.setpriority(os.PRIO_PROCESS, tid, nice)
                count += 1
            except (ProcessLookupError, PermissionError):
                continue
    if count == 0:
        raise ProcessLookupError(f"no thread of process {root} could be set to nice {nice}")
    return count


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
