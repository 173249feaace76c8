"""One BLAS thread in every reference-engine process.

numpy's OpenBLAS starts a thread per CPU the process may use, and after each call its idle threads spin for a
while before they sleep. The reference model's products are small (a batch of at most a few rows against a tiny
Llama's matrices), so the threads buy little, and their spinning takes CPU from every other process on the host;
in a container on a large node each stub would start a thread per node CPU, whatever its CPU limit. On the
2-core bench machine six reference workers serving 2 interactive requests a second took 0.83-0.84 cores with two
threads and 0.16-0.18 with one, and 1.8 cores against 0.8 beside a batch of 45 lines a second (``python -m
bench.batch``, docs/benchmarks/batch.md). The spin was not free: a spinning thread takes its next call without
a wake-up, and with no batch the interactive p99 was 17-20 ms with two threads against 23 ms with one (runs of
different days' code, the rest of the path unchanged; not split further). A pod is sized by its pretend GPU
step, not by how fast the host multiplies, so the CPU goes first here.

OpenBLAS reads ``OPENBLAS_NUM_THREADS`` (and, when built with OpenMP, ``OMP_NUM_THREADS``) once, when numpy is
imported, so the variables go into the environment a worker process starts with: :func:`one_blas_thread` for
launchers (tritonserver and its Python-backend stubs, ``python -m trtfleet_engines.reference.serve``), and the
operator's reference pods carry them in their container env. A value already set is kept.
"""

from __future__ import annotations

from collections.abc import MutableMapping
from typing import Final, TypeVar

BLAS_THREADS_ENV: Final = {"OPENBLAS_NUM_THREADS": "1", "OMP_NUM_THREADS": "1"}
EnvT = TypeVar("EnvT", bound=MutableMapping[str, str])


def one_blas_thread(env: EnvT) -> EnvT:
    """``env`` with :data:`BLAS_THREADS_ENV` added where it sets none of them itself."""
    for name, value in BLAS_THREADS_ENV.items():
        env.setdefault(name, value)
    return env
