"""Cold loads the endpoint picker makes before it routes: a gateway's request carries no LoRA weights.

On the ``tensorrtllm`` runtime a pod learns an adapter only from weights sent with a request, which Triton's
generate JSON cannot carry. So when the fleet's decision says the pod is cold (or the weights are still travelling
there with an earlier request), the picker first pushes them over gRPC, a one-token request pinned to the pod
(:meth:`~trtfleet_router.upstream.prewarm.Prewarmer.load`), and only then lets the gateway send the client's
request, id-only. Requests for the same adapter and pod that arrive meanwhile wait for the same push. The client
pays the cold load it would pay anyway; a prediction that was wrong (the pod evicted the adapter unseen) still
reaches the client as the pod's miss error, which the picker counts (``trtfleet_router_adapter_cache_misses_total``).
"""

from __future__ import annotations

import asyncio

from trtfleet_router.upstream.prewarm import Prewarmer


class ColdLoads:
    def __init__(self, prewarmer: Prewarmer) -> None:
        self.prewarmer = prewarmer
        self._pushes: dict[tuple[str, str], asyncio.Task[None]] = {}

    async def ensure(self, pod: str, served_name: str) -> None:
        """Return once ``pod`` holds ``served_name`` (one push per pod and adapter at a time); raises the push's
        :class:`~trtfleet_router.errors.RouterError`."""
        key = (pod, served_name)
        task = self._pushes.get(key)
        if task is None:
            task = self._pushes[key] = asyncio.create_task(self.prewarmer.load(pod, served_name))
            task.add_done_callback(lambda _done: self._pushes.pop(key, None))
        await asyncio.shield(task)

    def in_flight(self) -> int:
        return len(self._pushes)
