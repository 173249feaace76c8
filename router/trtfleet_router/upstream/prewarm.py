"""Prewarming: an adapter's weights pushed to a pod before requests need them there.

A prewarm is a one-token request pinned to the pod with the adapter's weights (on runtime ``pytorch`` the pod
reads them from ``lora_path``), not counted as demand and never retried elsewhere. Four things push them: the
adapters that ask for ``minPods`` warm pods (:meth:`Prewarmer.run`, every ``prewarm_interval_s``), warm starts of
new pods (:mod:`trtfleet_router.warmstart`), the placement's prefetches into the pods' host tiers
(:meth:`Prewarmer.prefetch`, from :mod:`trtfleet_router.placementloop`), and the endpoint picker before it sends a
request to a pod predicted cold (:mod:`trtfleet_router.epp.coldloads`: the gateway's request carries no weights).

TRT-LLM offers no other way to fill a running pod's host tier: the Triton backend stores weights only from
requests (``lora_prefetch_dir`` is read once, at start), and on the PyTorch backend the peft cache config's
``lora_prefetch_dir`` is documented as not supported, so a request naming ``lora_request`` is the only runtime
path (docs/benchmarks/adapters.md records the TRT-LLM files and commits this was read in).
"""

from __future__ import annotations

import asyncio
import logging
from typing import Final

from trtfleet_router.errors import RouterError
from trtfleet_router.liveview import FleetSet
from trtfleet_router.routing.fleet import Fleet
from trtfleet_router.routing.types import Decision
from trtfleet_router.upstream.dispatch import Dispatcher
from trtfleet_router.upstream.protocol import SamplingParams
from trtfleet_router.upstream.text import TextGenerator, TextRequest

log = logging.getLogger(__name__)

PREWARM_TIMEOUT_S: Final = 60.0
PREWARM_PROMPT_TOKENS: Final = 3


class Prewarmer:
    def __init__(self, fleets: FleetSet, text: TextGenerator, dispatcher: Dispatcher) -> None:
        self.fleets = fleets
        self.text = text
        self.dispatcher = dispatcher

    async def run(self, interval_s: float) -> None:
        """Keep every adapter with ``minPods`` warm on that many pods."""
        while True:
            await asyncio.sleep(interval_s)
            for name, fleet in list(self.fleets.fleets.items()):
                adapters = self.fleets.registry.adapters_of(name)
                plan = fleet.prewarm_plan([a.ref for a in adapters if a.min_pods > 0])
                by_name = {a.served_name: a for a in adapters}
                for pod, ref in plan:
                    await self.push(name, pod, by_name[ref.name].served_name)

    async def load(self, pod: str, served_name: str, decision: Decision | None = None) -> None:
        """Push ``served_name``'s weights to ``pod`` now (``decision``: the pinned decision, a prewarm by default);
        raises the :class:`RouterError` of a failed push."""
        target = self.fleets.registry.resolve(served_name)
        request = TextRequest(
            f"prewarm-{served_name}",
            target,
            " ",
            SamplingParams(max_tokens=1),
            False,
            PREWARM_PROMPT_TOKENS,
            PREWARM_TIMEOUT_S,
        )
        call = await self.text.call(request)
        call.pinned_decision = decision if decision is not None else Fleet.prewarm_decision(pod)
        async for _ in self.dispatcher.stream(call):
            pass

    async def prefetch(self, base_model: str, pod: str, served_name: str) -> None:
        """Push ``served_name``'s weights to ``pod`` as the placement's prefetch (raises on failure)."""
        await self.load(pod, served_name, Fleet.prefetch_decision(pod))

    async def push(self, base_model: str, pod: str, served_name: str) -> None:
        """Push ``served_name``'s weights to ``pod`` (failures are logged, not raised)."""
        try:
            await self.load(pod, served_name)
        except RouterError as exc:
            log.warning("prewarm failed", extra={"ctx": {"pod": pod, "adapter": served_name, "error": exc.message}})
        else:
            log.info("prewarmed", extra={"ctx": {"pod": pod, "adapter": served_name, "base_model": base_model}})
