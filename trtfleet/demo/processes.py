"""The demo's child processes: ``trtfleet worker | router | lora`` subprocesses, their logs, their end.

Each child runs in its own session (process group), so a Ctrl-C in the terminal reaches only the demo,
which then stops the children in order (router first, so it drains, then the workers) with SIGTERM,
and SIGKILLs a process group that outlives ``stop_timeout_s`` (tritonserver, the workers' own child,
included). Children also get SIGTERM from the kernel if the demo itself dies (``PR_SET_PDEATHSIG``).

Workers are restarted when they exit on their own, as a kubelet restarts a crashed container
(``restartPolicy: Always``): a ``trtfleet worker`` stops when one of its Python backend stubs dies (see
``trtfleet_engines.reference.supervisor``), and the router must hide that from clients by retrying
another pod while the worker comes back on the same ports. A worker that keeps dying
(:data:`MAX_RESTARTS`) ends the demo with its log.
"""

from __future__ import annotations

import ctypes
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Final

from trtfleet.demo.errors import DemoInterrupted, StartupError

PR_SET_PDEATHSIG: Final = 1
POLL_INTERVAL_S: Final = 0.2
PROGRESS_EVERY_S: Final = 5.0
HTTP_PROBE_TIMEOUT_S: Final = 2.0
LOG_TAIL_LINES: Final = 25
MAX_RESTARTS: Final = 3  # per child; more means the worker cannot run here, not a passing crash


def trtfleet_command() -> list[str]:
    """How to run ``trtfleet`` with this very interpreter (a venv's, a container's)."""
    return [sys.executable, "-m", "trtfleet"]


def free_port(host: str = "127.0.0.1") -> int:
    """A port free right now (the child binds it a moment later; a race is possible but rare)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def check_ports_free(host: str, ports: dict[str, int]) -> None:
    """Fail before starting anything when a port the demo needs is taken (``{flag: port}``)."""
    for flag, port in ports.items():
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                s.bind((host, port))
            except OSError as exc:
                raise StartupError(f"cannot listen on {host}:{port} ({exc.strerror}): pass another {flag}") from exc


def _child_setup() -> None:
    """preexec_fn: SIGTERM when the demo dies (Linux); the new session comes from start_new_session."""
    try:
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGTERM)
    except (OSError, AttributeError):
        pass


def http_ok(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=HTTP_PROBE_TIMEOUT_S) as resp:
            return bool(resp.status == 200)
    except (OSError, urllib.error.HTTPError):
        return False


class Child:
    """One subprocess with its output in a log file."""

    def __init__(self, name: str, argv: Sequence[str], log_path: Path, *, restart: bool = False) -> None:
        self.name = name
        self.argv = list(argv)
        self.log_path = log_path
        self.restart = restart  # restarted when it exits on its own (a worker), else its exit ends the demo
        self.restarts = 0
        self.stopping = False  # stopped on purpose (the end, a scale-down): never restarted
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self, env: dict[str, str] | None = None) -> Child:
        with self.log_path.open("ab") as log:
            self.proc = subprocess.Popen(
                self.argv, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                env=env, start_new_session=True, preexec_fn=_child_setup,
            )
        return self

    @property
    def returncode(self) -> int | None:
        return None if self.proc is None else self.proc.poll()

    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def tail(self, lines: int = LOG_TAIL_LINES) -> str:
        try:
            text = self.log_path.read_text(errors="replace")
        except OSError:
            return ""
        return "\n".join(text.splitlines()[-lines:])

    def _group_alive(self) -> bool:
        if self.proc is None:
            return False
        try:
            os.killpg(self.proc.pid, 0)
        except ProcessLookupError:
            return False
        except PermissionError:
            return True
        return True

    def restartable(self) -> bool:
        """Exited on its own with restarts left (see the module docstring)."""
        return self.restart and not self.stopping and self.restarts < MAX_RESTARTS

    def stop(self, timeout_s: float) -> None:
        """SIGTERM, wait, then SIGKILL whatever is left of the child's process group."""
        self.stopping = True
        if self.proc is None:
            return
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout_s)
            except subprocess.TimeoutExpired:
                pass
        if self._group_alive():
            os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait()
        deadline = time.monotonic() + timeout_s
        while self._group_alive() and time.monotonic() < deadline:  # grandchildren being reaped by init
            time.sleep(0.05)


def log_tails(children: Sequence[Child]) -> str:
    """The last lines of each child's log, under its name and path (for an error report)."""
    return "\n".join(f"--- {c.name} ({c.log_path})\n{c.tail()}" for c in children)


class Supervisor:
    """Starts children, restarts workers that exit on their own, and stops them all, newest first."""

    def __init__(
        self,
        log_dir: Path,
        stop: threading.Event,
        env: dict[str, str] | None = None,
        notice: Callable[[str], None] | None = None,
        stop_timeout_s: float = 10.0,
    ) -> None:
        self.log_dir = log_dir
        self.stop_requested = stop
        self.env = env
        self.notice = notice
        self.stop_timeout_s = stop_timeout_s
        self.children: list[Child] = []
        self._lock = threading.Lock()  # restarts (the watcher thread) against stop_all and check_alive
        self._watcher: threading.Thread | None = None
        self._unwatch = threading.Event()

    def spawn(self, name: str, argv: Sequence[str], *, restart: bool = False) -> Child:
        child = Child(name, argv, self.log_dir / f"{name}.log", restart=restart).start(self.env)
        with self._lock:
            self.children.append(child)
        if restart and self._watcher is None:
            self._unwatch.clear()
            self._watcher = threading.Thread(target=self._watch, name="demo-restarts", daemon=True)
            self._watcher.start()
        return child

    def stop_all(self, timeout_s: float) -> None:
        self._unwatch.set()
        if self._watcher is not None:
            self._watcher.join()
            self._watcher = None
        for child in reversed(self.children):
            child.stop(timeout_s)
        self.children.clear()

    def check_alive(self, children: Sequence[Child]) -> None:
        """Raise StartupError for a child that exited and will not be restarted."""
        with self._lock:
            for child in children:
                if not child.running() and not child.restartable():
                    raise StartupError(f"{child.name} exited with code {child.returncode}", child.tail())

    def restart_exited(self) -> list[Child]:
        """Start again every restartable child that exited (same argv, so the same ports); returns them."""
        restarted = []
        with self._lock:
            for child in self.children:
                if child.proc is None or child.running() or not child.restartable():
                    continue
                code = child.returncode
                last = next((line for line in reversed(child.tail().splitlines()) if line.strip()), "")
                child.stop(self.stop_timeout_s)  # what is left of its process group (tritonserver, stubs)
                child.stopping = False
                count = child.restarts + 1
                if self.notice is not None:
                    self.notice(f"  {child.name} exited with code {code} ({last.strip()[:200]}); restarting it "
                                f"as a kubelet would (restart {count} of {MAX_RESTARTS})")
                child.start(self.env)
                child.restarts = count  # counted once its new process runs: a waiter reads a settled state
                restarted.append(child)
        return restarted

    def _watch(self) -> None:
        while not self._unwatch.wait(POLL_INTERVAL_S):
            self.restart_exited()

    def wait_until(
        self,
        probe: Callable[[], bool],
        *,
        what: str,
        timeout_s: float,
        watch: Sequence[Child] = (),
        progress: Callable[[str], None] | None = None,
    ) -> float:
        """Poll ``probe`` until true; fail early when a watched child dies. Returns the seconds it took."""
        started = time.monotonic()
        next_note = started + PROGRESS_EVERY_S
        while True:
            if self.stop_requested.is_set():
                raise DemoInterrupted()
            self.check_alive(watch)
            if probe():
                return time.monotonic() - started
            now = time.monotonic()
            if now - started > timeout_s:
                raise StartupError(f"{what}: not done after {timeout_s:.0f} s", log_tails(watch))
            if progress is not None and now >= next_note:
                progress(f"  ... still {what} ({now - started:.0f} s)")
                next_note = now + PROGRESS_EVERY_S
            self.stop_requested.wait(POLL_INTERVAL_S)

    def wait_exit(self, children: Sequence[Child], *, what: str, timeout_s: float) -> None:
        """Wait for short-lived children (conversions); any non-zero exit is a StartupError."""
        self.wait_until(lambda: all(c.returncode is not None for c in children), what=what, timeout_s=timeout_s)
        for child in children:
            if child.returncode != 0:
                raise StartupError(f"{child.name} failed with exit code {child.returncode}", child.tail())
