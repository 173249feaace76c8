"""Gateway mode's cost: what Envoy + trtfleet's endpoint picker add per request, beside Envoy alone and the router.

``python -m bench.gateway [--rounds 3] [--seconds 4] [--prompt-bytes 2048,32768] [--concurrency 1,32] [--write]``

Side by side in one run, on the same upstream (the echo server: Triton's generate extension, no model, so the
figures are the proxies' own), all on this machine, load from ``wrk`` (one thread):

* **direct**: ``wrk`` calls the upstream's generate endpoint itself (a warm adapter's ``lora_task_id``);
* **envoy**: the pinned Envoy with a static cluster in front of it (the floor any gateway pays);
* **envoy+python floor**: Envoy with the same ``ext_proc`` filter calling :mod:`bench.extproc_floor`, a picker
  on grpc.aio that decides nothing (one fixed endpoint): what the protocol costs in Python before any routing;
* **envoy+wire floor**: the same do-nothing picker served on the HTTP/2 frames trtfleet's picker port reads
  itself (``--wire``): the protocol's cost in Python as trtfleet's picker pays it;
* **envoy+picker**: the same Envoy, its ``ext_proc`` filter calling a ``trtfleet router --epp-port`` as the
  InferencePool's picker (``FULL_DUPLEX_STREAMED`` bodies both ways), an ``ORIGINAL_DST`` cluster on the
  picker's ``x-gateway-destination-endpoint``; the client names the adapter, the picker rewrites the path and
  adds ``lora_task_id``;
* **envoy+lwepp**: the same Envoy, its ``ext_proc`` filter calling GIE's own picker ``lwepp`` (Go, v1.6.2, round
  robin over an InferencePool's ready Pods; :mod:`bench.lwepp`), the client calling the upstream's model as for
  **envoy**: what the protocol costs in Go before any model-aware routing. Left out, and said, when ``lwepp`` is
  not built (``make bench-tools``);
* **router**: the router's own front end (``/v2/models/{adapter}/generate``), the full path.

Each case runs ``--rounds`` times for ``--seconds``, the setups alternating within a round; the table keeps
each figure's median over rounds. "Added" is a setup's p50 less direct's p50 of the same round. CPU per request
is the CPU the setup's own processes spent over the requests it answered (Envoy; Envoy and the router for the
picker; the router), read from /proc: what one core costs per request, whatever else shares the machine.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import subprocess
import sys
import tempfile
import urllib.request
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench import lwepp, report
from bench.native_loadgen import cpu_s, find_wrk, free_port, wait_port, wrk_run
from bench.overhead_processes import ADAPTER, TASK_ID, Processes, start
from trtfleet.demo.envoy import EnvoyProcess, gateway_bootstrap

ROOT = Path(__file__).resolve().parent.parent

SETUPS = ("direct", "envoy", "envoy+python floor", "envoy+wire floor", "envoy+lwepp", "envoy+picker", "router")


@dataclass(frozen=True)
class Target:
    url: str
    body: dict[str, Any]
    pids: tuple[int, ...]  # the processes whose CPU the setup costs


def targets(
    procs: Processes,
    floor: EnvoyProcess,
    fixed: EnvoyProcess,
    fixed_pid: int,
    gateway: EnvoyProcess,
    prompt: str,
    go_picker: tuple[EnvoyProcess, int] | None = None,
    wire_floor: tuple[EnvoyProcess, int] | None = None,
) -> dict[str, Target]:
    warm = {"text_input": prompt, "max_tokens": 1, "lora_task_id": TASK_ID}
    by_name = {"text_input": prompt, "max_tokens": 1}
    upstream_path = f"/v2/models/{procs.upstream_model}/generate"
    adapter_path = f"/v2/models/{ADAPTER}/generate"
    assert floor.process is not None and gateway.process is not None and fixed.process is not None
    found = {
        "direct": Target(f"http://{procs.upstream_http}{upstream_path}", warm, ()),
        "envoy": Target(floor.url + upstream_path, warm, (floor.process.pid,)),
        "envoy+python floor": Target(fixed.url + upstream_path, warm, (fixed.process.pid, fixed_pid)),
        "envoy+picker": Target(gateway.url + adapter_path, by_name, (gateway.process.pid, procs.router_pid)),
        "router": Target(f"http://{procs.router_http}{adapter_path}", by_name, (procs.router_pid,)),
    }
    for name, extra in (("envoy+lwepp", go_picker), ("envoy+wire floor", wire_floor)):
        if extra is not None:
            envoy, picker_pid = extra
            assert envoy.process is not None
            found[name] = Target(envoy.url + upstream_path, warm, (envoy.process.pid, picker_pid))
    return found


def warm_up(target: Target) -> None:
    request = urllib.request.Request(target.url, data=json.dumps(target.body).encode(),
                                     headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=30) as answer:
        if answer.status != 200:
            raise RuntimeError(f"warm-up through the router answered {answer.status}")


def measure(target: Target, concurrency: int, seconds: float, work: Path) -> dict[str, float]:
    before = sum(cpu_s(pid) for pid in target.pids)
    run = wrk_run("wrk", target.url, target.body, concurrency, seconds, work, timeout_s=30)
    spent = sum(cpu_s(pid) for pid in target.pids) - before
    return {"p50_ms": run.p50_ms, "p99_ms": run.p99_ms, "rps": run.rps,
            "cpu_us": spent / run.requests * 1e6 if run.requests and target.pids else float("nan")}


def run(args: argparse.Namespace) -> list[dict[str, Any]]:
    if find_wrk() is None:
        raise SystemExit("bench.gateway needs wrk (apt-get install wrk)")
    work = Path(tempfile.mkdtemp(prefix="trtfleet-bench-gateway-"))
    picker_port = free_port()
    limits = ("--max-input-len", "65536", "--max-seq-len", "66000", "--max-body-bytes", str(8 << 20))
    procs = start("echo", "auto", True, ("--epp-port", str(picker_port), *limits))
    rows: list[dict[str, Any]] = []
    fixed_port, wire_port = free_port(), free_port()
    floor_command = [sys.executable, "-m", "bench.extproc_floor", "--endpoint", procs.upstream_http]
    fixed_picker = subprocess.Popen([*floor_command, "--port", str(fixed_port)], cwd=ROOT)
    wire_picker = subprocess.Popen([*floor_command, "--port", str(wire_port), "--wire"], cwd=ROOT)
    try:
        wait_port(fixed_port)
        wait_port(wire_port)
        static = gateway_bootstrap(free_port(), free_port(), static_pods=[procs.upstream_http])
        fixed = gateway_bootstrap(free_port(), free_port(), picker=f"127.0.0.1:{fixed_port}")
        routed = gateway_bootstrap(free_port(), free_port(), picker=f"127.0.0.1:{picker_port}")
        with contextlib.ExitStack() as stack:
            floor = stack.enter_context(EnvoyProcess(static, work / "floor"))
            fixed_envoy = stack.enter_context(EnvoyProcess(fixed, work / "fixed"))
            wire_config = gateway_bootstrap(free_port(), free_port(), picker=f"127.0.0.1:{wire_port}")
            wire_floor = (stack.enter_context(EnvoyProcess(wire_config, work / "wire")), wire_picker.pid)
            gateway = stack.enter_context(EnvoyProcess(routed, work / "gateway"))
            go_picker = None
            if lwepp.find_lwepp() is None:
                print(f"envoy+lwepp left out: {lwepp.LWEPP} not built (make bench-tools)", flush=True)
            else:
                picker = stack.enter_context(lwepp.running(procs.upstream_http, work / "lwepp"))
                config = gateway_bootstrap(free_port(), free_port(), picker=picker.address)
                go_picker = (stack.enter_context(EnvoyProcess(config, work / "lwepp-envoy")), picker.pid)
            for size in args.prompt_bytes:
                prompt = ("gateway " * (size // 8 + 1))[:size]
                setups = targets(procs, floor, fixed_envoy, fixed_picker.pid, gateway, prompt, go_picker, wire_floor)
                warm_up(setups["router"])  # the router stores the adapter on the pod: direct calls find it warm
                if go_picker is not None:
                    lwepp.wait_synced(lambda target=setups["envoy+lwepp"]: warm_up(target))
                names = [name for name in SETUPS if name in setups]
                for concurrency in args.concurrency:
                    rounds: dict[str, list[dict[str, float]]] = {name: [] for name in names}
                    for _ in range(args.rounds):
                        for name in names:
                            rounds[name].append(measure(setups[name], concurrency, args.seconds, work))
                    direct = rounds["direct"]
                    for name in names:
                        added = [r["p50_ms"] - d["p50_ms"] for r, d in zip(rounds[name], direct, strict=True)]
                        row = {"prompt_bytes": size, "concurrency": concurrency, "setup": name,
                               **{key: statistics.median(r[key] for r in rounds[name])
                                  for key in ("p50_ms", "p99_ms", "rps", "cpu_us")},
                               "added_p50_ms": statistics.median(added)}
                        rows.append(row)
                        print(report.table([row], COLUMNS), flush=True)
    finally:
        for floor_picker in (fixed_picker, wire_picker):
            floor_picker.terminate()
            floor_picker.wait(timeout=10)
        procs.stop()
    return rows


COLUMNS = (("prompt_bytes", "prompt bytes"), ("concurrency", "concurrency"), ("setup", "setup"),
           ("p50_ms", "p50 ms"), ("p99_ms", "p99 ms"), ("added_p50_ms", "added p50 ms"), ("rps", "req/s"),
           ("cpu_us", "CPU us/request"))


def section(rows: Sequence[dict[str, Any]], command: str, rounds: int) -> str:
    return "\n\n".join([
        report.provenance(command) + f" Load average at the end: {os.getloadavg()[0]:.1f}.",
        f"Median of {rounds} rounds per figure, setups alternating within each round; upstream: the echo server "
        "(no model); load: wrk, one thread.",
        report.table(rows, COLUMNS),
    ])


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=4.0)
    parser.add_argument("--prompt-bytes", type=lambda text: [int(v) for v in text.split(",")], default=[2048, 32768])
    parser.add_argument("--concurrency", type=lambda text: [int(v) for v in text.split(",")], default=[1, 32])
    parser.add_argument("--write", action="store_true", help="write docs/benchmarks/gateway.md")
    args = parser.parse_args(argv)
    rows = run(args)
    if args.write:
        command = "python -m bench.gateway " + " ".join(argv or [])
        report.write_section("gateway", section(rows, command.strip(), args.rounds))


if __name__ == "__main__":
    main()
