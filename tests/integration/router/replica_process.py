"""Real ``trtfleet router`` replicas for the integration tests: a process per replica on loopback ports, its
internal endpoints (peer port, ``/debug/fleets``) read with the replicas' bearer token, as the chart runs them."""

from __future__ import annotations

import contextlib
import json
import re
import secrets
import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

import openai

TRTFLEET = str(Path(sys.executable).parent / "trtfleet")
GRACE_S = 1.0


def new_token_file(path: Path) -> Path:
    """A token file as the chart's Secret holds it: one random token."""
    path.write_text(secrets.token_urlsafe(32) + "\n")
    return path


def get(url: str, token: str | None, timeout_s: float = 5.0) -> tuple[int, bytes]:
    """``GET url`` with ``Authorization: Bearer <token>`` (none when ``token`` is None): (status, body)."""
    headers = {} if token is None else {"Authorization": f"Bearer {token}"}
    try:
        with urllib.request.urlopen(urllib.request.Request(url, headers=headers), timeout=timeout_s) as response:
            return int(response.status), bytes(response.read())
    except urllib.error.HTTPError as error:
        return int(error.code), bytes(error.read())


def open_stream(url: str, token: str | None, timeout_s: float = 5.0) -> tuple[int, bytes]:
    """``GET url`` of a long-lived stream: (status, its first line or the error body), then closed."""
    headers = {} if token is None else {"Authorization": f"Bearer {token}"}
    try:
        with urllib.request.urlopen(urllib.request.Request(url, headers=headers), timeout=timeout_s) as response:
            return int(response.status), bytes(response.readline())
    except urllib.error.HTTPError as error:
        return int(error.code), bytes(error.read())


class RouterProcess:
    """One ``trtfleet router`` process; its ports come from its ``router started`` log line. ``token_file``: the
    replicas' shared ``--internal-token-file`` (its first token is what this object's reads send)."""

    def __init__(
        self,
        fleet_file: Path,
        log_file: Path,
        peers: tuple[str, ...] = (),
        log_level: str = "INFO",
        extra: tuple[str, ...] = (),
        token_file: Path | None = None,
        debug: bool = True,
    ) -> None:
        command = [
            TRTFLEET, "router", "--fleet-config", str(fleet_file), "--host", "127.0.0.1",
            "--http-port", "0", "--grpc-port", "-1", "--metrics-port", "0", "--peer-port", "0",
            "--peer-grace-s", str(GRACE_S), "--prewarm-interval-s", "3600", "--log-level", log_level,
            *(["--debug-endpoints"] if debug else []),
        ]  # fmt: skip
        if token_file is not None:
            command += ["--internal-token-file", str(token_file)]
        for url in peers:
            command += ["--peer", url]
        command += extra
        self.token_file = token_file
        self.log_file = log_file
        self.process = subprocess.Popen(command, stderr=subprocess.PIPE, stdin=subprocess.DEVNULL)
        self.ports = self._started()

    def _started(self) -> dict[str, int]:
        assert self.process.stderr is not None
        stderr = self.process.stderr
        log = self.log_file.open("w")
        for raw in stderr:
            line = raw.decode()
            log.write(line)
            log.flush()
            if line.startswith("{") and json.loads(line).get("msg") == "router started":
                started = json.loads(line)

                def copy() -> None:
                    for rest in stderr:
                        log.write(rest.decode())
                        log.flush()

                threading.Thread(target=copy, daemon=True).start()
                return {name: int(started[f"{name}_port"]) for name in ("http", "metrics", "peer")}
        log.close()
        raise AssertionError(f"the router exited without starting: {self.log_file.read_text()[-2000:]}")

    @property
    def token(self) -> str | None:
        """The token this replica sends now (the first line of its file)."""
        if self.token_file is None:
            return None
        return self.token_file.read_text().split()[0]

    @property
    def peer_url(self) -> str:
        return f"http://127.0.0.1:{self.ports['peer']}"

    def client(self) -> openai.OpenAI:
        return openai.OpenAI(base_url=f"http://127.0.0.1:{self.ports['http']}/v1", api_key="x", max_retries=0)

    def internal(self, path: str, base: str | None = None) -> Any:
        """The JSON of an internal endpoint (``base``: the peer URL by default), read with this replica's token."""
        status, body = get((base or self.peer_url) + path, self.token)
        assert status == 200, (path, status, body[:200])
        return json.loads(body)

    def snapshot(self) -> dict[str, Any]:
        body: dict[str, Any] = self.internal("/fleet/v1/snapshot")
        return body

    def demand(self) -> dict[str, Any]:
        body: dict[str, Any] = self.internal("/fleet/v1/demand")
        return body

    def fleets_debug(self) -> dict[str, Any]:
        body: dict[str, Any] = self.internal("/debug/fleets", f"http://127.0.0.1:{self.ports['metrics']}")
        return body

    def kv_blocks_held(self) -> dict[str, int]:
        """Pod -> KV-cache blocks this replica's prefix index believes the pod holds."""
        return {pod["pod_id"]: int(pod["kv_blocks_held"]) for pod in self.pods()}

    def pods(self) -> list[dict[str, Any]]:
        """This replica's view of the base model's pods (``/debug/fleets``)."""
        pods: list[dict[str, Any]] = self.fleets_debug()["tiny"]["pods"]
        return pods

    def settled(self) -> bool:
        """No request of any replica in flight in this replica's view."""
        return all(pod["inflight"] == 0 for pod in self.pods())

    def counter(self, name: str) -> float:
        """Sum of ``trtfleet_router_<name>_total`` over its labels."""
        url = f"http://127.0.0.1:{self.ports['metrics']}/metrics"
        with urllib.request.urlopen(url, timeout=5) as response:
            text = response.read().decode()
        pattern = re.compile(rf"^trtfleet_router_{name}_total(\{{[^}}]*\}})? (\S+)$", re.MULTILINE)
        return sum(float(value) for _, value in pattern.findall(text))

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()


def wait_for(condition: Callable[[], bool], what: str, timeout_s: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting until {what}"
        time.sleep(0.05)


def logged(router: RouterProcess, msg: str) -> list[dict[str, Any]]:
    """The lines of the router's log with this message."""
    found = []
    for raw in router.log_file.read_text().splitlines():
        with contextlib.suppress(ValueError):  # the last line may still be half written
            line = json.loads(raw)
            if line.get("msg") == msg:
                found.append(line)
    return found
