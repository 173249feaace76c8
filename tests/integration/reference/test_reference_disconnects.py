"""Clients that go away: the BLS model stops the engine request, frees it, and the worker still stops cleanly.

A client that closes its stream (gRPC) or connection (HTTP) makes Triton cancel its request; the BLS model
then sends TRT-LLM's ``stop`` request for its ``tensorrt_llm`` request. Engine steps are read from the
``iteration_counter`` metric, which the engine reports when it becomes idle.
"""

from __future__ import annotations

import re
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest
from trtfleet_engines.reference.repository import lora_cache_bytes_for
from trtfleet_engines.reference.server import WorkerProcess
from trtfleet_engines.reference.stubs import stub_pids
from trtfleet_engines.reference.triton_binary import EXIT_TIMEOUT_S
from trtfleet_engines.reference.workers import running_worker

from tests.integration.reference.tiny import new_task_id, sample_adapters
from tests.integration.reference.triton_client import NEVER_END_ID, BlsStream, wait_until

pytestmark = pytest.mark.integration

STEP_MS = 25.0
"""Pretend step time: a 64-token request that nobody stops runs 64 steps, ~1.6 s."""
TOKENS = 64
STEPS_AFTER_FIRST_CHUNK = 8
"""Engine steps allowed for an abandoned request in all: the first chunk, the cancellation's way through
Triton to the BLS model (it checks after every token), one step in flight when the stop arrives."""
LEAK_WARMUP = 50
LEAK_STREAMS = 200
LEAK_BYTES_PER_STREAM = 20_000
"""Before the fix each abandoned stream kept ~200 KB in the BLS stub and ~100 KB in tritonserver."""


@pytest.fixture(scope="module")
def worker() -> Iterator[WorkerProcess]:
    with running_worker(min_step_ms=STEP_MS, lora_cache_host_bytes=lora_cache_bytes_for(3)) as w:
        yield w
    assert w.process.returncode == 0 and w.stubs_reaped == 0
    assert all(stub.clean for stub in w.stubs_at_stop), [s.describe() for s in w.stubs_at_stop]


def _metric(worker: WorkerProcess, family: str, label: str) -> float:
    text = httpx.get(worker.metrics_url).text
    match = re.search(rf"^{family}{{[^}}]*{label}[^}}]*}} ([0-9.e+-]+)$", text, re.MULTILINE)
    assert match, f"{family} {label} not in /metrics"
    return float(match.group(1))


def _idle(worker: WorkerProcess) -> bool:
    return all(
        _metric(worker, "nv_trt_llm_request_metrics", f'request_type="{kind}"') == 0 for kind in ("active", "waiting")
    )


def _steps(worker: WorkerProcess) -> int:
    wait_until(lambda: _idle(worker))
    return int(_metric(worker, "nv_trt_llm_general_metrics", 'general_type="iteration_counter"'))


def _abandon_grpc(worker: WorkerProcess, text: str = "hello world", **options: object) -> None:
    with BlsStream(worker.grpc_url) as stream:
        stream.send(text, TOKENS, end_id=NEVER_END_ID, **options)
        assert stream.next_chunk(), stream.error
    # leaving the block cancels the stream before its final response


def _abandon_http(worker: WorkerProcess) -> None:
    body = {"text_input": "hello world", "max_tokens": TOKENS, "end_id": NEVER_END_ID, "stream": True}
    url = f"http://{worker.http_url}/v2/models/tensorrt_llm_bls/generate_stream"
    with httpx.Client(timeout=30) as client, client.stream("POST", url, json=body) as reply:
        assert reply.status_code == 200
        assert any(line.startswith("data: ") for line in reply.iter_lines())  # the first chunk, then hang up


@pytest.mark.parametrize("abandon", [_abandon_grpc, _abandon_http], ids=["grpc", "http"])
def test_an_abandoned_stream_stops_its_engine_request(worker: WorkerProcess, abandon: object) -> None:
    before = _steps(worker)
    abandon(worker)  # type: ignore[operator]
    steps = _steps(worker) - before
    print(f"\nengine steps of a {TOKENS}-token request abandoned after its first chunk: {steps}")
    assert 1 <= steps <= STEPS_AFTER_FIRST_CHUNK


def _rss_bytes(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise AssertionError(f"no VmRSS for pid {pid}")


def test_abandoned_streams_do_not_leak(worker: WorkerProcess) -> None:
    assert worker.backends_dir is not None
    bls = next(pid for pid, name in stub_pids(worker.backends_dir).items() if name.startswith("tensorrt_llm_bls"))

    def abandon_many(count: int) -> None:
        with ThreadPoolExecutor(4) as pool:
            list(pool.map(lambda _: _abandon_grpc(worker), range(count)))
        wait_until(lambda: _idle(worker))

    abandon_many(LEAK_WARMUP)  # allocator pools and caches reach their working size
    bls_before, server_before = _rss_bytes(bls), _rss_bytes(worker.pid)
    abandon_many(LEAK_STREAMS)
    bls_growth, server_growth = _rss_bytes(bls) - bls_before, _rss_bytes(worker.pid) - server_before
    print(
        f"\nRSS growth over {LEAK_STREAMS} abandoned streams: BLS stub {bls_growth / 1e3:.0f} KB, "
        f"tritonserver {server_growth / 1e3:.0f} KB"
    )
    assert bls_growth < LEAK_STREAMS * LEAK_BYTES_PER_STREAM
    assert server_growth < LEAK_STREAMS * LEAK_BYTES_PER_STREAM


def test_stop_after_streamed_adapter_traffic_is_clean() -> None:
    """Streams with adapters, finished and abandoned, then SIGTERM: every model unloads in time, every stub
    exits with status 0 (the recorder saw each one's wait status)."""
    adapters = sample_adapters()
    with running_worker(min_step_ms=2.0, lora_cache_host_bytes=lora_cache_bytes_for(3)) as worker:
        tasks = {name: new_task_id() for name in adapters}

        def one(index: int) -> None:
            name = list(adapters)[index % len(adapters)]
            with BlsStream(worker.grpc_url) as stream:
                if index % 3 == 0:  # abandoned after its first chunk, long before it could end (no race)
                    stream.send("hello world", 200, task_id=tasks[name], adapter=adapters[name], end_id=NEVER_END_ID)
                    assert stream.next_chunk(), stream.error
                else:
                    stream.send("hello world", 24, task_id=tasks[name], adapter=adapters[name])
                    assert stream.text() and stream.error is None, stream.error

        with ThreadPoolExecutor(6) as pool:
            list(pool.map(one, range(30)))
        wait_until(lambda: _idle(worker))
        stubs = stub_pids(worker.backends_dir) if worker.backends_dir else {}
        assert len(stubs) == 4, stubs
        started = time.monotonic()
        worker.stop()
        print(f"\nstop took {time.monotonic() - started:.2f} s (exit timeout {EXIT_TIMEOUT_S} s)")
    assert worker.process.returncode == 0, "a model did not unload within the exit timeout"
    assert worker.stubs_reaped == 0
    assert {s.pid for s in worker.stubs_at_stop} >= set(stubs)
    assert all(stub.clean for stub in worker.stubs_at_stop), [s.describe() for s in worker.stubs_at_stop]
