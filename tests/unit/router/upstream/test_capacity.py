"""CapacityWaits: the bounded line that holds requests while the fleet is saturated or every LoRA cache is full of
busy adapters (one tenant here: first in, first out)."""

from __future__ import annotations

import asyncio

from trtfleet_router.upstream.capacity import CapacityWaits
from trtfleet_router.upstream.waiting import Wake


async def settle() -> None:
    """Let woken tasks run (wait_for + shield take a few loop turns)."""
    for _ in range(10):
        await asyncio.sleep(0)


def test_waiters_wake_in_fifo_order_one_per_notify() -> None:
    async def scenario() -> tuple[list[str], bool]:
        waits = CapacityWaits(max_waiting=2)
        woken: list[str] = []

        async def waiter(name: str) -> None:
            if await waits.wait("m", 5.0):
                woken.append(name)

        tasks = [asyncio.create_task(waiter(name)) for name in ("a", "b")]
        await asyncio.sleep(0)
        full = not waits.can_wait("m")
        waits.notify("m")
        for _ in range(1000):  # loop turns, not wall time: until the woken task has run
            if woken:
                break
            await asyncio.sleep(0)
        await settle()  # and give a wrongly woken second waiter the chance to show up
        assert woken == ["a"]
        waits.notify("m")
        await asyncio.gather(*tasks)
        assert waits.waiting("m") == 0
        return woken, full

    woken, full = asyncio.run(scenario())
    assert woken == ["a", "b"] and full


def test_wait_times_out_and_leaves_the_queue() -> None:
    async def scenario() -> tuple[Wake, Wake, int]:
        waits = CapacityWaits(max_waiting=4)
        timed_out = await waits.wait("m", 0.01)
        immediate = await waits.wait("m", 0.0)
        waits.notify("m")  # nobody waits: nothing to wake, no error
        return timed_out, immediate, waits.waiting("m")

    assert asyncio.run(scenario()) == (Wake.TIMED_OUT, Wake.TIMED_OUT, 0)


def test_rejoining_waiter_goes_first() -> None:
    async def scenario() -> list[str]:
        waits = CapacityWaits(max_waiting=4)
        order: list[str] = []

        async def waiter(name: str, first: bool) -> None:
            if await waits.wait("m", 5.0, first=first):
                order.append(name)

        late = asyncio.create_task(waiter("queued", False))
        await asyncio.sleep(0)
        again = asyncio.create_task(waiter("rejoined", True))
        await asyncio.sleep(0)
        waits.notify("m")
        waits.notify("m")
        await asyncio.gather(late, again)
        return order

    assert asyncio.run(scenario()) == ["rejoined", "queued"]
