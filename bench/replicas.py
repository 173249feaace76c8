"""Router replicas behind one Service: the pure parts the real harness and the simulator share.

A Kubernetes Service spreads connections over the router's replicas; :func:`assign_replicas` models it as
each request going to a replica drawn uniformly by a seeded RNG (all of one request's retries stay on the
replica that took it, as the router retries inside the request). :func:`sum_counters` adds the replicas'
counters into the fleet's (hits, misses and weight sends are per replica, each replica's ``/metrics`` and
``/debug/fleets`` count only what it routed). :func:`peer_flags` builds the router flags of the peer view
(``--peer-port``, ``--peer``) for one replica of a set. :func:`compare_with_single` checks rows against the
issue-14 goals for N replicas, relative to the same policy's single router.
"""

from __future__ import annotations

import math
import random
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

REAL_VIEWS = ("shadow", "peers")
"""``shadow``: each replica its own view of the pods' caches (no flags); ``peers``: replicas share cache
events over peer streams (``--peer-port`` and one ``--peer`` per other replica)."""


EFFECTIVE_SHARE_MIN = 0.97  # issue 14: >= 97 % of the single router's effective hit rate
EXTRA_MISSES_MAX_SHARE = 0.01  # misses <= the single router's + 1 % of requests
WEIGHT_SENDS_TOLERANCE = 0.05  # weight sends within 5 % of the single router's


class ReplicaSpecError(ValueError):
    """A replica count list or view that cannot be run."""


def parse_replica_counts(text: str) -> tuple[int, ...]:
    """``"1,2,4"`` -> ``(1, 2, 4)``: distinct positive counts in the order given."""
    counts: list[int] = []
    for part in (piece.strip() for piece in text.split(",")):
        if not part:
            continue
        try:
            count = int(part)
        except ValueError:
            raise ReplicaSpecError(f"replica count {part!r} is not an integer (expected e.g. 1,2,4)") from None
        if count < 1:
            raise ReplicaSpecError(f"replica count must be at least 1, got {count}")
        if count not in counts:
            counts.append(count)
    if not counts:
        raise ReplicaSpecError(f"no replica count in {text!r} (expected e.g. 1,2,4)")
    return tuple(counts)


def assign_replicas(requests: int, replicas: int, rng: random.Random) -> list[int]:
    """The replica (0 .. ``replicas``-1) each of ``requests`` requests is sent to, uniformly at random."""
    if replicas < 1:
        raise ReplicaSpecError(f"replicas must be at least 1, got {replicas}")
    if replicas == 1:
        return [0] * requests
    return [rng.randrange(replicas) for _ in range(requests)]


def sum_counters(per_replica: Sequence[Mapping[str, float]]) -> dict[str, float]:
    """Counter-wise sum over replicas; every replica must report the same counters."""
    if not per_replica:
        raise ReplicaSpecError("no replica counters to sum")
    names = set(per_replica[0])
    for index, counters in enumerate(per_replica[1:], start=1):
        if set(counters) != names:
            raise ReplicaSpecError(
                f"replica {index} reports counters {sorted(counters)}, replica 0 reports {sorted(names)}"
            )
    return {name: sum(float(counters[name]) for counters in per_replica) for name in per_replica[0]}


def peer_flags(
    index: int, peer_ports: Sequence[int], host: str = "127.0.0.1", token_file: Path | None = None
) -> list[str]:
    """Router flags of replica ``index`` in a peer view: its own ``--peer-port``, a ``--peer`` per other, and
    the replicas' shared ``--internal-token-file`` (as the chart runs them; a router refuses peers without one)."""
    if not 0 <= index < len(peer_ports):
        raise ReplicaSpecError(f"replica {index} out of range for {len(peer_ports)} peer ports")
    flags = ["--peer-port", str(peer_ports[index])]
    if token_file is not None:
        flags += ["--internal-token-file", str(token_file)]
    for other, port in enumerate(peer_ports):
        if other != index:
            flags += ["--peer", f"http://{host}:{port}"]
    return flags


def compare_with_single(rows: Sequence[dict[str, Any]], effective_key: str = "effective_hit_rate") -> None:
    """Add ``of_single`` (``effective_key`` over the same policy's first 1-replica row's) and ``goal``
    (``met`` / ``missed`` against the issue-14 goals; ``-`` on 1-replica rows) to each row.

    Rows need ``policy``, ``replicas``, ``requests``, ``misses``, ``weight_sends`` and ``effective_key``.
    """
    single: dict[str, Mapping[str, Any]] = {}
    for row in rows:
        if row["replicas"] == 1:
            single.setdefault(row["policy"], row)
    for row in rows:
        base = single.get(row["policy"])
        if base is None:
            row["of_single"], row["goal"] = math.nan, "-"
            continue
        effective = float(base[effective_key])
        row["of_single"] = float(row[effective_key]) / effective if effective else math.nan
        if row["replicas"] == 1:
            row["goal"] = "-"
            continue
        sends = float(base["weight_sends"])
        met = (
            float(row[effective_key]) >= EFFECTIVE_SHARE_MIN * effective
            and float(row["misses"]) <= float(base["misses"]) + EXTRA_MISSES_MAX_SHARE * float(row["requests"])
            and float(row["weight_sends"]) <= (1 + WEIGHT_SENDS_TOLERANCE) * sends  # fewer is better, not a miss
        )
        row["goal"] = "met" if met else "missed"
