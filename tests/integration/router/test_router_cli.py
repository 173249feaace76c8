"""``trtfleet router`` as a process: flags, readiness, and a graceful drain on SIGTERM (an in-flight
stream finishes, new requests are refused, the process exits 0)."""

from __future__ import annotations

import json
import re
import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

import openai
import pytest

from tests.unit.router.harness import write_artifact

pytestmark = pytest.mark.integration


def _wait_ready(url: str, process: subprocess.Popen[bytes], timeout_s: float = 60.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        assert process.poll() is None, "the process exited"
        try:
            with urllib.request.urlopen(url, timeout=1) as response:
                if response.status == 200:
                    return
        except (OSError, urllib.error.HTTPError):
            time.sleep(0.1)
    raise AssertionError(f"{url} never became ready")


def _echo_ports(echo: subprocess.Popen[bytes]) -> tuple[int, int]:
    """The gRPC and HTTP ports the echo upstream bound (it was given 0: no port picked ahead and raced)."""
    assert echo.stdout is not None
    line = echo.stdout.readline().decode()
    found = re.search(r":(\d+) \(http (\d+)\)", line)
    assert found, f"the echo upstream did not say its ports: {line!r}"
    return int(found.group(1)), int(found.group(2))


def _router_port(router: subprocess.Popen[bytes], logs: list[str]) -> int:
    """The HTTP port from the router's ``router started`` log line; its later lines go to ``logs``."""
    assert router.stderr is not None
    stderr = router.stderr
    for raw in stderr:
        line = raw.decode()
        logs.append(line)
        if line.startswith("{") and json.loads(line).get("msg") == "router started":
            threading.Thread(target=lambda: logs.extend(r.decode() for r in stderr), daemon=True).start()
            return int(json.loads(line)["http_port"])
    raise AssertionError(f"the router exited without starting: {''.join(logs)[-2000:]}")


def _start(tmp_path: Path, log_level: str) -> tuple[subprocess.Popen[bytes], int, subprocess.Popen[bytes]]:
    """An echo upstream (2 characters a chunk, 50 ms apart), its HTTP port, and a router in front of it
    serving ``a1``."""
    write_artifact(tmp_path / "a1")
    echo = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "trtfleet_router.testing.echo",
            "--port",
            "0",
            "--http-port",
            "0",
            "--chunk-chars",
            "2",
            "--chunk-delay-s",
            "0.05",
        ],
        stdout=subprocess.PIPE,
    )
    grpc_port, echo_http = _echo_ports(echo)
    router = subprocess.Popen(
        [
            str(Path(sys.executable).parent / "trtfleet"),
            "router",
            "--host",
            "127.0.0.1",
            "--backend",
            f"127.0.0.1:{grpc_port}",
            "--base-model",
            "tiny",
            "--architecture",
            "reference",
            "--max-input-len",
            "256",
            "--max-seq-len",
            "512",
            "--adapter",
            f"a1=7:{tmp_path / 'a1'}",
            "--http-port",
            "0",
            "--grpc-port",
            "-1",
            "--metrics-port",
            "-1",
            "--peer-port",
            "0",  # any free port: 8082 may be taken by another router on this machine
            "--drain-timeout-s",
            "20",
            "--log-level",
            log_level,
        ],
        stderr=subprocess.PIPE,
    )
    return echo, echo_http, router


def test_cli_serves_and_drains_on_sigterm(tmp_path: Path) -> None:
    echo, echo_http, router = _start(tmp_path, "INFO")
    logs: list[str] = []
    try:
        http_port = _router_port(router, logs)
        _wait_ready(f"http://127.0.0.1:{echo_http}/v2/health/ready", echo)
        _wait_ready(f"http://127.0.0.1:{http_port}/v2/health/ready", router)
        client = openai.OpenAI(base_url=f"http://127.0.0.1:{http_port}/v1", api_key="x", max_retries=0)
        assert client.completions.create(model="a1", prompt="up", max_tokens=20).choices[0].text == "[7] up"
        # a slow client keeps a stream open while SIGTERM arrives: it still gets the whole answer
        stream = client.completions.create(model="a1", prompt="draining " * 8, max_tokens=200, stream=True)
        pieces = iter(stream)
        received = [next(pieces).choices[0].text]
        router.send_signal(signal.SIGTERM)  # the stream has about 1.8 s to go
        readiness = urllib.request.Request(f"http://127.0.0.1:{http_port}/v2/health/ready")
        deadline = time.monotonic() + 10
        while True:  # until the router says it is draining (no fixed sleep)
            try:
                urllib.request.urlopen(readiness, timeout=2)
            except (urllib.error.HTTPError, OSError):
                break
            assert time.monotonic() < deadline, "the router never stopped being ready after SIGTERM"
            time.sleep(0.01)
        with pytest.raises((openai.APIStatusError, openai.APIConnectionError)):
            client.completions.create(model="a1", prompt="late", max_tokens=5)
        for chunk in pieces:
            received.append(chunk.choices[0].text)
        assert "".join(received) == "[7] " + "draining " * 8
        assert len(received) > 10  # it really was streaming while the router drained
        assert router.wait(timeout=30) == 0
        assert all(json.loads(line) for line in logs if line.startswith("{"))  # JSON log lines
    finally:
        for process in (router, echo):
            if process.poll() is None:
                process.send_signal(signal.SIGTERM)
                try:
                    process.wait(timeout=15)
                except subprocess.TimeoutExpired:
                    process.kill()


def test_cli_debug_level_logs_where_each_request_spent_its_time(tmp_path: Path) -> None:
    """At debug level every answered attempt logs ``upstream done`` with its decision wait, its time to the
    pod's first answer and the pod's load (the dispatcher measures these only at that level)."""
    echo, echo_http, router = _start(tmp_path, "DEBUG")
    logs: list[str] = []
    try:
        http_port = _router_port(router, logs)
        _wait_ready(f"http://127.0.0.1:{echo_http}/v2/health/ready", echo)
        client = openai.OpenAI(base_url=f"http://127.0.0.1:{http_port}/v1", api_key="x", max_retries=0)
        assert client.completions.create(model="a1", prompt="up", max_tokens=20).choices[0].text == "[7] up"
        router.send_signal(signal.SIGTERM)
        assert router.wait(timeout=30) == 0
    finally:
        for process in (router, echo):
            if process.poll() is None:
                process.kill()
                process.wait(timeout=15)
    done = [json.loads(line) for line in logs if line.startswith("{") and '"upstream done"' in line]
    assert len(done) == 1, logs
    line = done[0]
    assert (line["adapter"], line["priority"], line["attempts"], line["pod_load"]) == ("a1", "interactive", 1, 1)
    assert line["send_weights"] is True  # the first request for a1 carried its weights
    assert line["decided_ms"] >= 0
    assert line["first_answer_ms"] > 0  # measured (None when the pod never answered)
