"""One BLAS thread in every reference-engine process.

numpy's OpenBLAS starts a thread per CPU the process may use (in a container: per node CPU, whatever its CPU
limit), and its idle threads spin after each call. The reference model's products are tiny, so extra threads buy
little and their spinning takes CPU from every other process on the host; a pod here is sized by its pretend GPU
step, not by how fast the host multiplies (what it costs and saves: docs/benchmarks/batch.md).

OpenBLAS reads ``OPENBLAS_NUM_THREADS`` (and, when built with OpenMP, ``OMP_NUM_THREADS``) once, when numpy is
imported, so the variables go into the environment a worker process starts with: :func:`one_blas_thread` for
launchers, and the operator's reference pods carry them in their container env. A value already set is kept.
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
