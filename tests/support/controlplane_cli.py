"""Start a test control plane (:class:`tests.support.controlplane.ControlPlane`) from the command line, in the
foreground until SIGINT/SIGTERM; ``down`` stops one started by ``up``:

    python -m tests.support.controlplane_cli up --dir .tmp/cluster
    python -m tests.support.controlplane_cli down --dir .tmp/cluster
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import time
from pathlib import Path

from tests.support.controlplane import ControlPlane, binaries, cache_bin_dir


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
        return True
    except ProcessLookupError:
        return False
    except PermissionError:
        return True


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


def cmd_up(args: argparse.Namespace) -> int:
    root = Path(args.dir).resolve()
    cp = ControlPlane(root, scheduler=args.scheduler, kwok=not args.no_kwok)
    stop = {"flag": False}

    def on_signal(signum: int, _frame: object) -> None:
        stop["flag"] = True

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    cp.start()
    lines = [f"up {os.getpid()}"] + [f"{n} {p.pid}" for n, p in cp.procs.items()]
    (root / "pids").write_text("\n".join(lines) + "\n")
    print(f"# control plane ready in {cp.startup_seconds:.1f}s ({cp.server}); logs in {cp.logs}",
          file=sys.stderr)
    print(f"export KUBECONFIG={cp.kubeconfig}", flush=True)
    try:
        while not stop["flag"]:
            dead = [n for n, p in cp.procs.items() if p.poll() is not None]
            if dead:
                print(f"# {', '.join(dead)} exited:\n{cp.log_tail(dead[0])}", file=sys.stderr)
                return 1
            time.sleep(0.5)
    finally:
        cp.stop()
    return 0


def cmd_down(args: argparse.Namespace, timeout: float = 20.0) -> int:
    root = Path(args.dir).resolve()
    pidfile = root / "pids"
    if not pidfile.exists():
        print(f"no control plane running in {root}", file=sys.stderr)
        return 0
    entries = [line.split() for line in pidfile.read_text().splitlines() if line.strip()]
    # Only signal processes that still are ours (pid reuse): the supervisor's or
    # children's command line names the directory or the cached binaries.
    def ours(name: str, pid: int) -> bool:
        cmd = _cmdline(pid)
        return str(root) in cmd or str(cache_bin_dir()) in cmd or (name == "up" and "controlplane_cli" in cmd)

    alive = [(n, int(p)) for n, p in entries if _pid_alive(int(p)) and ours(n, int(p))]
    for n, pid in alive:  # the supervisor first: it stops its children cleanly
        if n == "up":
            os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and any(_pid_alive(pid) for _, pid in alive):
        time.sleep(0.2)
    for _n, pid in alive:
        if _pid_alive(pid):
            os.kill(pid, signal.SIGKILL)
    pidfile.unlink(missing_ok=True)
    print(f"control plane in {root} stopped", file=sys.stderr)
    return 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    up = sub.add_parser("up", help="start a control plane in the foreground")
    up.add_argument("--dir", required=True)
    up.add_argument("--no-kwok", action="store_true", help="no kube-scheduler, kwok or simulated node")
    up.add_argument("--scheduler", action="store_true", help="run kube-scheduler even with --no-kwok")
    down = sub.add_parser("down", help="stop the control plane started by `up --dir DIR`")
    down.add_argument("--dir", required=True)
    sub.add_parser("build", help="build the binaries into the cache (hack/build-control-plane.sh)")
    args = ap.parse_args(argv)
    if args.cmd == "up":
        return cmd_up(args)
    if args.cmd == "down":
        return cmd_down(args)
    print("\n".join(str(p) for p in binaries().values()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
