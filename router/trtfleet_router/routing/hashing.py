"""Stable hashing shared by the policies: rendezvous (HRW) rankings and the CHWBL ring's points.

Every router replica must compute the same numbers from the same names, so hashes come from
BLAKE2b (``hashlib``), never from Python's per-process salted ``hash()``.
"""

from __future__ import annotations

import hashlib
from collections import OrderedDict
from collections.abc import Sequence

_SEPARATOR = b"\x00"


def stable_hash64(text: str) -> int:
    """A 64-bit hash of ``text`` that is the same in every process and on every machine."""
    return int.from_bytes(hashlib.blake2b(text.encode(), digest_size=8).digest(), "big")


def rendezvous_score(key: str, pod_id: str) -> int:
    """HRW weight of ``pod_id`` for ``key``: BLAKE2b-64 of ``key NUL pod_id``."""
    digest = hashlib.blake2b(key.encode() + _SEPARATOR + pod_id.encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big")


def rendezvous_rank(key: str, pod_ids: Sequence[str]) -> tuple[str, ...]:
    """``pod_ids`` ordered by descending HRW weight for ``key`` (ties, practically never: by id).

    Removing a pod never reorders the others, so only keys whose first pod left move.
    """
    prefix = key.encode() + _SEPARATOR
    blake2b = hashlib.blake2b
    scored = [
        (int.from_bytes(blake2b(prefix + pod_id.encode(), digest_size=8).digest(), "big"), pod_id)
        for pod_id in pod_ids
    ]
    scored.sort(key=lambda item: (-item[0], item[1]))
    return tuple(pod_id for _score, pod_id in scored)


class RendezvousRankings:
    """HRW rankings of the fleet's pods per key, cached (LRU) until the pod set changes.

    A ranking costs one hash per pod; a cached one costs a dict lookup. Memory: at most
    ``max_entries`` rankings of ``len(pods)`` references each.
    """

    __slots__ = ("_cache", "_max_entries", "_pods")

    def __init__(self, max_entries: int) -> None:
        self._max_entries = max_entries
        self._pods: tuple[str, ...] = ()
        self._cache: OrderedDict[str, tuple[str, ...]] = OrderedDict()

    @property
    def pods(self) -> tuple[str, ...]:
        return self._pods

    def set_pods(self, pod_ids: Sequence[str]) -> None:
        pods = tuple(sorted(pod_ids))
        if pods != self._pods:
            self._pods = pods
            self._cache.clear()

    def rank(self, key: str) -> tuple[str, ...]:
        cache = self._cache
        ranking = cache.get(key)
        if ranking is not None:
            cache.move_to_end(key)
            return ranking
        ranking = rendezvous_rank(key, self._pods)
        cache[key] = ranking
        if len(cache) > self._max_entries:
            cache.popitem(last=False)
        return ranking
