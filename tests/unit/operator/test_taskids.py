"""Task-id allocation: compare-and-swap on a counter with resourceVersions, under contention."""

from __future__ import annotations

import asyncio
import random

import pytest
from trtfleet_operator.errors import ConflictError, NotFoundError, TaskIdConflictError
from trtfleet_operator.taskids import TaskIdAllocator, allocate_task_id, next_task_id, source_key

from trtfleet.api import Source


class CasStore:
    """:class:`TaskIdStore` with the API server's semantics: every write bumps the resourceVersion, a
    write naming an old one is refused. ``rng`` interleaves concurrent callers between read and write."""

    def __init__(self, rng: random.Random, start: int | None = None) -> None:
        self.value, self.version, self.rng = start, 1, rng
        self.conflicts = 0

    async def read_next_task_id(self, namespace: str, basemodel: str) -> tuple[int | None, str]:
        if basemodel != "llama":
            raise NotFoundError(404, "NotFound", basemodel)
        await asyncio.sleep(0) if self.rng.random() < 0.5 else None
        return self.value, str(self.version)

    async def write_next_task_id(self, namespace: str, basemodel: str, resource_version: str, value: int) -> None:
        for _ in range(self.rng.randrange(3)):
            await asyncio.sleep(0)
        if resource_version != str(self.version):
            self.conflicts += 1
            raise ConflictError(409, "Conflict", "the object has been modified")
        self.value, self.version = value, self.version + 1

    def bump(self) -> None:
        """Somebody else changed the object (e.g. the BaseModel reconciler patched status)."""
        self.version += 1


def test_source_key_changes_with_uri_or_revision_only() -> None:
    a = source_key(Source(uri="s3://bk/x", revision="1"))
    assert a == source_key(Source(uri="s3://bk/x", revision="1", secretRef={"name": "creds"}))
    assert a != source_key(Source(uri="s3://bk/x", revision="2"))
    assert a != source_key(Source(uri="s3://bk/y", revision="1"))
    assert len(a) == 32


@pytest.mark.parametrize(("current", "floor", "expected"), [(None, 0, 1), (5, 0, 5), (5, 9, 10), (12, 9, 12)])
def test_next_task_id(current: int | None, floor: int, expected: int) -> None:
    assert next_task_id(current, floor) == expected


@pytest.mark.parametrize("seed", range(5))
def test_concurrent_allocations_without_the_lock_are_unique(seed: int) -> None:
    store = CasStore(random.Random(seed))

    async def main() -> list[int]:
        return list(
            await asyncio.gather(*(allocate_task_id(store, "ns", "llama", max_attempts=1000) for _ in range(200)))
        )

    ids = asyncio.run(main())
    assert sorted(ids) == list(range(1, 201))
    assert store.value == 201
    assert store.conflicts > 0, "the test must actually race"


def test_allocator_serialises_per_basemodel_and_survives_foreign_writes() -> None:
    store = CasStore(random.Random(7), start=41)
    conflicts: list[int] = []
    allocator = TaskIdAllocator(store, on_conflict=lambda: conflicts.append(1))

    async def main() -> list[int]:
        async def one(i: int) -> int:
            if i % 10 == 0:
                store.bump()
            return await allocator.allocate("ns", "llama")

        return list(await asyncio.gather(*(one(i) for i in range(100))))

    ids = asyncio.run(main())
    assert len(set(ids)) == 100 and min(ids) == 41
    assert store.conflicts == len(conflicts)


def test_floor_protects_a_counter_that_went_backwards() -> None:
    store = CasStore(random.Random(1), start=3)
    assert asyncio.run(allocate_task_id(store, "ns", "llama", floor=10)) == 11
    assert store.value == 12


def test_endless_conflicts_give_up_with_a_retryable_error() -> None:
    class AlwaysConflict(CasStore):
        async def write_next_task_id(self, namespace: str, basemodel: str, resource_version: str, value: int) -> None:
            raise ConflictError(409, "Conflict", "modified")

    with pytest.raises(TaskIdConflictError):
        asyncio.run(allocate_task_id(AlwaysConflict(random.Random(0)), "ns", "llama", max_attempts=5))


def test_unknown_basemodel_is_not_found() -> None:
    with pytest.raises(NotFoundError):
        asyncio.run(allocate_task_id(CasStore(random.Random(0)), "ns", "other"))
