"""Scale from zero at once: long-poll the routers for requests held for want of a ready pod.

The autoscaler decides on a timer (``--autoscale-interval``, 15 s by default), so a request that arrives
at a base model scaled to zero would wait up to one interval before the decision even starts the cold start.
Each BaseModel with ``spec.autoscaling`` gets a kopf daemon that runs :meth:`HoldWatch.run`: it asks every
router replica ``GET /fleet/v1/held?base_model=<name>&after=<episode>&wait=<s>`` on its peer port (the pods
matching ``--router-selector`` on ``--router-peer-port``, or the peer URLs of ``--router-demand-url``),
each in its own loop. A router answers as soon as a request of the base model is held while none was (a new *hold
episode*, :mod:`trtfleet_router.upstream.hold`), or, once the watch decided in that episode, as soon as more
requests are held than the pods that decision asked for take (``above``: held requests rounded up to whole
pods at ``targetRequestsPerPod``), or when ``wait`` passes. Either runs one autoscaling decision at once,
under the BaseModel's reconcile lock, as the timer would: the first held request starts a cold start, and a
backlog that grows during it is sized as it grows. The routers stay read-only on
the Kubernetes API: the operator asks them, they never write BaseModels.

Every poll carries the routers' bearer token (``--router-token-file``, :mod:`trtfleet.internalauth`).

Cursors are per router replica id: a router that restarted (a new id behind an address) numbers its episodes
from 1 again, and its first answer counts as new when it holds requests. A router that does not answer is
left out of the round; the timer still decides, so this only ever makes a scale-up sooner.
"""

from __future__ import annotations

import asyncio
import json
import logging
import math
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import aiohttp

from trtfleet.internalauth import TokenFile, authorized_get
from trtfleet_operator.config import AutoscaleConfig, MergeAdviceConfig
from trtfleet_operator.errors import KubeError
from trtfleet_operator.kube import KubeClient
from trtfleet_operator.mergeadvisor import router_peer_urls

logger = logging.getLogger(__name__)

HELD_PATH = "/fleet/v1/held"
IDLE_S = 10.0
"""The router replicas are looked up again this often; a replica that did not answer is asked again after it."""
DECIDE_GAP_S = 1.0
"""At most one decision of this watch per this long (a growing backlog asks again after it)."""
ROUND_MIN_S = 1.0
"""One replica's polls start at least this far apart (a router that answers at once is not asked in a busy loop)."""


@dataclass(frozen=True)
class HeldAnswer:
    replica: str
    held: int
    episode: int


def parse_held(body: Any) -> HeldAnswer | None:
    """A router's ``/fleet/v1/held`` answer; None when the body is something else."""
    if not isinstance(body, dict):
        return None
    replica, held, episode = body.get("replica"), body.get("held"), body.get("episode")
    if not isinstance(replica, str) or not isinstance(held, int) or not isinstance(episode, int):
        return None
    return HeldAnswer(replica, held, episode)


@dataclass(frozen=True)
class Cursor:
    """What the watch knows of one router address: its replica id, its latest hold episode, and how many
    held requests the watch's last decision in that episode sized the fleet for (None: none)."""

    replica: str
    episode: int
    covered: int | None = None


def is_new(answer: HeldAnswer, cursor: Cursor | None) -> bool:
    """Whether ``answer`` reports held requests no decision of the watch covered yet (``cursor``: what the
    watch knew of that address; None: never asked)."""
    if answer.held <= 0:
        return False
    if cursor is None or cursor.replica != answer.replica:
        return True  # first contact, or a restarted router: what it holds now was never acted on
    if answer.episode > cursor.episode:
        return True
    return cursor.covered is not None and answer.held > cursor.covered


def covered_by(held: int, per_pod: float | None) -> int | None:
    """Held requests the pods a decision asks for ``held`` requests take (``targetRequestsPerPod`` each):
    the backlog beyond it asks for another decision. None without a per-pod target."""
    if per_pod is None or per_pod <= 0:
        return None
    return int(math.ceil(held / per_pod) * per_pod)


def advance(answer: HeldAnswer, cursor: Cursor | None, decided: bool, per_pod: float | None) -> Cursor:
    """The cursor after ``answer``: a decision covers its held requests; otherwise what the last decision in
    the same episode covered stands (a new episode, or none held, starts over)."""
    if decided:
        return Cursor(answer.replica, answer.episode, covered_by(answer.held, per_pod))
    same = cursor is not None and (cursor.replica, cursor.episode) == (answer.replica, answer.episode)
    keep = cursor.covered if same and cursor is not None and answer.held > 0 else None
    return Cursor(answer.replica, answer.episode, keep)


class _DecisionGate:
    """One decision at a time for the BaseModel, and at most one per :data:`DECIDE_GAP_S`."""

    def __init__(self, decide: Callable[[], Awaitable[object]], clock: Callable[[], float]) -> None:
        self._decide = decide
        self._clock = clock
        self._lock = asyncio.Lock()
        self._decided_s = float("-inf")

    async def decide(self) -> bool:
        """Decide now (True), or not: one was made within the gap (False: ask again in a moment)."""
        async with self._lock:
            if self._clock() - self._decided_s < DECIDE_GAP_S:
                return False
            await self._decide()
            self._decided_s = self._clock()
            return True


class HoldWatch:
    def __init__(
        self,
        client: KubeClient,
        routers: AutoscaleConfig,
        peers: MergeAdviceConfig,
        clock: Callable[[], float] = time.monotonic,
        *,
        tokens: TokenFile | None = None,
    ) -> None:
        self.client = client
        self.routers = routers
        self.peers = peers
        self.clock = clock
        self.tokens = tokens

    async def run(
        self,
        namespace: str,
        name: str,
        decide: Callable[[], Awaitable[object]],
        per_pod: Callable[[], float | None] = lambda: None,
    ) -> None:
        """Long-poll the routers for BaseModel ``namespace/name`` until cancelled; ``decide`` on held requests
        no decision covered yet (``per_pod``: the BaseModel's ``targetRequestsPerPod`` now). One poll loop per
        router replica, so one replica's long wait never delays the answer of another; the replicas are looked
        up again every :data:`IDLE_S`."""
        gate = _DecisionGate(decide, self.clock)
        followed: dict[str, asyncio.Task[None]] = {}
        timeout = aiohttp.ClientTimeout(total=self.routers.held_wait_s + self.routers.scrape_timeout_s)
        async with aiohttp.ClientSession(timeout=timeout) as session:
            try:
                while True:
                    try:
                        bases = await router_peer_urls(self.client, self.routers, self.peers, namespace)
                    except KubeError as exc:  # refused or unavailable: keep following the routers known
                        logger.info("router pods not listed", extra={"basemodel": f"{namespace}/{name}",
                                                                      "error": str(exc)})
                        bases = list(followed)
                    for url in set(followed) - set(bases):
                        followed.pop(url).cancel()
                    for url in bases:
                        task = followed.get(url)
                        if task is not None and task.done() and not task.cancelled() and task.exception():
                            logger.warning("held-request poll ended", extra={"router": url,
                                                                             "error": repr(task.exception())})
                        if task is None or task.done():
                            followed[url] = asyncio.create_task(
                                self._follow(session, url, f"{namespace}/{name}", name, gate, per_pod)
                            )
                    await asyncio.sleep(IDLE_S)
            finally:
                for task in followed.values():
                    task.cancel()
                await asyncio.gather(*followed.values(), return_exceptions=True)

    async def _follow(
        self,
        session: aiohttp.ClientSession,
        url: str,
        basemodel: str,
        name: str,
        gate: _DecisionGate,
        per_pod: Callable[[], float | None],
    ) -> None:
        """Poll one router replica until cancelled."""
        cursor: Cursor | None = None
        while True:
            started_s = self.clock()
            answer = await self._ask(session, url, name, cursor, self.routers.held_wait_s)
            if answer is None:
                await asyncio.sleep(IDLE_S)
                continue
            decided = False
            if is_new(answer, cursor):
                context = {"basemodel": basemodel, "router": url, "held": answer.held}
                decided = await gate.decide()
                if not decided:  # just decided: ask again in a moment (the cursor stays) and decide then
                    logger.debug("held requests: a decision was just made, asking again", extra=context)
                    await asyncio.sleep(DECIDE_GAP_S)
                    continue
                logger.info("held requests: decided at once", extra=context)
            cursor = advance(answer, cursor, decided, per_pod())
            await asyncio.sleep(max(0.0, ROUND_MIN_S - (self.clock() - started_s)))

    async def _ask(
        self, session: aiohttp.ClientSession, base_url: str, name: str, cursor: Cursor | None, wait_s: float
    ) -> HeldAnswer | None:
        params = {"base_model": name}
        if cursor is not None:  # first contact answers at once; after it, wait for what is not covered yet
            params.update(replica=cursor.replica, after=str(cursor.episode), wait=str(wait_s))
            if cursor.covered is not None:
                params["above"] = str(cursor.covered)
        try:
            async with authorized_get(session, base_url + HELD_PATH, self.tokens, params=params) as response:
                response.raise_for_status()
                answer = parse_held(json.loads(await response.text()))
        except (aiohttp.ClientError, TimeoutError, ValueError) as exc:
            logger.debug("held requests not read", extra={"url": base_url, "error": str(exc)})
            return None
        if answer is None:
            logger.info("not a held-requests answer", extra={"url": base_url})
        return answer
