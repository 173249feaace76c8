"""``python -m bench.autoscale_real``: the autoscaled demo on real processes, idle -> burst -> idle.

Starts ``trtfleet demo --workers 1 --autoscale N`` (reference workers and the router, each a process,
workers started and stopped by :func:`trtfleet.autoscaling.decide`), waits until the idle demo is at zero
workers, then replays a burst of ``--requests`` completions arriving at ``--rate`` per second through the
openai client, and waits until the fleet is back at zero. Reported:

* worker-seconds: the pool size integrated over the run (from the autoscaler's log lines, stamped when
  this process reads them), against ``N`` workers for the same time (static peak sizing);
* requests answered, lost (an error or a wrong answer: must be 0), held (sent while no worker served);
* latency of the held requests (cold start included) and of the others.
"""

from __future__ import annotations

import argparse
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

SCALE_LINE = re.compile(r"autoscaler (\w+): .*?(\d+) -> (\d+) pod\(s\)")
READY_LINE = re.compile(r"ready: in the router's fleet")
MODELS = ("tiny", "tiny-upper", "tiny-reverse", "tiny-json")
PROMPT = "hello world"


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@dataclass
class DemoLog:
    """The demo's output lines, stamped (monotonic seconds) as they are read."""

    lines: list[tuple[float, str]] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def add(self, line: str) -> None:
        with self.lock:
            self.lines.append((time.monotonic(), line))

    def snapshot(self) -> list[tuple[float, str]]:
        with self.lock:
            return list(self.lines)

    def count(self, text: str) -> int:
        return sum(text in line for _t, line in self.snapshot())

    def pool_sizes(self) -> list[tuple[float, int]]:
        """(time, workers) after every autoscaler change."""
        sizes = []
        for at, line in self.snapshot():
            matches = SCALE_LINE.findall(line)
            if matches:
                sizes.append((at, int(matches[-1][2])))
        return sizes

    def first_ready_after(self, start: float) -> float | None:
        return next((at for at, line in self.snapshot() if at >= start and READY_LINE.search(line)), None)


def worker_seconds(sizes: Sequence[tuple[float, int]], start: float, end: float, initial: int) -> float:
    """The pool size integrated over ``[start, end]``."""
    total, size, since = 0.0, initial, start
    for at, new in sizes:
        if at <= start:
            size = new
            continue
        if at >= end:
            break
        total += size * (at - since)
        size, since = new, at
    return total + size * (end - since)


def wait_for(condition: object, timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():  # type: ignore[operator]
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out waiting for {what}")
        time.sleep(0.2)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.autoscale_real", description=__doc__.split("\n")[0])
    parser.add_argument("--max-workers", type=int, default=3)
    parser.add_argument("--requests", type=int, default=40)
    parser.add_argument("--rate", type=float, default=4.0, help="burst arrivals per second")
    parser.add_argument("--idle-s", type=float, default=10.0, help="idle time at zero before the burst")
    parser.add_argument("--zero-after-s", type=int, default=10)
    parser.add_argument("--runtime", choices=("pytorch", "tensorrtllm"), default="pytorch")
    args = parser.parse_args(argv)
    from openai import OpenAI, OpenAIError

    http_port = free_port()
    demo = [sys.executable, "-m", "trtfleet", "demo", "--http-port", str(http_port), "--grpc-port", str(free_port()),
            "--metrics-port", str(free_port()), "--prompt", PROMPT, "--workers", "1", "--autoscale",
            str(args.max_workers), "--autoscale-zero-after-s", str(args.zero_after_s), "--runtime", args.runtime]
    proc = subprocess.Popen(demo, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=dict(os.environ))
    log = DemoLog()
    def read() -> None:
        assert proc.stdout is not None
        for line in iter(proc.stdout.readline, ""):
            log.add(line)

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    try:
        wait_for(lambda: proc.poll() is not None or log.count("autoscaler ScaledToZero") >= 1, 420,
                 "the idle demo at zero workers")
        if proc.poll() is not None:
            raise RuntimeError("the demo exited:\n" + "".join(line for _t, line in log.snapshot()))
        client = OpenAI(base_url=f"http://127.0.0.1:{http_port}/v1", api_key="unused", max_retries=0, timeout=300)
        start = time.monotonic()
        time.sleep(args.idle_s)  # the trace's idle lead: arrivals follow the trace's clock
        burst = time.monotonic()

        def ask(index: int) -> tuple[float, float, str | None]:
            time.sleep(max(0.0, burst + index / args.rate - time.monotonic()))
            sent = time.monotonic()
            model = MODELS[index % len(MODELS)]
            try:
                client.completions.create(model=model, prompt=PROMPT, max_tokens=48, temperature=0)
            except OpenAIError as exc:  # any failure is a lost request, reported by kind
                return sent, time.monotonic() - sent, type(exc).__name__
            return sent, time.monotonic() - sent, None

        with ThreadPoolExecutor(max_workers=args.requests) as pool:
            results = list(pool.map(ask, range(args.requests)))
        wait_for(lambda: log.count("autoscaler ScaledToZero") >= 2, 300, "the fleet back at zero")
        end = time.monotonic()
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            proc.wait(60)
    reader.join(10)
    ready = log.first_ready_after(start) or end
    held = [latency for sent, latency, error in results if sent < ready and error is None]
    served = [latency for sent, latency, error in results if sent >= ready and error is None]
    lost = [error for _s, _l, error in results if error is not None]
    used = worker_seconds(log.pool_sizes(), start, end, 0)
    static = args.max_workers * (end - start)
    print(f"window {end - start:.1f} s (idle {args.idle_s:g} s, burst {args.requests} requests at {args.rate:g}/s, "
          f"idle until back at zero), runtime {args.runtime}, 0..{args.max_workers} workers")
    print(f"worker-seconds {used:.1f} vs static peak {static:.1f} ({used / static - 1:+.0%})")
    print(f"answered {len(results) - len(lost)}/{len(results)}, lost {len(lost)} {sorted(set(lost))}, "
          f"held {len(held)} (first worker ready {ready - burst:.1f} s after the burst began)")
    if held:
        print(f"held latency s: min {min(held):.2f} max {max(held):.2f}")
    if served:
        print(f"other latency s: median {sorted(served)[len(served) // 2]:.2f} max {max(served):.2f}")
    print("pool sizes (s after start, workers): "
          + ", ".join(f"{at - start:.1f}:{size}" for at, size in log.pool_sizes() if at >= start))
    return 1 if lost else 0


if __name__ == "__main__":
    raise SystemExit(main())
