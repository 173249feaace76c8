"""An asyncio event loop in a daemon thread, for tests that serve or call async code from sync tests."""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Coroutine
from concurrent.futures import Future
from typing import Any, TypeVar

T = TypeVar("T")


class LoopThread:
    """An asyncio event loop running in a daemon thread."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, name="test-loop", daemon=True)
        self._thread.start()

    def run(self, coro: Coroutine[Any, Any, T], timeout_s: float = 60.0) -> T:
        future: Future[T] = asyncio.run_coroutine_threadsafe(coro, self.loop)
        return future.result(timeout_s)

    def close(self) -> None:
        """Cancel what still runs on the loop and wait for it (as ``asyncio.run`` does), then stop and close it:
        a task left pending on a closed loop is finalised later, wherever the garbage collector runs, and its
        clean-up (``Queue.get`` cancelling its waiter) then fails on the closed loop, an unraisable error
        that pytest reports against whichever test happens to run then."""
        if self._thread.is_alive():
            with contextlib.suppress(Exception):  # a task that will not end is left, as before
                self.run(_cancel_the_rest(), timeout_s=10)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(10)
        self.loop.close()


async def _cancel_the_rest() -> None:
    current = asyncio.current_task()
    tasks = [task for task in asyncio.all_tasks() if task is not current]
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
    await asyncio.get_running_loop().shutdown_asyncgens()
