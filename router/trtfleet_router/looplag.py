"""How late the router's event loop runs what is due: every request's handler, relayed token and routing
decision waits for the loop, so a busy loop (a batch relayed beside interactive requests, a long callback, a
starved CPU) delays them all by the same amount.

:class:`LoopLagProbe` asks the loop to wake it every :data:`INTERVAL_S` and records how much later than asked
it woke, in ``trtfleet_router_event_loop_lag_seconds``. Samples come at regular times, not with requests, so
the histogram is the wait a callback arriving at a random moment would see. The loop wakes a timer at up to a
millisecond past its time when idle (epoll waits in whole milliseconds), so lags below the first bucket are the
floor, not a delay.
"""

from __future__ import annotations

import asyncio
from typing import Final, Protocol

INTERVAL_S: Final = 0.02
"""50 samples a second: a two-minute window holds 6,000, enough for a p99; each costs a timer and a wake-up."""
LAG_BUCKETS_S: Final = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5)


class Observer(Protocol):
    def observe(self, value: float) -> None: ...


def lag_s(asked_at: float, interval_s: float, woke_at: float) -> float:
    """How late a wake-up asked for ``interval_s`` past ``asked_at`` came (pure; never negative)."""
    return max(0.0, woke_at - asked_at - interval_s)


class LoopLagProbe:
    def __init__(self, histogram: Observer, interval_s: float = INTERVAL_S) -> None:
        if interval_s <= 0:
            raise ValueError(f"loop lag interval must be positive, got {interval_s}")
        self.histogram = histogram
        self.interval_s = interval_s

    async def run(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            asked_at = loop.time()
            await asyncio.sleep(self.interval_s)
            self.histogram.observe(lag_s(asked_at, self.interval_s, loop.time()))
