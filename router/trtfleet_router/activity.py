"""Adapters active per base model in a sliding window: how many, and the LoRA cache pages they take.

The operator's autoscaler sizes a fleet so that the pages of the adapters in use fit in the pods' LoRA
caches (``spec.autoscaling.adapterWorkingSet``); the router, which sees every request, keeps the window.
One entry per adapter seen in the window (bounded by the registry's adapters), last-seen times on an
injected clock; expired entries go when the window is read. Event-loop thread only.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class ActiveAdapters:
    count: int
    pages: int


class AdapterActivity:
    def __init__(self, window_s: float, *, now: Callable[[], float] = time.monotonic) -> None:
        self.window_s = window_s
        self._now = now
        self._seen: dict[str, dict[str, tuple[float, int]]] = {}  # base -> adapter -> (last seen, pages)

    def record(self, base_model: str, adapter: str, pages: int) -> None:
        self._seen.setdefault(base_model, {})[adapter] = (self._now(), pages)

    def active(self, base_model: str) -> ActiveAdapters:
        seen = self._seen.get(base_model)
        if not seen:
            return ActiveAdapters(0, 0)
        horizon = self._now() - self.window_s
        for adapter in [a for a, (at, _) in seen.items() if at < horizon]:
            del seen[adapter]
        return ActiveAdapters(len(seen), sum(pages for _, pages in seen.values()))

    def base_models(self) -> list[str]:
        return sorted(self._seen)
