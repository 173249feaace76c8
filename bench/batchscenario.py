"""bench.batch's scenario: what one run is, the cases its settings expand to, and the pods a reserve leaves to
the batch."""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import dataclass

from trtfleet_router.routing.hashing import RendezvousRankings
from trtfleet_router.routing.reserve import RESERVE_AUTO, reserved_pods


@dataclass(frozen=True)
class BatchScenario:
    lines: int = 10_000
    adapters: int = 16
    workers: int = 3
    max_batch_size: int = 8
    min_step_ms: float = 20.0
    host_cache_pages: int = 4
    prompt_tokens: int = 32
    max_tokens: int = 16
    interactive_rps: float = 2.0
    interactive_s: float = 120.0
    batch_concurrency: int = 24
    batch_pod_slots: int = 6
    """Batch lines are admitted while a pod's load is below this: max batch 8 minus 2 slots kept for
    interactive requests (an engine does not preempt a running sequence)."""
    batch_reserve_pods: int = 0
    """Pods that take no batch line while interactive requests come (the router's ``--batch-reserve-pods``;
    ``RESERVE_AUTO``: ``auto``)."""
    batch_ttft_target_ms: float | None = 30.0
    """An interactive first answer slower than this halves the runner's window (AIMD; None: off)."""
    seed: int = 0
    trtfleet: tuple[tuple[str, float], ...] = ()
    """Settings of the router's ``trtfleet`` policy section (``--trtfleet KEY=VALUE``, camelCase; () its defaults),
    every case alike: e.g. the cold-load and in-flight prices measured on these workers."""
    trace: bool = False
    """Router at debug level; each row gets :func:`bench.batchreport.trace_summary` of its interactive requests."""
    cancel_after_interactive: bool = False
    """Cancel the batch when the interactive load ends; ``lines_per_s`` is then the rate during that window."""
    batch_pods_nice: int = 0
    """With a batch and a fixed reserve: the nice value of the workers the reserve leaves to the batch (0: as
    the others), so that their engines run on CPU the reserved pods and the router leave idle (``nice``)."""
    router_nice: int = 0
    """Every case's router at this nice value (below 0: ahead of the pods for CPU, as a router on its own CPU)."""
    batch_pods_cpus: tuple[int, ...] = ()
    """With a fixed reserve, every case: the pods it leaves to the batch on these CPUs, the rest on ``other_cpus``."""
    other_cpus: tuple[int, ...] = ()
    router_cpus: tuple[int, ...] = ()  # with batch_pods_cpus: the router's CPUs when not other_cpus


def setting_text(name: str, value: int) -> str:
    """A ``bench.batch`` setting as the router's flag and the case labels write it (``reserve`` -1: ``auto``)."""
    return "auto" if name == "reserve" and value == RESERVE_AUTO else str(value)


DIMENSIONS = {"slots": "--batch-pod-slots", "conc": "--batch-concurrency", "reserve": "--batch-reserve-pods",
              "nice": "--batch-pods-nice"}


def parse_setting(name: str, text: str) -> int:
    """One value of a ``DIMENSIONS`` flag (``auto`` only for ``reserve``); ValueError otherwise."""
    if name == "reserve" and text.strip().lower() == "auto":
        return RESERVE_AUTO
    return int(text)


def expand_cases(
    cases: Sequence[str], dimensions: dict[str, Sequence[int]]
) -> list[tuple[str, dict[str, int], str]]:
    """``(case, settings, label)`` to run. ``dimensions``: values per setting (keys of :data:`DIMENSIONS`);
    where some have several, one ``interactive+batch`` per combination (labelled ``interactive+batch
    slots=N conc=M``, naming only what varies); the other cases once, at the first values."""
    firsts = {name: values[0] for name, values in dimensions.items() if values}
    varying = [name for name, values in dimensions.items() if len(values) > 1]
    runs: list[tuple[str, dict[str, int], str]] = []
    for case in cases:
        if case == "interactive+batch" and varying:
            for combo in itertools.product(*(dimensions[name] for name in varying)):
                named = [f"{name}={setting_text(name, value)}" for name, value in zip(varying, combo, strict=True)]
                runs.append((case, {**firsts, **dict(zip(varying, combo, strict=True))}, " ".join([case, *named])))
        else:
            runs.append((case, dict(firsts), case))
    return runs


def batch_pods(workers: int, reserve: int) -> list[str]:
    """The pods (``bench.realfleet`` names them w0, w1, ...) that a reserve of ``reserve`` leaves to the batch."""
    ids = [f"w{i}" for i in range(workers)]
    rankings = RendezvousRankings(len(ids))
    rankings.set_pods(ids)
    return sorted(set(ids) - reserved_pods(rankings, ids, reserve))
