"""TRT-LLM task ids: one per (Adapter, source), unique per BaseModel, never reused.

The counter is the BaseModel's ``status.nextTaskId``. :func:`allocate_task_id` reads it with the object's
``resourceVersion`` and writes ``next + 1`` with a JSON merge patch that carries the same
``resourceVersion``; the API server refuses the write with 409 Conflict if anybody changed the object
in between, and the loser re-reads and tries again. Correctness rests on that compare-and-swap alone,
so ids stay unique across operator restarts, replicas and concurrent reconciles. The per-BaseModel
lock in :class:`TaskIdAllocator` only keeps one process from racing itself (fewer conflicts).

An id is allocated *before* it is written to the Adapter's status; a crash in between burns that id
(ids may have gaps, never duplicates). ``floor`` (the largest id any Adapter status shows) protects
against a counter that went backwards, e.g. a status restored from an old backup.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Protocol

from trtfleet.api import Source
from trtfleet_operator.errors import ConflictError, TaskIdConflictError
from trtfleet_operator.names import digest

logger = logging.getLogger(__name__)

FIRST_TASK_ID = 1
MAX_CAS_ATTEMPTS = 100


def source_key(source: Source) -> str:
    """Digest of what identifies an adapter's content: its uri and revision (32 hex digits)."""
    return digest({"uri": source.uri, "revision": source.revision or ""}, 32)


def next_task_id(current: int | None, floor: int = 0) -> int:
    """The id to hand out when the counter reads ``current`` and ids up to ``floor`` are known taken."""
    return max(current or FIRST_TASK_ID, floor + 1)


class TaskIdStore(Protocol):
    """Where the counter lives (the BaseModel status); implemented over the API server in ``kube.py``."""

    async def read_next_task_id(self, namespace: str, basemodel: str) -> tuple[int | None, str]:
        """``(status.nextTaskId, metadata.resourceVersion)``; raises NotFoundError."""
        ...

    async def write_next_task_id(self, namespace: str, basemodel: str, resource_version: str, value: int) -> None:
        """Set ``status.nextTaskId`` if ``resource_version`` is current; else raise ConflictError."""
        ...


async def allocate_task_id(
    store: TaskIdStore,
    namespace: str,
    basemodel: str,
    *,
    floor: int = 0,
    max_attempts: int = MAX_CAS_ATTEMPTS,
    on_conflict: Callable[[], None] | None = None,
) -> int:
    """Take the next task id of ``basemodel`` with a compare-and-swap (see the module docstring)."""
    for _ in range(max_attempts):
        current, resource_version = await store.read_next_task_id(namespace, basemodel)
        task_id = next_task_id(current, floor)
        try:
            await store.write_next_task_id(namespace, basemodel, resource_version, task_id + 1)
        except ConflictError:
            if on_conflict is not None:
                on_conflict()
            await asyncio.sleep(0)
            continue
        logger.info("allocated task id", extra={"basemodel": f"{namespace}/{basemodel}", "task_id": task_id})
        return task_id
    raise TaskIdConflictError(
        f"status.nextTaskId of BaseModel {namespace}/{basemodel} changed {max_attempts} times in a row"
    )


class TaskIdAllocator:
    """:func:`allocate_task_id` with one in-process lock per BaseModel."""

    def __init__(
        self,
        store: TaskIdStore,
        *,
        on_allocated: Callable[[], None] | None = None,
        on_conflict: Callable[[], None] | None = None,
    ) -> None:
        self._store = store
        self._locks: dict[tuple[str, str], asyncio.Lock] = {}
        self._on_allocated = on_allocated
        self._on_conflict = on_conflict

    async def allocate(self, namespace: str, basemodel: str, *, floor: int = 0) -> int:
        lock = self._locks.setdefault((namespace, basemodel), asyncio.Lock())
        async with lock:
            task_id = await allocate_task_id(
                self._store, namespace, basemodel, floor=floor, on_conflict=self._on_conflict
            )
        if self._on_allocated is not None:
            self._on_allocated()
        return task_id
