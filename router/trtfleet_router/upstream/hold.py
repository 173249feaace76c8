"""Requests held while their base model has no ready pod (scaled to zero, or its first pods starting).

Instead of answering 503 at once, the dispatcher parks such a request here: at most ``max_held`` per
base model (beyond: 503 at once), each until a pod of its base model becomes ready (discovery calls
:meth:`PodHolds.pods_changed`, which wakes every holder of that base model to route again) or until its
own limit passes (``holdWaitS``, capped by the request's deadline): then 503 with ``Retry-After``. The
held requests are the demand that scales the base model from zero (``trtfleet_router_held_requests``).
Pure asyncio on the event loop thread; no clock of its own beyond ``asyncio``'s timeouts.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import Final

RETRY_AFTER_S_HELD: Final = 5
"""``Retry-After`` of a request turned away after or instead of a hold: a cold start takes this long at least."""


class HoldsFull(Exception):
    """``max_held`` requests of the base model are already held."""


@dataclass
class _Holders:
    count: int = 0
    changed: asyncio.Event = field(default_factory=asyncio.Event)


class PodHolds:
    """Bounded holds per base model, all released together when its pods change."""

    def __init__(self, max_held: int) -> None:
        self.max_held = max_held
        self._bases: dict[str, _Holders] = {}

    def held(self, base_model: str) -> int:
        holders = self._bases.get(base_model)
        return holders.count if holders is not None else 0

    async def wait(self, base_model: str, timeout_s: float) -> bool:
        """Hold until the base model's pods change (True) or ``timeout_s`` passes (False).

        Raises :class:`HoldsFull` at once when ``max_held`` requests are held already.
        """
        holders = self._bases.setdefault(base_model, _Holders())
        if holders.count >= self.max_held:
            raise HoldsFull(f"{holders.count} requests already wait for a pod of base model {base_model!r}")
        if timeout_s <= 0:
            return False
        holders.count += 1
        try:
            await asyncio.wait_for(holders.changed.wait(), timeout_s)
            return True
        except TimeoutError:
            return False
        finally:
            holders.count -= 1
            if holders.count == 0 and self._bases.get(base_model) is holders and not holders.changed.is_set():
                del self._bases[base_model]

    def pods_changed(self, base_models: set[str] | None = None) -> None:
        """Wake every holder of ``base_models`` (None: all); they route again and, if still no pod is
        ready, hold again for the rest of their time."""
        for name in list(self._bases if base_models is None else base_models & self._bases.keys()):
            holders = self._bases.pop(name)
            holders.changed.set()
