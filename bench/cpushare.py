"""The CPU a benchmark's own processes take, and CPU taken on purpose: ``bench.batch``'s control on a small machine.

On the 2-core bench machine the reference workers, the router and the batch runner share two cores, so a batch
slows interactive requests on pods that run none of its lines (their steps and hops wait for a core). A GPU
fleet's pods do not share their host's CPU that way. Two tools tell the two costs apart:

* :func:`tree_cpu_s`: CPU seconds (user + system) used so far by this process's descendants (workers, their
  Python-backend stubs, routers, burners), read from ``/proc`` (Linux); a case's ``fleet_cores`` is its rise over
  a window divided by the window's length;
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


def tree_cpu_s(root: int | None = None, proc: Path = Path("/proc")) -> float:
    """CPU seconds (user + system, of the processes and of their waited-for children) of ``root``'s live
    descendants, ``root`` (default: this process) left out; 0.0 where there is no ``/proc``."""
    if not proc.is_dir():
        return 0.0
    root = os.getpid() if root is None else root
    parents: dict[int, int] = {}
    ticks: dict[int, int] = {}
    for entry in proc.iterdir():
        if not entry.name.isdigit():
            continue
        fields = _stat_fields(entry.name, proc)
        if fields is None:
            continue
        pid = int(entry.name)
        parents[pid] = int(fields[1])
        # utime, stime, cutime, cstime: fields 14-17 of stat(5), here 11-14 after the state
        ticks[pid] = sum(int(value) for value in fields[11:15])
    total = 0
    for pid in ticks:
        seen, parent = 0, parents.get(pid)
        while parent is not None and parent != root and parent > 1 and seen < 64:
            parent, seen = parents.get(parent), seen + 1
        if parent == root:
            total += ticks[pid]
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
