"""Keep finished BLS response iterators referenced from Python until the stub's cleanup thread is done with them.

Why (python_backend r24.10, triton-inference-server/python_backend@01d0ad82f9f5d63978456e26c8a2a9746a9d68d8):
``pb_utils.InferenceRequest.exec(decoupled=True)`` returns a ``ResponseIterator`` that the stub also keeps in
``response_iterator_map_`` (``src/pb_stub.cc``, ``Stub::GetResponseIterator``). When the final response is
read, ``ResponseIterator::Clear`` (``src/pb_response_iterator.cc``) queues a cleanup id, and the stub's
stub-to-parent thread later runs ``Stub::SendCleanupId``, which does ``response_iterator_map_.erase(id)``
without the GIL. If Python dropped its reference first, that erase destroys the iterator, its responses and
their numpy arrays on a thread without the GIL: heap corruption (segfaults in ``_PyObject_Malloc``,
``malloc(): unaligned fastbin chunk detected``, ``pybind11_object_dealloc(): Tried to deallocate
unregistered instance!``). Upstream holds the GIL in ``PbTensor::~PbTensor`` since python_backend@
b771f4f2f3fae3eb97c8f3624d268fd3947f96ea (r25.01), which r24.10 lacks.

So a finished iterator is released only once that erase has happened:

* normally right away, after a fresh ``is_cancelled()`` on the BLS request: it travels the same FIFO
  stub-to-parent queue (``Stub::EnqueueIsCancelled`` -> ``SendIsCancelled``, same file) and waits for its
  answer, so when it returns the earlier cleanup id has been processed;
* otherwise (the request was cancelled: ``is_cancelled`` answers from its cache without queueing) it goes to
  this graveyard, which drops it ``hold_s`` later from a Python thread (so with the GIL).

:class:`Graveyard` is the pure, clock-injected container; :class:`GraveyardSweeper` the thread that empties
it. Nothing is ever dropped by the container itself: callers drop what :meth:`Graveyard.due` returns.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable
from typing import Generic, TypeVar

T = TypeVar("T")

HOLD_S = 2.0
"""How long a buried iterator stays referenced. The cleanup thread erases within milliseconds when the stub
is healthy; this is three orders of magnitude more."""
CLOSE_WAIT_S = 0.5
"""At most this long :meth:`GraveyardSweeper.close` waits for held items to come due. It runs in
``finalize()``, which Triton calls only once every request has ended, so every cleanup id was queued well
before; waiting out the full hold time would slow every unload (the worker's exit timeout is 5 s)."""


class Graveyard(Generic[T]):
    """Items with the time each may be dropped; thread-safe, bounded by burial rate x ``hold_s``."""

    def __init__(self, hold_s: float = HOLD_S, clock: Callable[[], float] = time.monotonic) -> None:
        self._hold_s = hold_s
        self._clock = clock
        self._lock = threading.Lock()
        self._items: deque[tuple[float, T]] = deque()

    def bury(self, item: T) -> None:
        with self._lock:
            self._items.append((self._clock() + self._hold_s, item))

    def due(self) -> list[T]:
        """Remove and return the items whose hold time has passed (the caller drops them)."""
        now = self._clock()
        out = []
        with self._lock:
            while self._items and self._items[0][0] <= now:
                out.append(self._items.popleft()[1])
        return out

    def drain(self) -> list[T]:
        """Remove and return every item, due or not."""
        with self._lock:
            out = [item for _, item in self._items]
            self._items.clear()
        return out

    def seconds_to_next(self) -> float | None:
        """Seconds until the oldest item is due (0 if already due), None when empty."""
        with self._lock:
            if not self._items:
                return None
            return max(0.0, self._items[0][0] - self._clock())

    def seconds_to_last(self) -> float:
        """Seconds until every item now held is due (0 when empty)."""
        with self._lock:
            return max(0.0, self._items[-1][0] - self._clock()) if self._items else 0.0

    def __len__(self) -> int:
        with self._lock:
            return len(self._items)


class GraveyardSweeper(Generic[T]):
    """A daemon thread that drops each buried item when it is due; :meth:`close` empties the graveyard."""

    def __init__(self, graveyard: Graveyard[T], sleep: Callable[[float], None] = time.sleep) -> None:
        self.graveyard = graveyard
        self._sleep = sleep
        self._wake = threading.Condition()
        self._running = True
        self._thread = threading.Thread(target=self._run, name="bls-graveyard", daemon=True)
        self._thread.start()

    def bury(self, item: T) -> None:
        self.graveyard.bury(item)
        with self._wake:
            self._wake.notify()

    def _run(self) -> None:
        while True:
            with self._wake:
                if not self._running:
                    return
                self._wake.wait(self.graveyard.seconds_to_next())
            dropped = self.graveyard.due()
            del dropped  # the last references go here, on a Python thread holding the GIL

    def close(self, max_wait_s: float = CLOSE_WAIT_S) -> int:
        """Stop the thread, wait until every held item is due (at most ``max_wait_s``), drop them all."""
        with self._wake:
            self._running = False
            self._wake.notify()
        self._thread.join()
        self._sleep(min(max_wait_s, self.graveyard.seconds_to_last()))
        dropped = self.graveyard.drain()
        count = len(dropped)
        del dropped
        return count
