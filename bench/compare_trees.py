"""The router's CPU per request in two source trees side by side: this checkout and another (a worktree of an older
commit), for a restructuring that must not cost CPU.

``python -m bench.compare_trees --base /path/to/worktree [--this /other/worktree] [--rounds 5] [--seconds 4]
[--connections 8]``

Both routers run at once, each in front of its own echo upstream (no model), started from this checkout's
:mod:`bench.overhead_processes` with ``PYTHONPATH`` pointing at one tree's packages (the other tree's code, this
venv's dependencies). ``wrk`` loads one router and endpoint at a time, the four cases alternating within each
round (Triton generate and OpenAI completions on each tree), so the machine's background load falls on both alike.
The figure is the router process's CPU over the requests it answered (/proc): the median over rounds, with the
range. A commit older than the benchmark helpers still runs: only its router and echo server are used.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import urllib.request
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from bench import report
from bench.native_loadgen import cpu_s, find_wrk, wrk_run
from bench.overhead_processes import ADAPTER, Processes, start

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("", "router", "engines", "operator")
PROMPT = "hello " * 20


def tree_path(tree: Path) -> str:
    return os.pathsep.join(str(tree / package) if package else str(tree) for package in PACKAGES)


def cases(router_http: str) -> dict[str, tuple[str, dict[str, Any]]]:
    return {
        "Triton generate": (f"http://{router_http}/v2/models/{ADAPTER}/generate",
                            {"text_input": PROMPT, "max_tokens": 1}),
        "OpenAI completions": (f"http://{router_http}/v1/completions",
                               {"model": ADAPTER, "prompt": PROMPT, "max_tokens": 1}),
    }


def warm(url: str, body: dict[str, Any]) -> None:
    request = urllib.request.Request(url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=30) as answer:
        if answer.status != 200:
            raise RuntimeError(f"{url} answered {answer.status}")


def run(base: Path, this: Path, rounds: int, seconds: float, connections: int) -> list[dict[str, Any]]:
    if find_wrk() is None:
        raise SystemExit("bench.compare_trees needs wrk (apt-get install wrk)")
    work = Path(tempfile.mkdtemp(prefix="trtfleet-bench-trees-"))
    trees = {"base": base.resolve(), "this": this.resolve()}
    saved = os.environ.get("PYTHONPATH")
    procs: dict[str, Processes] = {}
    try:
        for name, tree in trees.items():
            os.environ["PYTHONPATH"] = tree_path(tree)
            procs[name] = start("echo", "auto", True)
        samples: dict[tuple[str, str], list[float]] = {}
        for name, proc in procs.items():
            for case, (url, body) in cases(proc.router_http).items():
                warm(url, body)
                samples[(name, case)] = []
        for _ in range(rounds):
            for (name, case), values in samples.items():
                proc = procs[name]
                url, body = cases(proc.router_http)[case]
                before = cpu_s(proc.router_pid)
                result = wrk_run("wrk", url, body, connections, seconds, work)
                values.append((cpu_s(proc.router_pid) - before) / result.requests * 1e6)
    finally:
        if saved is None:
            os.environ.pop("PYTHONPATH", None)
        else:
            os.environ["PYTHONPATH"] = saved
        for proc in procs.values():
            proc.stop()
    return [{"tree": name, "case": case, "cpu_us": statistics.median(values), "low": min(values), "high": max(values)}
            for (name, case), values in samples.items()]


COLUMNS = (("case", "case"), ("tree", "tree"), ("cpu_us", "router CPU us/request (median)"), ("low", "lowest"),
           ("high", "highest"))


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--base", type=Path, required=True, help="the other tree (e.g. a git worktree)")
    parser.add_argument("--this", type=Path, default=ROOT, help="the tree compared with it (default: this checkout)")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--seconds", type=float, default=4.0)
    parser.add_argument("--connections", type=int, default=8)
    parser.add_argument("--write", action="store_true", help="write the section of docs/benchmarks/overhead.md")
    args = parser.parse_args(argv)
    rows = run(args.base, args.this, args.rounds, args.seconds, args.connections)
    rows.sort(key=lambda row: (row["case"], row["tree"]))
    table = report.table(rows, COLUMNS)
    print(table)
    if args.write:
        command = "python -m bench.compare_trees " + " ".join(argv if argv is not None else sys.argv[1:])
        trees = f"base: {commit_of(args.base)}, this: {commit_of(args.this)}"
        report.write_section("trees", "\n\n".join([
            report.provenance(command) + f" Trees compared ({trees}); load average at the end "
            f"{os.getloadavg()[0]:.1f}.",
            f"Median of {args.rounds} rounds of {args.seconds:g} s per case, the cases alternating within a round; "
            "wrk with one thread and --connections; the echo upstream.",
            table,
        ]))


def commit_of(tree: Path) -> str:
    done = subprocess.run(["git", "-C", str(tree), "rev-parse", "--short", "HEAD"], capture_output=True, text=True)
    return done.stdout.strip() or "unknown"


if __name__ == "__main__":
    main()
