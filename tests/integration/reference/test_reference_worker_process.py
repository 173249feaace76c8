"""The reference worker's queue limit, and ``trtfleet worker`` as a foreground process."""

from __future__ import annotations

import os
import signal
import socket
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import httpx
import pytest
from trtfleet_engines.reference.repository import lora_cache_bytes_for
from trtfleet_engines.reference.server import free_port, http_status
from trtfleet_engines.reference.tokenizer import prompt_ids
from trtfleet_engines.reference.workers import running_worker, running_workers

from tests.integration.reference.triton_client import (
    NEVER_END_ID,
    Stream,
    generate,
    request_inputs,
    wait_until,
)

pytestmark = pytest.mark.integration


def _waiting(metrics_url: str) -> int:
    for line in httpx.get(metrics_url).text.splitlines():
        if line.startswith('nv_trt_llm_request_metrics{model="tensorrt_llm",request_type="waiting"'):
            return int(float(line.rsplit(" ", 1)[1]))
    return -1


QUEUE_TEST_STEP_MS = 400.0
"""Pretend step time of the queue test: its running request of ``HELD_TOKENS`` lasts ~100 s unless stopped
(the test stops it after a few metric polls; the waiting request then needs 4 steps, 1.6 s)."""
HELD_TOKENS = 250
"""Nearly the tiny model's 256 positions: the longest a request can run."""


def test_queue_full_has_the_executor_text() -> None:
    """One running, one waiting, a third refused; the running request is held until the test stops it.

    The running request cannot end on its own before ~100 s (250 steps of >= 400 ms), far longer than the
    few metric polls and one refused request the test does; it is then ended with TRT-LLM's ``stop``
    request rather than waited for. The "ended too early" assert makes a too-slow machine fail loudly.
    """
    with running_worker(max_batch_size=1, max_queue_size=1, min_step_ms=QUEUE_TEST_STEP_MS) as worker:
        with Stream(worker.grpc_url) as running, Stream(worker.grpc_url) as waiting:
            running.send(request_inputs(prompt_ids("abc"), HELD_TOKENS, streaming=True, end_id=NEVER_END_ID), "held")
            running.wait_first_token()
            waiting.send(request_inputs(prompt_ids("abc"), 4))
            wait_until(lambda: _waiting(worker.metrics_url) == 1)
            refused = generate(worker.grpc_url, prompt_ids("abc"), 4)
            assert running.result.final_at is None, "the running request ended too early for this test"
            assert refused.error == "Maximum queue size of 1 has been reached, please try again later"
            assert generate(worker.grpc_url, [0], 1, stop=True, request_id="held").error is None  # release it
            held = running.wait()
            assert held.error is None and 0 < len(held.tokens) < HELD_TOKENS
            assert waiting.wait().error is None


def test_cli_worker_serves_and_exits_cleanly_on_sigterm(tmp_path: Path) -> None:
    private_tmp = tmp_path / "tmp"  # the worker's TMPDIR: whatever it creates must be gone afterwards
    private_tmp.mkdir()
    ports = [free_port() for _ in range(3)]
    command = [
        sys.executable,
        "-m",
        "trtfleet",
        "worker",
        "--host",
        "127.0.0.1",
        "--http-port",
        str(ports[0]),
        "--grpc-port",
        str(ports[1]),
        "--metrics-port",
        str(ports[2]),
        "--lora-host-bytes",
        "200000",
    ]
    env = {**os.environ, "TMPDIR": str(private_tmp)}
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env)
    try:
        wait_until(
            lambda: process.poll() is not None or http_status("127.0.0.1", ports[0], "/v2/health/ready") == 200,
            timeout_s=60,
        )
        assert process.poll() is None, process.communicate()[0].decode(errors="replace")[-3000:]
        assert any(private_tmp.iterdir())  # it does work in TMPDIR
        assert generate(f"127.0.0.1:{ports[1]}", prompt_ids("abc"), 8).error is None
        process.send_signal(signal.SIGTERM)
        output, _ = process.communicate(timeout=30)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    assert process.returncode == 0, output.decode(errors="replace")[-3000:]
    assert b"Started GRPCInferenceService" in output  # tritonserver's log goes to the worker's stdout
    assert list(private_tmp.iterdir()) == []


def test_several_workers_start_side_by_side_and_clean_up() -> None:
    with running_workers(2, lora_cache_host_bytes=lora_cache_bytes_for(2)) as workers:
        assert len({w.grpc_port for w in workers} | {w.http_port for w in workers}) == 4
        for worker in workers:
            assert generate(worker.grpc_url, prompt_ids("abc"), 8).error is None
    for worker in workers:
        assert not worker.running() and worker.process.returncode == 0 and worker.stubs_reaped == 0
        assert not worker.repo_dir.exists() and not worker.log_path.exists()


def test_latency_figures() -> None:
    """Prints the worker's figures (run with -s); the bounds only catch gross regressions."""
    with running_worker() as worker, httpx.Client(timeout=30) as http:
        prompt = prompt_ids("hello world")
        generate(worker.grpc_url, prompt, 4)  # warm up

        def p50_ms(call: Callable[[], object], n: int = 20) -> float:
            samples = []
            for _ in range(n):
                started = time.perf_counter()
                call()
                samples.append(time.perf_counter() - started)
            return statistics.median(samples) * 1e3

        grpc_16 = p50_ms(lambda: generate(worker.grpc_url, prompt, 16, end_id=NEVER_END_ID))
        first = p50_ms(lambda: generate(worker.grpc_url, prompt, 1, end_id=NEVER_END_ID))
        body = {"text_input": "hello world", "max_tokens": 16}
        base = f"http://{worker.http_url}/v2/models"
        ensemble = p50_ms(lambda: http.post(f"{base}/ensemble/generate", json=body).raise_for_status())
        bls = p50_ms(lambda: http.post(f"{base}/tensorrt_llm_bls/generate", json=body).raise_for_status())
        print(
            f"\nstartup-to-ready {worker.startup_s:.2f} s; p50: gRPC 16 tokens {grpc_16:.1f} ms, gRPC 1 token "
            f"{first:.1f} ms, HTTP generate ensemble {ensemble:.1f} ms, BLS {bls:.1f} ms (11 tokens + <eos>)"
        )
        assert grpc_16 < 1000 and ensemble < 1000 and bls < 1000


@pytest.mark.parametrize("how", ["running_worker", "start_worker_no_wait"])
def test_a_port_lost_to_another_process_is_retried(monkeypatch: pytest.MonkeyPatch, tmp_path: Path, how: str) -> None:
    """Both ways workers start (one waits in start_worker, parallel starts wait later) retry on new ports."""
    import trtfleet_engines.reference.server as server
    from trtfleet_engines.reference.repository import build_reference_repository

    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        taken = busy.getsockname()[1]
        ports = iter([taken])  # the first port handed out (HTTP) is already taken

        def racing_free_port(host: str = "127.0.0.1") -> int:
            return next(ports, None) or free_port(host)

        monkeypatch.setattr(server, "free_port", racing_free_port)
        if how == "running_worker":
            context = running_worker()
        else:  # what tests/integration/router/support.py and bench/realfleet.py do
            started = server.start_worker(build_reference_repository(tmp_path / "models"), wait=False)
            assert started.http_port == taken
            started.wait_ready()
            context = started  # type: ignore[assignment]
        with context as worker:
            assert worker.http_port != taken
            assert generate(worker.grpc_url, prompt_ids("abc"), 4).error is None
    assert worker.stubs_reaped == 0 and worker.process.returncode == 0


def test_a_worker_whose_stub_died_is_not_ready_until_it_restarted() -> None:
    """kill -9 of the BLS stub: Triton 2.51 alone would stay ready; the watchdog restarts tritonserver."""
    from trtfleet_engines.reference.stubs import stub_pids

    with running_worker() as worker, httpx.Client(timeout=30) as http:
        assert worker.backends_dir is not None

        def ready() -> bool:
            return http_status(worker.client_host, worker.http_port, "/v2/health/ready") == 200

        bls = [pid for pid, name in stub_pids(worker.backends_dir).items() if name.startswith("tensorrt_llm_bls")]
        assert len(bls) == 1
        os.kill(bls[0], signal.SIGKILL)
        wait_until(lambda: not ready(), timeout_s=30, interval_s=0.01)
        wait_until(ready, timeout_s=90)
        assert worker.restarts == 1
        assert worker.watchdog is not None
        assert [(d.pid, d.signal) for d in worker.watchdog.deaths] == [(bls[0], signal.SIGKILL)]
        url = f"http://{worker.http_url}/v2/models/tensorrt_llm_bls/generate"
        reply = http.post(url, json={"text_input": "abc", "max_tokens": 8})
        assert reply.status_code == 200 and reply.json()["text_output"] == "abc", reply.text
    assert worker.process.returncode == 0 and worker.stubs_reaped == 0
    current = [s for s in worker.stubs_at_stop if s.started_at_s >= worker.started_at_s]
    assert len(current) == 4 and all(s.clean for s in current), [s.describe() for s in current]


def test_cli_worker_exits_with_failure_when_a_stub_dies(tmp_path: Path) -> None:
    """Under ``trtfleet worker`` (a container) a dead stub stops the worker: the kubelet restarts it."""
    ports = [free_port() for _ in range(3)]
    flags = ["--http-port", str(ports[0]), "--grpc-port", str(ports[1]), "--metrics-port", str(ports[2])]
    command = [sys.executable, "-m", "trtfleet", "worker", "--host", "127.0.0.1", *flags]
    env = {**os.environ, "TMPDIR": str(tmp_path)}
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env)
    try:
        wait_until(
            lambda: process.poll() is not None or http_status("127.0.0.1", ports[0], "/v2/health/ready") == 200,
            timeout_s=60,
        )
        assert process.poll() is None
        stubs = [p for p in Path("/proc").iterdir() if p.name.isdigit() and _is_bls_stub_of(p, tmp_path)]
        assert len(stubs) == 1
        os.kill(int(stubs[0].name), signal.SIGKILL)
        output, _ = process.communicate(timeout=60)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    text = output.decode(errors="replace")
    assert process.returncode == 1, text[-3000:]
    assert f"stub pid={stubs[0].name} (tensorrt_llm_bls_0_0): killed by SIGKILL" in text


def _is_bls_stub_of(proc: Path, tmp_dir: Path) -> bool:
    try:
        argv = (proc / "cmdline").read_bytes().split(b"\0")
    except OSError:
        return False
    return argv[0].startswith(str(tmp_dir).encode()) and argv[0].endswith(b".real") and b"tensorrt_llm_bls" in argv[1]
