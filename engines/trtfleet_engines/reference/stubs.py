"""Every Python backend stub of a worker, observed: how each one ended, and which ones outlived tritonserver.

tritonserver (python_backend r24.10, ``src/stub_launcher.cc`` at
triton-inference-server/python_backend@01d0ad82f9f5d63978456e26c8a2a9746a9d68d8) starts each stub as
``bash -c "exec <backends>/python/triton_python_backend_stub <model.py> <shm region> ... <parent pid>
<backends>/python <ipc handle> <instance name> <model dir>"`` and ``waitpid``\\ s it only when the model
unloads (``WaitForStubProcess``), discarding the status. A stub that crashes while serving stays a zombie
until then; one that crashes while exiting (a segfault in a destructor) is reaped at once. Neither leaves
its exit status anywhere.

So :func:`install_stub_recorder` puts a small recorder at that path: it runs the real stub (symlinked next
to it as ``triton_python_backend_stub.real``, so the stub's ``argv[0]`` still names this worker's
backends directory) as its child, with ``PR_SET_PDEATHSIG`` = SIGKILL so the stub cannot outlive it, and
appends one ``start`` line and one ``exit`` line with the child's wait status to a log. The stub reads its
parent's pid from its arguments, not ``getppid()``, so it still watches tritonserver. :func:`read_stub_log`
parses that log (pure); :func:`reap_stubs` kills stubs left behind by a dead tritonserver.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import sys
from dataclasses import dataclass
from pathlib import Path

logger = logging.getLogger(__name__)

STUB_NAME = "triton_python_backend_stub"
REAL_STUB_NAME = STUB_NAME + ".real"
STUB_LOG_NAME = "stubs.log"

_RECORDER = """#!{python} -IS
# trtfleet: runs the real Python backend stub as a child and records how it ended (see stubs.py).
import ctypes, os, signal, sys, time
log_path = {log_path!r}
real = os.path.join(os.path.dirname(os.path.abspath(__file__)), {real!r})
args = sys.argv[1:]
if len(args) < 9:  # tritonserver's probe run without arguments (expects exit status 1): nothing to record
    os.execv(real, [real] + args)
name = args[7] if len(args) > 7 else "?"
model_dir = os.path.dirname(os.path.dirname(args[0])) if args else "?"
def record(line):
    with open(log_path, "a") as log:
        log.write(line + "\\n")
for sig in (signal.SIGINT, signal.SIGTERM):
    signal.signal(sig, signal.SIG_IGN)  # the stub ignores them too; tritonserver ends it by message
pid = os.fork()
if pid == 0:
    ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    os.execv(real, [real] + args)
record("start %d %d %s %s %.6f" % (os.getpid(), pid, name, model_dir, time.time()))
while True:
    try:
        _, status = os.waitpid(pid, 0)
        break
    except InterruptedError:
        continue
record("exit %d %d %s %s %.6f %d" % (os.getpid(), pid, name, model_dir, time.time(), status))
if os.WIFSIGNALED(status):
    sys.exit(128 + os.WTERMSIG(status))
sys.exit(os.WEXITSTATUS(status))
"""


@dataclass(frozen=True)
class StubRecord:
    """One stub as the recorder saw it; ``wait_status`` is None while it runs (or when its recorder was killed)."""

    recorder_pid: int
    pid: int
    instance: str
    model: str
    started_at_s: float
    wait_status: int | None = None
    ended_at_s: float | None = None

    @property
    def signal(self) -> int | None:
        """The signal that ended the stub (SIGSEGV, SIGABRT, SIGKILL...), or None."""
        if self.wait_status is None or not os.WIFSIGNALED(self.wait_status):
            return None
        return os.WTERMSIG(self.wait_status)

    @property
    def exit_code(self) -> int | None:
        if self.wait_status is None or not os.WIFEXITED(self.wait_status):
            return None
        return os.WEXITSTATUS(self.wait_status)

    @property
    def clean(self) -> bool:
        """Exited on its own with status 0 (what every stub of a clean stop does)."""
        return self.exit_code == 0

    def describe(self) -> str:
        if self.wait_status is None:
            how = "no exit recorded"
        elif self.signal is not None:
            how = f"killed by {signal.Signals(self.signal).name}"
        else:
            how = f"exit status {self.exit_code}"
        return f"stub pid={self.pid} ({self.instance}): {how}"


def read_stub_log(text: str) -> list[StubRecord]:
    """The stubs of a recorder log, in start order (pure)."""
    records: dict[int, StubRecord] = {}
    for line in text.splitlines():
        fields = line.split(" ")
        try:
            if fields[0] == "start" and len(fields) == 6:
                pid = int(fields[2])
                records[pid] = StubRecord(int(fields[1]), pid, fields[3], Path(fields[4]).name, float(fields[5]))
            elif fields[0] == "exit" and len(fields) == 7 and int(fields[2]) in records:
                pid = int(fields[2])
                old = records[pid]
                records[pid] = StubRecord(
                    old.recorder_pid, pid, old.instance, old.model, old.started_at_s, int(fields[6]), float(fields[5])
                )
        except ValueError:
            logger.warning("unreadable stub log line: %r", line)
    return list(records.values())


def install_stub_recorder(python_dir: Path, real_stub: Path, log_path: Path) -> None:
    """Put the recorder at ``python_dir/triton_python_backend_stub`` (the real stub goes next to it)."""
    (python_dir / REAL_STUB_NAME).symlink_to(real_stub)
    recorder = python_dir / STUB_NAME
    recorder.write_text(_RECORDER.format(python=sys.executable, log_path=str(log_path), real=REAL_STUB_NAME))
    recorder.chmod(0o755)


def reap_stubs(backends_dir: Path) -> list[str]:
    """Kill every process started from ``backends_dir`` (stubs and recorders) and free stubs' shared memory.

    When tritonserver gives up on its exit timeout (a model did not unload in time) its stubs outlive it:
    they notice the dead parent only seconds later, or never when one is blocked in a call to the server
    (they ignore SIGTERM). Returns what was killed, as ``"pid (instance)"``.
    """
    if not Path("/proc").is_dir():
        return []
    marker = str(backends_dir).encode()
    reaped = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            argv = (entry / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if not any(marker in arg for arg in argv[:3]):  # argv[0] of a stub, argv[2] of a recorder (python -IS)
            continue
        instance = argv[8].decode(errors="replace") if len(argv) > 8 and marker in argv[0] else "recorder"
        logger.warning("killing python backend stub pid=%s (%s) left behind by tritonserver", entry.name, instance)
        with contextlib.suppress(OSError):
            os.kill(int(entry.name), signal.SIGKILL)
        reaped.append(f"{entry.name} ({instance})")
        for region in [a.decode(errors="replace") for a in argv if a.startswith(b"triton_python_backend_shm")]:
            with contextlib.suppress(OSError):
                os.unlink(Path("/dev/shm") / region)
    return reaped


def stub_pids(backends_dir: Path) -> dict[int, str]:
    """``{pid: instance name}`` of the real stubs running from ``backends_dir`` now (for tests and tools)."""
    marker = str(backends_dir / "python" / REAL_STUB_NAME).encode()
    found = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            argv = (entry / "cmdline").read_bytes().split(b"\0")
            state = (entry / "stat").read_text().rsplit(")", 1)[1].split()[0]
        except (OSError, IndexError):
            continue
        if argv and argv[0] == marker and state != "Z":
            found[int(entry.name)] = argv[8].decode(errors="replace") if len(argv) > 8 else "?"
    return found
