"""Notice a dead Python backend stub and make the worker say so (python_backend r24.10 does not).

A decoupled Python model whose stub died stays READY in Triton 2.51: ``/v2/health/ready`` and
``/v2/models/<m>/ready`` answer 200 while every request fails with ``Stub process '<m>_0_0' is not
healthy.`` (python_backend r24.10 ``src/stub_launcher.cc`` ``ReceiveMessageFromStub``; the restart of an
unhealthy stub is an unimplemented "restart on decoupled" (a to-do comment) in ``src/python_be.cc``
``TRITONBACKEND_ModelInstanceExecute``, both at triton-inference-server/python_backend@
01d0ad82f9f5d63978456e26c8a2a9746a9d68d8). Unloading and loading the model again does not help: the dead
instance never finishes unloading, so the server can no longer stop within its exit timeout.

:class:`StubWatchdog` polls the stub recorder's log (:mod:`~trtfleet_engines.reference.stubs`) and, on a
stub of the current tritonserver that ended any other way than exit status 0, either restarts tritonserver
on the same ports ("restart": readiness is refused from the SIGTERM until the new server is ready) or
stops it ("exit": for ``trtfleet worker``, whose container the kubelet then restarts). A server stopping
after a stub died may never finish unloading the dead instance, exit timeout or not: "exit" sends SIGTERM
once and SIGKILL after :data:`KILL_AFTER_S`, so the worker does end (and its pod restarts) rather than
answer "unknown model" until someone notices.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Literal, Protocol

if TYPE_CHECKING:
    from trtfleet_engines.reference.stubs import StubRecord

logger = logging.getLogger(__name__)

OnStubDeath = Literal["restart", "exit"]
POLL_INTERVAL_S = 0.2
KILL_AFTER_S = 10.0  # past tritonserver's own --exit-timeout-secs (triton_binary.EXIT_TIMEOUT_S)


def dead_stubs(records: list[StubRecord], since_s: float) -> list[StubRecord]:
    """Stubs started at or after ``since_s`` (the current server's) that ended other than by exit 0 (pure)."""
    return [r for r in records if r.started_at_s >= since_s and r.wait_status is not None and not r.clean]


class WatchedServer(Protocol):
    """What the watchdog reads and does of a tritonserver it watches (a ``server.WorkerProcess``)."""

    @property
    def pid(self) -> int: ...

    @property
    def started_at_s(self) -> float:
        """Wall-clock start of the current process: older stubs are not its own."""
        ...

    @property
    def stubs(self) -> list[StubRecord]:
        """Every stub the server started so far and how each ended."""
        ...

    def running(self) -> bool: ...

    def terminate(self) -> None: ...

    def kill(self) -> None: ...

    def restart(self) -> None:
        """Start the server again on the same ports; return once it is ready."""
        ...


class StubWatchdog:
    """A daemon thread that acts on the first dead stub of each tritonserver process of ``worker``."""

    def __init__(
        self,
        worker: WatchedServer,
        on_death: OnStubDeath,
        poll_interval_s: float = POLL_INTERVAL_S,
        kill_after_s: float = KILL_AFTER_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.worker = worker
        self.on_death = on_death
        self.deaths: list[StubRecord] = []
        self._poll_interval_s = poll_interval_s
        self._kill_after_s = kill_after_s
        self._clock = clock
        self._terminated_at: float | None = None  # "exit": when the SIGTERM went
        self._closed = threading.Event()
        self._lock = threading.Lock()  # held while acting, so that close() waits for a restart to finish
        self._thread = threading.Thread(target=self._run, name="stub-watchdog", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._closed.wait(self._poll_interval_s):
            self.poll()

    def poll(self) -> None:
        """One look at the worker (the thread's loop; tests call it directly)."""
        with self._lock:
            if self._closed.is_set() or not self.worker.running():
                return
            if self._terminated_at is not None:  # "exit" acts once; then only makes sure the server ends
                if self._clock() - self._terminated_at >= self._kill_after_s:
                    logger.error("tritonserver pid=%s still running %.0f s after SIGTERM: SIGKILL",
                                 self.worker.pid, self._kill_after_s)
                    self.worker.kill()
                return
            dead = dead_stubs(self.worker.stubs, self.worker.started_at_s)
            if dead:
                self._act(dead)

    def _act(self, dead: list[StubRecord]) -> None:
        self.deaths += dead
        what = "; ".join(record.describe() for record in dead)
        if self.on_death == "exit":
            logger.error("%s: stopping tritonserver pid=%s", what, self.worker.pid)
            self._terminated_at = self._clock()
            self.worker.terminate()
            return
        logger.error("%s: restarting tritonserver pid=%s on the same ports", what, self.worker.pid)
        try:
            self.worker.restart()
        except Exception:  # the next poll sees the server down and leaves it so; stop() cleans up
            logger.exception("restarting tritonserver failed")

    def close(self) -> None:
        """Stop watching (waits for a restart in progress)."""
        self._closed.set()
        with self._lock:
            pass
        self._thread.join()
