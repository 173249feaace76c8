"""Reference workers for tests, benchmarks and the demo: a repository in a temporary directory, free ports.

:func:`running_worker` / :func:`running_workers` build repositories in temporary directories, start workers
on free ports (retried should another process take one) and clean everything up on exit::

    with running_workers(3, lora_cache_host_bytes=lora_cache_bytes_for(2)) as workers:
        client = tritonclient.grpc.InferenceServerClient(workers[0].grpc_url)
"""

from __future__ import annotations

import contextlib
import shutil
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from trtfleet_engines.reference.server import READY_TIMEOUT_S, WorkerProcess, start_worker


def launch_reference_worker(
    *,
    host: str = "127.0.0.1",
    log_dir: Path | str | None = None,
    wait: bool = True,
    ready_timeout_s: float = READY_TIMEOUT_S,
    log_verbose: int = 0,
    **repository_options: Any,
) -> WorkerProcess:
    """Build a reference repository in a temporary dir and serve it on free ports (the caller stops it).

    ``repository_options`` go to :func:`~trtfleet_engines.reference.repository.build_reference_repository`
    (``spec``, ``model_dir``, ``lora_cache_host_bytes``, ``lora_cache_device_bytes``, ``max_batch_size``,
    ``max_queue_size``, ``min_step_ms``, ...). :meth:`WorkerProcess.stop` removes the repository too. A
    start that lost one of its ports to another process is retried on new ports (when waiting for ready).
    """
    from trtfleet_engines.reference.repository import build_reference_repository

    repo_root = Path(tempfile.mkdtemp(prefix="trtfleet-repo-"))
    try:
        repo = build_reference_repository(repo_root / "models", **repository_options)
        return start_worker(
            repo,
            host=host,
            log_dir=log_dir,
            wait=wait,
            ready_timeout_s=ready_timeout_s,
            log_verbose=log_verbose,
            extra_cleanup=[repo_root],
        )
    except BaseException:
        shutil.rmtree(repo_root, ignore_errors=True)
        raise


@contextlib.contextmanager
def running_worker(**options: Any) -> Iterator[WorkerProcess]:
    """One reference worker for the ``with`` block (options as for :func:`launch_reference_worker`)."""
    worker = launch_reference_worker(**options)
    try:
        yield worker
    finally:
        worker.stop()


@contextlib.contextmanager
def running_workers(count: int, **options: Any) -> Iterator[list[WorkerProcess]]:
    """``count`` reference workers started side by side (faster than one after another), all ready.

    Every worker gets the same options and its own ports, repository and temporary files.
    """
    ready_timeout_s = float(options.pop("ready_timeout_s", READY_TIMEOUT_S))
    workers: list[WorkerProcess] = []
    try:
        started = time.monotonic()
        for _ in range(count):
            workers.append(launch_reference_worker(wait=False, **options))
        for worker in workers:
            worker.wait_ready(max(1.0, ready_timeout_s - (time.monotonic() - started)))
            worker.startup_s = time.monotonic() - started
        yield workers
    finally:
        for worker in workers:
            worker.terminate()
        for worker in workers:
            worker.stop()
