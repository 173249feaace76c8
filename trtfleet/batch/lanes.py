"""The lines a batch still has to run, taken a model at a time on up to ``lanes`` models at once (pure).

Grouped by model, each adapter's lines run together so a pod loads the adapter once. One group at a time
spreads that adapter over every pod the batch uses, so each pod still loads every adapter of the batch once
(and evicts an interactive adapter for it, each time). With one group per pod in flight (``lanes`` = the
ready pods) the router's batch lane can keep each adapter on the pod that already holds it
(``trtfleet_router.routing.batchplace``): the batch then loads each adapter about once in all, not once per
pod. The next line comes from the first ``lanes`` groups, the one with the fewest lines in flight (the
earlier group on a tie), so every active group keeps some lines going.

Groups are runs of consecutive lines of one model: lines already ordered by model give one group per model;
lines in input order give short runs, taken one lane at a time, which is input order exactly.
"""

from __future__ import annotations

from collections import Counter, deque
from collections.abc import Iterable

from trtfleet.batch.lines import BatchLine


class LineLanes:
    def __init__(self, lines: Iterable[BatchLine]) -> None:
        self._groups: deque[tuple[str, deque[BatchLine]]] = deque()
        for item in lines:
            if not self._groups or self._groups[-1][0] != item.model:
                self._groups.append((item.model, deque()))
            self._groups[-1][1].append(item)
        self._inflight: Counter[str] = Counter()

    def __bool__(self) -> bool:
        return bool(self._groups)

    def __len__(self) -> int:
        return sum(len(lines) for _, lines in self._groups)

    def peek(self, lanes: int = 1) -> BatchLine:
        """The next line to start (raises IndexError when none is left)."""
        return self._pick(lanes)[1][0]

    def take(self, lanes: int = 1) -> BatchLine:
        """Remove and return :meth:`peek`'s line, counted in flight until :meth:`done`."""
        group = self._pick(lanes)
        item = group[1].popleft()
        if not group[1]:
            self._groups.remove(group)
        self._inflight[item.model] += 1
        return item

    def done(self, item: BatchLine) -> None:
        self._inflight[item.model] -= 1
        if self._inflight[item.model] <= 0:
            del self._inflight[item.model]

    def _pick(self, lanes: int) -> tuple[str, deque[BatchLine]]:
        if not self._groups:
            raise IndexError("no line left")
        best = self._groups[0]
        for index, group in enumerate(self._groups):
            if index >= max(1, lanes):
                break
            if self._inflight[group[0]] < self._inflight[best[0]]:
                best = group
        return best
