"""The reference engine's pytorch mode as a real subprocess: ``python -m trtfleet_engines.reference.serve``."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import openai
from trtfleet_engines.reference.numpy_llama import SAMPLE_ADAPTERS_DIR
from trtfleet_engines.reference.server import free_port, http_status
from trtfleet_engines.reference.threads import one_blas_thread

from tests.integration.reference.triton_client import wait_until

STARTUP_TIMEOUT_S = 60.0


@dataclass(frozen=True)
class ServeProcess:
    url: str
    process: subprocess.Popen[bytes]
    log: Path

    def client(self) -> openai.OpenAI:
        return openai.OpenAI(base_url=self.url + "/v1", api_key="unused", max_retries=0, timeout=60)

    def get(self, path: str) -> httpx.Response:
        return httpx.get(self.url + path, timeout=30)

    def post(self, path: str, body: dict[str, Any]) -> httpx.Response:
        return httpx.post(self.url + path, json=body, timeout=60)

    def lora_cache(self) -> dict[str, Any]:
        found: dict[str, Any] = self.get("/reference/lora_cache").json()
        return found


def lora_request(name: str, task_id: int, adapter: str | None = None) -> dict[str, Any]:
    """``extra_body`` naming sample adapter ``adapter`` (default ``name``) under ``lora_int_id`` ``task_id``."""
    path = SAMPLE_ADAPTERS_DIR / (adapter or name)
    return {"lora_request": {"lora_name": name, "lora_int_id": task_id, "lora_path": str(path)}}


def _healthy(url: str, process: subprocess.Popen[bytes], log: Path) -> bool:
    if process.poll() is not None:
        raise AssertionError(f"the server exited with {process.returncode}:\n{log.read_text()[-3000:]}")
    try:
        return httpx.get(url + "/health", timeout=2).status_code == 200
    except httpx.HTTPError:
        return False


@contextmanager
def serving(tmp_dir: Path, args: Sequence[str] = (), *, clean_exit: bool = True) -> Iterator[ServeProcess]:
    """Start a server with ``args``, wait until ``/health`` answers 200, stop it after (and, with
    ``clean_exit``, check it stopped cleanly; a test that kills it passes False)."""
    port = free_port()
    log = tmp_dir / f"serve-{port}.log"
    env = one_blas_thread({**os.environ, "PYTHONUNBUFFERED": "1"})  # as the worker launchers do
    command = [sys.executable, "-m", "trtfleet_engines.reference.serve", "--host", "127.0.0.1", "--port", str(port),
               *args]
    with log.open("wb") as sink:
        process = subprocess.Popen(command, stdout=sink, stderr=subprocess.STDOUT, env=env)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_until(lambda: _healthy(url, process, log), timeout_s=STARTUP_TIMEOUT_S)
        yield ServeProcess(url, process, log)
    finally:
        process.terminate()
        try:
            process.wait(timeout=20)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(timeout=20)
    assert process.returncode == 0 or not clean_exit, log.read_text()[-3000:]


@contextmanager
def trtfleet_worker(
    tmp_dir: Path, args: Sequence[str], *, ready_path: str, port: int
) -> Iterator[subprocess.Popen[bytes]]:
    """``trtfleet worker ARGS`` until ``GET ready_path`` on ``port`` answers 200; SIGTERM after, a clean exit."""
    log = tmp_dir / f"worker-{port}.log"
    with log.open("wb") as sink:
        process = subprocess.Popen([sys.executable, "-m", "trtfleet", "worker", "--host", "127.0.0.1", *args],
                                   stdout=sink, stderr=subprocess.STDOUT,
                                   env=one_blas_thread({**os.environ, "PYTHONUNBUFFERED": "1"}))

    def up() -> bool:
        if process.poll() is not None:
            raise AssertionError(f"worker exited with {process.returncode}:\n{log.read_text()[-3000:]}")
        return http_status("127.0.0.1", port, ready_path) == 200

    try:
        wait_until(up, timeout_s=STARTUP_TIMEOUT_S)
        yield process
    finally:
        process.terminate()
        try:
            process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(timeout=30)
    assert process.returncode == 0, log.read_text()[-3000:]
