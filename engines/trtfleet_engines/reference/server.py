"""Run the real ``tritonserver`` of the ``nvidia-pytriton`` wheel on a reference repository.

:func:`start_worker` assembles a backends directory with the Python backend stub of the running Python
(see :mod:`~trtfleet_engines.reference.triton_binary`), sets ``LD_LIBRARY_PATH`` (the running Python's
``LIBDIR`` first, or every model fails with ``'_thread.RLock' object has no attribute
'_recursion_count'``, then the wheel's libs) and ``TRTFLEET_WORKER_SITE_DIRS`` (this interpreter's import
roots: the stub ignores ``PYTHONPATH``, so each model's bootstrap adds them), starts tritonserver with
explicit model control and waits until ``/v2/health/ready`` answers 200. Ports left out are picked free and,
should another process take one first, the start is retried on new ones (in :meth:`WorkerProcess.wait_ready`,
so parallel starts retry too). Every stub runs under the recorder of :mod:`~trtfleet_engines.reference.stubs`,
so :attr:`WorkerProcess.stubs` says how each one ended. :meth:`WorkerProcess.stop` sends SIGTERM (SIGKILL
after a timeout), kills any stub of this worker that outlived the server and removes every temporary
directory it made.

For tests, benchmarks and the demo, :mod:`~trtfleet_engines.reference.workers` builds repositories in
temporary directories and starts workers on free ports.

Errors: :class:`~trtfleet_engines.reference.errors.WorkerError` (did not start or become ready, with the
tail of the server log) and :class:`~trtfleet_engines.reference.errors.TritonNotInstalledError`.
"""

from __future__ import annotations

import contextlib
import http.client
import logging
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from trtfleet_engines.reference.engine_stream import GRPC_ADDRESS_ENV
from trtfleet_engines.reference.errors import WorkerError
from trtfleet_engines.reference.stubs import STUB_LOG_NAME, StubRecord, read_stub_log, reap_stubs
from trtfleet_engines.reference.supervisor import OnStubDeath, StubWatchdog
from trtfleet_engines.reference.triton_binary import (
    build_backends_dir,
    locate_triton,
    tritonserver_command,
    worker_environment,
)

logger = logging.getLogger(__name__)

READY_TIMEOUT_S = 90.0
"""How long :func:`start_worker` waits for ``/v2/health/ready`` (a cold start takes a few seconds)."""
STOP_TIMEOUT_S = 15.0
"""How long :meth:`WorkerProcess.stop` waits after SIGTERM before it sends SIGKILL."""
START_ATTEMPTS = 3
"""Starts of one worker on free ports before a port conflict (another process took one first) is an error."""
_PORT_CONFLICT_MARKERS = ("already in use", "No address added")
_POLL_INTERVAL_S = 0.05
_LOG_TAIL_BYTES = 4000


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port that was free a moment ago (the OS picks it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


def http_status(host: str, port: int, path: str, timeout_s: float = 2.0) -> int | None:
    """HTTP status of GET ``path``, or None when nothing answers."""
    connection = http.client.HTTPConnection(host, port, timeout=timeout_s)
    try:
        connection.request("GET", path)
        return connection.getresponse().status
    except OSError:
        return None
    finally:
        connection.close()


@dataclass
class WorkerProcess:
    """A running tritonserver; :meth:`stop` ends it and removes its temporary directories."""

    process: subprocess.Popen[bytes]
    host: str
    http_port: int
    grpc_port: int
    metrics_port: int
    repo_dir: Path
    log_path: Path
    startup_s: float = 0.0
    cleanup_dirs: list[Path] = field(default_factory=list)
    backends_dir: Path | None = None
    stub_log_path: Path | None = None
    launch: Callable[[tuple[int, int, int]], subprocess.Popen[bytes]] | None = None
    """Starts tritonserver on (http, grpc, metrics) ports: for a start on new ports, or a restart."""
    auto_ports: bool = False
    """The caller let :func:`start_worker` pick the ports: a start that lost one is retried on new ones."""
    restarts: int = 0
    """Restarts after a stub died (see :mod:`~trtfleet_engines.reference.supervisor`)."""
    watchdog: StubWatchdog | None = None
    started_at_s: float = field(default_factory=time.time)
    """Wall-clock start of the current tritonserver process (stubs started before it are not its own)."""
    log_start: int = 0
    """Offset in the log where the current tritonserver process's output starts."""
    stubs_reaped: int = 0
    """Python backend stubs :meth:`stop` found still running after tritonserver exited (and killed)."""
    stubs_at_stop: list[StubRecord] = field(default_factory=list)
    """How every stub of this worker ended, as :meth:`stop` found them (see :attr:`stubs`)."""

    @property
    def client_host(self) -> str:
        """Where clients on this machine connect (loopback when the server binds every address)."""
        return "127.0.0.1" if self.host in ("0.0.0.0", "") else self.host

    @property
    def http_url(self) -> str:
        """``host:port`` of the HTTP API, as ``tritonclient.http`` wants it."""
        return f"{self.client_host}:{self.http_port}"

    @property
    def grpc_url(self) -> str:
        """``host:port`` of the gRPC API, as ``tritonclient.grpc`` wants it."""
        return f"{self.client_host}:{self.grpc_port}"

    @property
    def metrics_url(self) -> str:
        return f"http://{self.client_host}:{self.metrics_port}/metrics"

    @property
    def pid(self) -> int:
        return self.process.pid

    def running(self) -> bool:
        return self.process.poll() is None

    def log_tail(self, max_bytes: int = _LOG_TAIL_BYTES) -> str:
        try:
            data = self.log_path.read_bytes()
        except OSError:
            return ""
        return data[-max_bytes:].decode("utf-8", errors="replace")

    def wait_ready(self, timeout_s: float = READY_TIMEOUT_S) -> float:
        """Poll ``/v2/health/ready`` until 200; returns the seconds waited. Raises WorkerError.

        A worker whose ports were picked free and lost one to another process starts again on new ports
        (up to :data:`START_ATTEMPTS` starts in all).
        """
        start = time.monotonic()
        deadline = start + timeout_s
        for attempt in range(1, START_ATTEMPTS + 1):
            try:
                self._wait_ready_once(deadline)
                return time.monotonic() - start
            except WorkerError:
                if not self.auto_ports or attempt == START_ATTEMPTS or not self.port_conflict():
                    raise
            logger.warning("tritonserver pid=%s lost a port to another process: starting on new ports", self.pid)
            self._end_process()
            self._start_process((free_port(self.host), free_port(self.host), free_port(self.host)))
        raise AssertionError("unreachable: the last attempt returns or raises")

    def _wait_ready_once(self, deadline: float) -> None:
        while time.monotonic() < deadline:
            if not self.running():
                raise WorkerError(
                    f"tritonserver exited with code {self.process.returncode} before it was ready; "
                    f"log {self.log_path}:\n{self.log_tail()}"
                )
            if http_status(self.client_host, self.http_port, "/v2/health/ready", timeout_s=1.0) == 200:
                return
            time.sleep(_POLL_INTERVAL_S)
        raise WorkerError(f"tritonserver not ready in time; log {self.log_path}:\n{self.log_tail()}")

    def _start_process(self, ports: tuple[int, int, int]) -> None:
        assert self.launch is not None
        if self.backends_dir is not None:
            reap_stubs(self.backends_dir)  # whatever the previous process left behind
        self.log_start = self.log_path.stat().st_size if self.log_path.exists() else 0
        self.started_at_s = time.time()
        self.process = self.launch(ports)
        self.http_port, self.grpc_port, self.metrics_port = ports

    def restart(self, ready_timeout_s: float = READY_TIMEOUT_S) -> None:
        """Stop tritonserver (as :meth:`stop` does) and start it again on the same ports; wait until ready."""
        self._end_process()
        self._start_process((self.http_port, self.grpc_port, self.metrics_port))
        self.restarts += 1
        self.wait_ready(ready_timeout_s)

    def port_conflict(self) -> bool:
        """Whether the current process failed because one of its ports was taken (free ports can race)."""
        try:
            with open(self.log_path, "rb") as log:
                log.seek(self.log_start)
                text = log.read().decode("utf-8", errors="replace")
        except OSError:
            return False
        return any(marker in text for marker in _PORT_CONFLICT_MARKERS)

    @property
    def stubs(self) -> list[StubRecord]:
        """Every stub this worker started so far and how each ended (from the recorder's log)."""
        if self.stub_log_path is None or not self.stub_log_path.exists():
            return list(self.stubs_at_stop)
        return read_stub_log(self.stub_log_path.read_text(errors="replace"))

    def terminate(self) -> None:
        """Send SIGTERM without waiting (stop several workers at once, then :meth:`stop` each)."""
        if self.running():
            self.process.send_signal(signal.SIGTERM)

    def kill(self) -> None:
        """SIGKILL the server (one that did not stop after SIGTERM); :meth:`stop` reaps its stubs."""
        if self.running():
            self.process.kill()

    def stop(self, timeout_s: float = STOP_TIMEOUT_S) -> int:
        """SIGTERM, then SIGKILL after ``timeout_s``; removes temporary dirs. Returns the exit code."""
        if self.watchdog is not None:
            self.watchdog.close()
        self._end_process(timeout_s)
        if self.backends_dir is not None:
            self.stubs_reaped += len(reap_stubs(self.backends_dir))
        if self.stub_log_path is not None and self.stub_log_path.exists():
            self.stubs_at_stop = self.stubs
            self.stub_log_path = None
        for path in self.cleanup_dirs:
            shutil.rmtree(path, ignore_errors=True)
        self.cleanup_dirs.clear()
        return int(self.process.returncode)

    def _end_process(self, timeout_s: float = STOP_TIMEOUT_S) -> None:
        if self.running():
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                logger.warning("tritonserver pid=%s ignored SIGTERM for %.0f s: killing it", self.pid, timeout_s)
                self.process.kill()
                self.process.wait()

    def __enter__(self) -> WorkerProcess:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def start_worker(
    repo_dir: Path | str,
    *,
    http_port: int | None = None,
    grpc_port: int | None = None,
    metrics_port: int | None = None,
    log_dir: Path | str | None = None,
    host: str = "127.0.0.1",
    models: Sequence[str] | None = None,
    wait: bool = True,
    log_to_console: bool = False,
    ready_timeout_s: float = READY_TIMEOUT_S,
    log_verbose: int = 0,
    extra_cleanup: Sequence[Path] = (),
    on_stub_death: OnStubDeath | None = "restart",
) -> WorkerProcess:
    """Start tritonserver on ``repo_dir`` and (by default) wait until it is ready.

    ``on_stub_death``: what the :class:`~trtfleet_engines.reference.supervisor.StubWatchdog` does when a
    Python backend stub dies ("restart" tritonserver on the same ports, or "exit": stop it), None for no
    watchdog.

    Ports left None are picked free; when all three are, a start that loses one to another process is
    retried on new ones by :meth:`WorkerProcess.wait_ready` (with ``wait`` False, call it yourself).
    ``models`` defaults to every model directory in the repository. Server output goes to
    ``<log_dir>/tritonserver.log`` (a temporary directory, removed on stop, when ``log_dir`` is None),
    or to this process's stdout/stderr with ``log_to_console``.
    ``extra_cleanup`` directories are removed by :meth:`WorkerProcess.stop` too.
    """
    repo = Path(repo_dir).resolve()
    install = locate_triton()
    names = list(models) if models is not None else sorted(p.parent.name for p in repo.glob("*/config.pbtxt"))
    if not names:
        raise WorkerError(f"{repo} holds no model (no */config.pbtxt)")
    scratch = Path(tempfile.mkdtemp(prefix="trtfleet-worker-"))
    cleanup = [scratch, *extra_cleanup]
    stub_log = scratch / STUB_LOG_NAME
    auto_ports = http_port is None and grpc_port is None and metrics_port is None
    try:
        backends = build_backends_dir(install, scratch / "backends", stub_log=stub_log)
        logs = Path(log_dir) if log_dir is not None else scratch
        logs.mkdir(parents=True, exist_ok=True)
        log_path = logs / "tritonserver.log"

        client_host = "127.0.0.1" if host in ("0.0.0.0", "") else host  # where the BLS model reaches the server

        def launch(ports: tuple[int, int, int]) -> subprocess.Popen[bytes]:
            command = tritonserver_command(
                install,
                repo,
                backends,
                models=names,
                host=host,
                http_port=ports[0],
                grpc_port=ports[1],
                metrics_port=ports[2],
                log_verbose=log_verbose,
            )
            with contextlib.ExitStack() as stack:
                output = None if log_to_console else stack.enter_context(open(log_path, "ab"))
                process = subprocess.Popen(
                    command,
                    stdin=subprocess.DEVNULL,
                    stdout=output,
                    stderr=None if output is None else subprocess.STDOUT,
                    env={**worker_environment(install), GRPC_ADDRESS_ENV: f"{client_host}:{ports[1]}"},
                    cwd=scratch,
                )
            logger.info(
                "tritonserver pid=%s starting http=%s grpc=%s metrics=%s models=%s",
                process.pid,
                *ports,
                ",".join(names),
            )
            return process

        started = time.monotonic()
        ports = (
            http_port if http_port is not None else free_port(host),
            grpc_port if grpc_port is not None else free_port(host),
            metrics_port if metrics_port is not None else free_port(host),
        )
        process = launch(ports)
    except BaseException:
        for path in cleanup:
            shutil.rmtree(path, ignore_errors=True)
        raise
    worker = WorkerProcess(
        process,
        host,
        ports[0],
        ports[1],
        ports[2],
        repo,
        log_path,
        cleanup_dirs=cleanup,
        backends_dir=backends,
        stub_log_path=stub_log,
        launch=launch,
        auto_ports=auto_ports and not log_to_console,
    )
    if on_stub_death is not None:
        worker.watchdog = StubWatchdog(worker, on_stub_death)
    if wait:
        try:
            worker.wait_ready(ready_timeout_s)
        except BaseException:
            worker.stop()
            raise
        worker.startup_s = time.monotonic() - started
        logger.info("tritonserver pid=%s ready in %.2f s", worker.pid, worker.startup_s)
    return worker
