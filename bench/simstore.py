"""The router's weight store as the simulator sees it: a latency model (byte-bounded LRU, coalesced fetches)."""

from __future__ import annotations

from collections import OrderedDict


class WeightStore:
    """The router's weight store as a latency model: byte-bounded LRU, coalesced fetches."""

    def __init__(self, capacity_bytes: int, latency_s: float, bytes_per_s: float) -> None:
        self._capacity = capacity_bytes
        self._latency_s = latency_s
        self._bytes_per_s = bytes_per_s
        self._ready_at: OrderedDict[str, tuple[float, int]] = OrderedDict()
        self._used = 0
        self.fetches = 0

    def ready_at(self, adapter: str, size: int, now_s: float) -> float:
        entry = self._ready_at.get(adapter)
        if entry is not None:
            self._ready_at.move_to_end(adapter)
            return max(entry[0], now_s)
        self.fetches += 1
        ready = now_s + self._latency_s + size / self._bytes_per_s
        self._ready_at[adapter] = (ready, size)
        self._used += size
        while self._used > self._capacity and len(self._ready_at) > 1:
            _name, (_ready, old) = self._ready_at.popitem(last=False)
            self._used -= old
        return ready
