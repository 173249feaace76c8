"""KV-cache events: poll each trtllm-serve pod's ``POST /kv_cache_events`` and feed the fleet's prefix index.

trtllm-serve (``tensorrt_llm/serve/openai_server.py``) answers ``POST /kv_cache_events`` with the events since
the previous call (a JSON list, format in :mod:`trtfleet_router.routing.kvevents`); it publishes them only when
the pod's ``kv_cache_config.event_buffer_max_size`` is above 0. Only pods of ``pytorch`` base models are asked
(Triton's TRT-LLM models expose no events). A pod that answers 404/405 does not publish: it is not asked again
until it restarts (new uid); its blocks stay modelled from routing and corrected by its counters. A payload the
router cannot read is logged and dropped (nothing of it applied); a pod that does not answer is skipped this round.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Final

import aiohttp

from trtfleet_router import jsoncodec
from trtfleet_router.liveview import FleetSet
from trtfleet_router.routing.kvevents import KvEventError, parse_events

log = logging.getLogger(__name__)

KV_EVENTS_PATH: Final = "/kv_cache_events"
POLL_TIMEOUT_S: Final = 0.8
NOT_PUBLISHED: Final = frozenset({404, 405})


class KvEventPoller:
    def __init__(self, fleets: FleetSet, interval_s: float = 1.0) -> None:
        self.fleets = fleets
        self.interval_s = interval_s
        self.silent: set[tuple[str, str]] = set()  # (pod id, uid) that do not publish events

    def targets(self) -> list[tuple[str, str, str, str]]:
        """(base model, pod id, uid, address) of every ready pod of a pytorch base model that may publish."""
        bases = self.fleets.registry.bases
        return [
            (base, ep.pod_id, ep.uid, ep.address)
            for base, ep in self.fleets.all_endpoints()
            if ep.ready and base in bases and bases[base].serves_openai and (ep.pod_id, ep.uid) not in self.silent
        ]

    async def run(self) -> None:
        timeout = aiohttp.ClientTimeout(total=POLL_TIMEOUT_S)
        async with aiohttp.ClientSession(timeout=timeout) as session:
            while True:
                await self.poll_once(session)
                await asyncio.sleep(self.interval_s)

    async def poll_once(self, session: aiohttp.ClientSession) -> None:
        targets = self.targets()
        answers = await asyncio.gather(*(self._fetch(session, address) for *_, address in targets),
                                       return_exceptions=True)
        for (base, pod_id, uid, _address), answer in zip(targets, answers, strict=True):
            if isinstance(answer, BaseException):
                log.debug("kv events poll failed", extra={"ctx": {"pod": pod_id, "error": str(answer)}})
                continue
            status, payload = answer
            if status in NOT_PUBLISHED:
                self.silent.add((pod_id, uid))
                log.info("pod publishes no KV-cache events", extra={"ctx": {"pod": pod_id, "status": status}})
                continue
            fleet = self.fleets.fleets.get(base)
            if status != 200 or fleet is None:
                continue
            try:
                events = parse_events(payload)
            except KvEventError as exc:
                log.warning("unreadable KV-cache events dropped", extra={"ctx": {"pod": pod_id, "error": str(exc)}})
                continue
            stored, skipped = fleet.observe_kv_events(pod_id, events)
            if skipped:
                log.debug("kv blocks without a known parent skipped",
                          extra={"ctx": {"pod": pod_id, "stored": stored, "skipped": skipped}})

    @staticmethod
    async def _fetch(session: aiohttp.ClientSession, address: str) -> tuple[int, object]:
        async with session.post(f"http://{address}{KV_EVENTS_PATH}") as response:
            if response.status != 200:
                return response.status, None
            return 200, jsoncodec.loads(await response.read())
