"""Compiled load generators for the overhead benchmarks: ``wrk`` (HTTP/1.1) and ``ghz`` (gRPC).

A Python client on this 2-core machine spends more CPU per request than the router it measures and
competes with it for the cores, so its figures carry its own wakeups and scheduling. These two are
what proxy benchmarks usually use: ``wrk`` is the apt package of that name; ``ghz`` is built from the
Go module proxy into the checkout by ``make bench-tools`` (``go install
github.com/bojand/ghz/cmd/ghz@v0.120.0`` with ``GOBIN=.cache/bench/bin``). Both report latency
percentiles from full histograms and requests/s; the benchmarks run each side for a few seconds,
alternating direct and router, and keep the median over rounds.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import socket
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final
from urllib.parse import urlsplit

from google.protobuf import descriptor_pb2
from tritonclient.grpc import service_pb2

REPO: Final = Path(__file__).resolve().parent.parent
GHZ_BIN: Final = REPO / ".cache" / "bench" / "bin" / "ghz"
GRPC_SERVICE: Final = "inference.GRPCInferenceService"
_UNITS: Final = {"us": 1e-3, "ms": 1.0, "s": 1e3}
CLOCK_TICKS_PER_S: Final = os.sysconf("SC_CLK_TCK")


@dataclass(frozen=True)
class Run:
    """One load-generator run: latency percentiles over every request it made, and its rate."""

    p50_ms: float
    p99_ms: float
    rps: float
    requests: int


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def wait_port(port: int, timeout_s: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return
        except OSError:
            time.sleep(0.1)
    raise RuntimeError(f"nothing listens on port {port} after {timeout_s} s")


def cpu_s(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLOCK_TICKS_PER_S


def find_wrk() -> str | None:
    return shutil.which("wrk")


def find_ghz() -> str | None:
    return str(GHZ_BIN) if GHZ_BIN.is_file() else shutil.which("ghz")


def _wrk_duration(text: str) -> float:
    match = re.fullmatch(r"([\d.]+)(us|ms|s)", text)
    if match is None:
        raise ValueError(f"unexpected wrk latency {text!r}")
    return float(match.group(1)) * _UNITS[match.group(2)]


def parse_wrk(out: str) -> Run:
    """``wrk --latency`` output -> :class:`Run` (errors in the output raise)."""
    if "Non-2xx" in out or "Socket errors" in out:
        raise RuntimeError(f"wrk saw errors:\n{out}")
    percentiles = dict(re.findall(r"^\s+(\d+)%\s+(\S+)$", out, flags=re.MULTILINE))
    if "50" not in percentiles or "99" not in percentiles:
        raise RuntimeError(f"wrk reported no latency distribution:\n{out}")
    requests = int(re.search(r"(\d+) requests in", out).group(1))  # type: ignore[union-attr]
    return Run(
        _wrk_duration(percentiles["50"]),
        _wrk_duration(percentiles["99"]),
        float(out.split("Requests/sec:")[1].split()[0]),
        requests,
    )


def wrk_run(
    wrk: str, url: str, body: dict[str, Any], connections: int, duration_s: float, work: Path, timeout_s: int = 2
) -> Run:
    """``wrk`` POSTing ``body`` to ``url``; a request slower than ``timeout_s`` counts as an error (and raises)."""
    script = work / "post.lua"
    script.write_text(
        f'wrk.method = "POST"\nwrk.body = {json.dumps(json.dumps(body))}\n'
        'wrk.headers["Content-Type"] = "application/json"\n'
    )
    out = subprocess.run(
        [wrk, "-t1", f"-c{connections}", f"-d{max(1, round(duration_s))}s", f"--timeout={timeout_s}s", "--latency",
         "-s", str(script), url],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    return parse_wrk(out)


def percentile(values: list[float], q: float) -> float:
    """The ``q`` quantile (0..1, nearest rank) of ``values`` in seconds, in milliseconds."""
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] * 1000.0


class BlockingClient:
    """The least a Python client can do per request: one keep-alive connection, blocking ``sendall`` and
    ``recv`` (no event loop), a pre-encoded request, the answer read up to its Content-Length. A third
    view of the concurrency-1 latency next to wrk and the aiohttp client."""

    def __init__(self, url: str, body: dict[str, Any]) -> None:
        parts = urlsplit(url)
        self.sock = socket.create_connection((parts.hostname or "127.0.0.1", parts.port or 80), timeout=30)
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        payload = json.dumps(body).encode()
        self.request = (
            f"POST {parts.path} HTTP/1.1\r\nHost: {parts.netloc}\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(payload)}\r\n\r\n"
        ).encode() + payload

    def call(self) -> float:
        """One request; its time in seconds. A status other than 200 raises."""
        started = time.perf_counter()
        self.sock.sendall(self.request)
        data = b""
        while True:
            chunk = self.sock.recv(65536)
            if not chunk:
                raise ConnectionError("the server closed the connection")
            data += chunk
            head, sep, rest = data.partition(b"\r\n\r\n")
            if not sep:
                continue
            lines = head.split(b"\r\n")
            if lines[0].split(b" ", 2)[1] != b"200":
                raise RuntimeError(f"answer {lines[0]!r}")
            fields = (line.partition(b":") for line in lines[1:])
            length = next(int(value) for name, _, value in fields if name.lower() == b"content-length")
            if len(rest) >= length:
                return time.perf_counter() - started

    def close(self) -> None:
        self.sock.close()


def blocking_latency_pair(
    direct: tuple[str, dict[str, Any]], router: tuple[str, dict[str, Any]], requests: int, warmup: int = 200
) -> tuple[Run, Run]:
    """Concurrency-1 latency of both sides with :class:`BlockingClient`, interleaved request by request."""
    clients = BlockingClient(*direct), BlockingClient(*router)
    samples: tuple[list[float], list[float]] = ([], [])
    try:
        started = time.perf_counter()
        for index in range(warmup + requests):
            order = (0, 1) if index % 2 == 0 else (1, 0)
            for side in order:
                elapsed = clients[side].call()
                if index >= warmup:
                    samples[side].append(elapsed)
        wall = time.perf_counter() - started
    finally:
        for client in clients:
            client.close()

    def run(values: list[float]) -> Run:
        return Run(percentile(values, 0.5), percentile(values, 0.99), len(values) / wall, len(values))

    return run(samples[0]), run(samples[1])


def write_protoset(path: Path) -> Path:
    """The Triton gRPC service's descriptors (from tritonclient's generated modules) as a protoset for ghz."""
    files = descriptor_pb2.FileDescriptorSet()
    seen: set[str] = set()

    def add(descriptor: Any) -> None:
        if descriptor.name in seen:
            return
        for dependency in descriptor.dependencies:
            add(dependency)
        seen.add(descriptor.name)
        proto = descriptor_pb2.FileDescriptorProto()
        descriptor.CopyToProto(proto)
        files.file.append(proto)

    add(service_pb2.DESCRIPTOR)
    path.write_bytes(files.SerializeToString())
    return path


def parse_ghz(report: dict[str, Any]) -> Run:
    """ghz's JSON report -> :class:`Run`; any status other than OK raises."""
    statuses = report.get("statusCodeDistribution") or {}
    bad = {code: count for code, count in statuses.items() if code != "OK"}
    # ghz closes the streams still open when the duration ends: those few come back Canceled/Unavailable
    if sum(bad.values()) > max(1, report.get("options", {}).get("concurrency", 1)):
        raise RuntimeError(f"ghz saw errors: {statuses} {report.get('errorDistribution')}")
    percentiles = {int(row["percentage"]): row["latency"] / 1e6 for row in report["latencyDistribution"]}
    return Run(percentiles[50], percentiles[99], float(report["rps"]), int(report["count"]))


def ghz_run(
    ghz: str,
    target: str,
    method: str,
    message: bytes,
    concurrency: int,
    duration_s: float,
    work: Path,
) -> Run:
    """``method`` of the Triton service on ``target`` with one binary ``message`` per call (for
    ModelStreamInfer: one request per stream, then half-close), ``concurrency`` calls at a time on one
    connection, for ``duration_s``."""
    protoset = work / "triton.protoset"
    if not protoset.exists():
        write_protoset(protoset)
    payload = work / f"ghz-{method}-{abs(hash(message))}.bin"
    payload.write_bytes(message)
    out = subprocess.run(
        [
            ghz, "--insecure", "--protoset", str(protoset), "--call", f"{GRPC_SERVICE}/{method}",
            "--binary-file", str(payload), "-c", str(concurrency), "-z", f"{duration_s}s", "-O", "json", target,
        ],  # fmt: skip
        capture_output=True,
        text=True,
        check=False,
    )
    if not out.stdout.strip():
        raise RuntimeError(f"ghz failed ({out.returncode}): {out.stderr}")
    return parse_ghz(json.loads(out.stdout))
