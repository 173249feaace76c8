"""Pod resets and other router replicas' events, the part of :class:`~trtfleet_router.routing.fleet.Fleet` that
empties a pod's view in place: a restart seen by discovery or by our scrape (``reset_pod``), a peer's event
(``apply_remote``), a peer gone (``forget_origin``). :class:`PodResets` is mixed into ``Fleet`` and works on
its books; it declares the attributes it uses, which ``Fleet.__init__`` sets."""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator

from trtfleet_router.routing.events import EventKind, Journal, ResidencyEvent
from trtfleet_router.routing.load import ActivityWindow, AdapterDemand
from trtfleet_router.routing.podstate import PodState
from trtfleet_router.routing.prefixindex import PrefixIndex
from trtfleet_router.routing.remote import RemoteBook
from trtfleet_router.routing.residency import Residency
from trtfleet_router.routing.types import PodInfo

log = logging.getLogger("trtfleet_router.routing.fleet")  # the fleet's log, as before the split

RESET_DEDUPE_S = 5.0
"""A pod reset (another replica's event, or our scrape seeing Triton's counters go back) within this long
after the pod's view was last emptied is the same restart seen twice: applying it would empty adapters
stored since."""


class PodResets:
    """Resets of pods' views and other replicas' events, on the books of the Fleet this is mixed into."""

    _now: Callable[[], float]
    _model: str
    _pods: dict[str, PodState]
    _ready: list[PodState]
    _residency: Residency
    _prefix: PrefixIndex
    _demand: AdapterDemand
    _window: ActivityWindow
    _remote: RemoteBook
    _journal: Journal | None
    _epochs: Iterator[int]
    kv_tokens_per_block: int  # the base model's KV block size: other replicas' requests' blocks in tokens

    def _reset(self, info: PodInfo) -> PodState:
        """An empty view of the pod: LoRA shadow and KV prefix blocks."""
        residency = self._residency.reset_pod(info.pod_id, info.host_pages, info.device_pages)
        state = self._pods[info.pod_id] = PodState(info, residency)
        self._prefix.reset_pod(info.pod_id, info.kv_blocks)
        state.reset_at_s = self._now()
        return state

    def apply_remote(self, event: ResidencyEvent) -> bool:
        """Apply another replica's event; False when it was ignored (unknown pod, incarnation or ticket).

        Another replica's request queues its prefill on the pod as ours do (the ``trtfleet`` policy prices a
        pod's queue by it): a ``put``/``acquire`` books its blocks the prefix index does not hold there yet,
        in tokens, as pending prefill (the origin books its prompt less the cached blocks: the same but for
        the last partial block), until the origin's ``loaded`` (its first token) or ``release``."""
        kind = event.kind
        if kind is not EventKind.POD_RESET:
            now_s = self._now()
            applied = self._remote.apply(event, self._pods, self._residency, self._demand, self._window, now_s)
            key = (event.origin, event.ticket)
            if applied and event.blocks:  # the other replica's request leaves its blocks on the pod, as ours do
                tokens = self.kv_tokens_per_block
                self._prefix.book(key, event.pod_id, event.blocks, len(event.blocks) * tokens, tokens, now_s)
            elif kind is EventKind.LOADED or kind is EventKind.RELEASE:
                applied = self._prefix.prefill_done(key, now_s) or applied
            return applied
        old = self._pods.get(event.pod_id)
        if old is None or old.discovered_uid != event.pod_uid:
            return False
        if self._now() - old.reset_at_s < RESET_DEDUPE_S:
            return False  # the same restart, already applied
        self._reset_in_place(old)
        log.info("pod reset by a peer", extra={"pod": event.pod_id, "origin": event.origin, "model": self._model})
        return True

    def reset_pod(self, pod_id: str, reason: str) -> None:
        """The pod's Triton restarted in place (same uid and address, empty LoRA cache): an empty shadow,
        its requests' tickets void, and the other replicas told. Unknown pods, and a pod whose view was
        emptied less than ``RESET_DEDUPE_S`` ago (the same restart), are left alone."""
        old = self._pods.get(pod_id)
        if old is None or self._now() - old.reset_at_s < RESET_DEDUPE_S:
            return  # unknown, or the same restart already seen (by a peer, or as not ready -> ready)
        self._reset_in_place(old)
        if self._journal is not None:
            self._journal.record(self._model, pod_id, old.discovered_uid, EventKind.POD_RESET)
        log.info("pod restarted in place", extra={"pod": pod_id, "reason": reason, "model": self._model})

    def _reset_in_place(self, old: PodState) -> None:
        blocks = self._prefix.pod(old.pod_id)
        info = PodInfo(old.pod_id, old.address, old.discovered_uid, old.host_pages, old.device_pages, old.ready,
                       kv_blocks=blocks.capacity_blocks if blocks is not None else 0)
        state = self._reset(info)
        state.uid = f"{info.uid}#{next(self._epochs)}"
        state.load.metrics, state.load.fresh_until_s = old.load.metrics, old.load.fresh_until_s
        state.unready_at_s = old.unready_at_s
        if old.ready:
            self._ready = [state if pod is old else pod for pod in self._ready]

    def forget_origin(self, origin: str) -> int:
        """Another replica is gone (or its stream had a gap): end its requests, unpin its adapters."""
        for ticket_origin, ticket_id, _ in list(self._remote.tickets()):
            if ticket_origin == origin:
                self._prefix.prefill_done((origin, ticket_id))
        return self._remote.forget_origin(origin, self._pods, self._residency, self._demand)

    @property
    def remote(self) -> RemoteBook:
        return self._remote
