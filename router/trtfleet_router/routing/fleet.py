"""The stateful orchestrator of one base model's pods: decide, then keep the books.

Life of a request (the I/O shell drives it; nothing here blocks, sleeps or reads a clock of its own)::

    decision = fleet.route(request)        # pure decision: which pod, send weights or not
    ticket = fleet.start(decision, request)  # when the request is actually sent
    fleet.confirm(ticket)                   # first response: the pod admitted it (and its weights)
    fleet.finish(ticket, Outcome.OK)        # or MISS / CACHE_FULL / FAILED

Cost: ``route`` is O(pods) (never O(adapters)); ``start``/``finish`` are O(1) plus the shadow
cache's eviction walk; ``set_pods`` is O(pods + adapters resident on changed pods);
``prewarm_plan`` and ``snapshot`` are off the hot path.

Router replicas: with a :class:`~trtfleet_router.routing.events.Journal`, every change ``start``,
``confirm``, ``finish`` and a pod reset make is also handed to it as an event, and
:meth:`Fleet.apply_remote` applies other replicas' events to the same residency
(:mod:`trtfleet_router.routing.remote`), so ``route`` sees their warm adapters, pins and load. A pod's view is
emptied in place when it restarts (``reset_pod``, from discovery or our scrape, or a peer's event).
"""

from __future__ import annotations

import itertools
import logging
import math
import random
from collections.abc import Callable, Mapping, Sequence

from trtfleet_router.routing.batchplace import place_batch_line
from trtfleet_router.routing.config import RoutingConfig
from trtfleet_router.routing.events import EventKind, Journal, ResidencyEvent
from trtfleet_router.routing.fleetreport import (
    PodLoadSummary,
    check_books,
    fleet_snapshot,
    pod_load_summary,
    prewarm_plan,
    warm_start_plan,
)
from trtfleet_router.routing.framework import Policy, RoutingContext
from trtfleet_router.routing.hashing import RendezvousRankings
from trtfleet_router.routing.kvevents import KvEvent, apply_events
from trtfleet_router.routing.load import ActivityWindow, AdapterDemand
from trtfleet_router.routing.placement import PlacementPlan, PodTiers
from trtfleet_router.routing.placer import Placer
from trtfleet_router.routing.podstate import PodState
from trtfleet_router.routing.prefetch import PodIdleness
from trtfleet_router.routing.prefix import BLOCK_TOKENS_DEFAULT
from trtfleet_router.routing.prefixindex import PrefixIndex
from trtfleet_router.routing.remote import RemoteBook
from trtfleet_router.routing.reserve import InteractiveReserve
from trtfleet_router.routing.residency import Residency
from trtfleet_router.routing.types import (
    AdapterRef,
    AdapterTooLarge,
    Decision,
    FleetSnapshot,
    NoCapacity,
    NoReadyPod,
    Outcome,
    PodInfo,
    PodMetrics,
    RouteRequest,
    RoutingError,
    Ticket,
    UnknownPod,
)

log = logging.getLogger(__name__)

PREWARM_POLICY = "prewarm"
PREFETCH_REASON = "prefetch"
"""A prewarm the placement asked for (``Fleet.prefetch_decision``); other prewarms keep ``minPods`` or warm new
pods."""
ACTIVITY_WINDOW_S = 60
RESET_DEDUPE_S = 5.0
"""A pod reset (another replica's event, or our scrape seeing Triton's counters go back) within this long
after the pod's view was last emptied is the same restart seen twice: applying it would empty adapters
stored since."""


class Fleet:
    """Routing state and decisions for the pods of one base model."""

    def __init__(
        self,
        policy: Policy,
        *,
        now: Callable[[], float],
        rng: random.Random,
        config: RoutingConfig,
        model: str = "",
        journal: Journal | None = None,
    ) -> None:
        self._policy = policy
        # policies that price prefixes say so; for the others no prompt is hashed (PromptBlocks.lazy)
        self._uses_prefix = bool(getattr(policy, "uses_prefix", False))
        self._now = now
        self._rng = rng
        self._config = config
        self._model = model
        self._pods: dict[str, PodState] = {}
        self._pod_order: list[str] = []  # sorted ids, ready or not
        self._ready: list[PodState] = []
        self._largest_host_pages = 0
        self._residency = Residency()
        self._prefix = PrefixIndex(config.prefix.pod_kv_blocks)
        self.kv_tokens_per_block = BLOCK_TOKENS_DEFAULT  # the discovery shell sets the base model's
        self._demand = AdapterDemand(config.demand_half_life_s)
        self._rankings = RendezvousRankings(config.hrw_cache_entries)
        self._tickets = itertools.count(1)
        self._epochs = itertools.count(1)
        self._open: dict[int, Ticket] = {}
        self._loading: set[int] = set()  # tickets whose weights the pod has not admitted yet
        self._journal = journal
        self._remote = RemoteBook()
        self._window: ActivityWindow[int | None] = ActivityWindow(ACTIVITY_WINDOW_S)
        self._reserve = InteractiveReserve(config.batch_reserve)  # routing/reserve.py
        self._placer = Placer(config.placement)  # routing/placer.py: forecast, plan, prefetch pacing

    @property
    def policy_name(self) -> str:
        return self._policy.name

    # -- pods ------------------------------------------------------------------------------------
    def set_pods(self, pods: Mapping[str, PodInfo]) -> None:
        """The current pods (from discovery). New or restarted (new uid) pods start with an empty
        shadow cache and no in-flight requests; pods no longer listed are dropped. So does a pod that
        comes back ready after being not ready (its readiness probe failed, or the router suspended it
        after a refused connection): its Triton may have restarted inside the same Kubernetes pod, which
        keeps the uid and IP but empties the LoRA cache. Assuming cold costs at most one weight transfer
        per adapter (TRT-LLM ignores weights for an id it holds); assuming warm would cost a miss and
        a resend for each.
        """
        for pod_id, info in pods.items():
            if pod_id != info.pod_id:
                raise RoutingError(f"pod listed under {pod_id!r} calls itself {info.pod_id!r}")
        for pod_id in [pod_id for pod_id in self._pods if pod_id not in pods]:
            del self._pods[pod_id]
            self._residency.drop_pod(pod_id)
            self._prefix.drop_pod(pod_id)
            log.info("pod removed", extra={"pod": pod_id, "model": self._model})
        for pod_id, info in pods.items():
            old = self._pods.get(pod_id)
            came_back = old is not None and not old.ready and info.ready
            if came_back and old is not None and old.reset_at_s > old.unready_at_s:
                came_back = False  # its view was emptied during this outage already (a peer, its counters)
            if (
                old is None
                or came_back
                or old.discovered_uid != info.uid
                or old.host_pages != info.host_pages
                or old.device_pages != info.device_pages
            ):
                state = self._reset(info)
                if old is not None and old.discovered_uid == info.uid:
                    state.uid = f"{info.uid}#{next(self._epochs)}"  # same pod, new shadow: old tickets void
                    if self._journal is not None:
                        self._journal.record(self._model, pod_id, info.uid, EventKind.POD_RESET)
                what = "added" if old is None else "ready again" if came_back else "restarted"
                log.info("pod %s", what, extra={"pod": pod_id, "uid": info.uid, "model": self._model})
            else:
                if old.ready and not info.ready:
                    old.unready_at_s = self._now()
                old.address = info.address
                old.ready = info.ready
        ordered = sorted(self._pods)
        self._ready = [self._pods[pod_id] for pod_id in ordered if self._pods[pod_id].ready]
        self._largest_host_pages = max((pod.host_pages for pod in self._pods.values()), default=0)
        if ordered != self._pod_order:  # rebuilding rings and rankings is O(pods x points)
            self._pod_order = ordered
            self._rankings.set_pods(ordered)
            self._policy.pods_changed(ordered)

    # -- the decision ----------------------------------------------------------------------------
    def route(self, request: RouteRequest) -> Decision:
        """Which pod takes ``request`` and whether weights go with it. Books nothing (a policy may
        advance its own rotation); :meth:`start` does the bookkeeping once the request is sent.
        Raises NoCapacity (retry later) or AdapterTooLarge (never fits).
        """
        now_s = self._now()
        excluded = request.exclude_pods
        pods = self._ready if not excluded else [pod for pod in self._ready if pod.pod_id not in excluded]
        if not pods:
            if not self._ready:
                raise NoReadyPod("no ready pod", self._config.no_capacity_retry_after_s)
            raise NoCapacity("every ready pod already tried", self._config.no_capacity_retry_after_s)
        adapter = request.adapter
        if adapter is not None and adapter.pages > self._largest_host_pages:
            raise AdapterTooLarge(adapter.name, adapter.pages, self._largest_host_pages)
        if request.background:
            loads = [pod.load.load(now_s) for pod in pods]
        else:  # batch lines leave interactive room (routing/load.py)
            loads = [pod.load.foreground(now_s) for pod in pods]
        if request.reserve_pods:  # pods kept free of batch lines while interactive requests come
            request, pods, loads = self._reserve.apply(request, pods, loads, self._rankings, self._ready, now_s)
        ctx = RoutingContext(
            request=request,
            now_s=now_s,
            pods=pods,
            loads=loads,
            by_id=self._pods,
            residency=self._residency,
            demand=self._demand,
            rankings=self._rankings,
            rng=self._rng,
            prefix=self._prefix,
            placement=self._placer.plan,
        )
        choice = place_batch_line(ctx) or self._policy.choose(ctx)
        chosen = choice.pod
        if adapter is None:
            return Decision(chosen.pod_id, False, True, self._policy.name, choice.reason)
        residency = chosen.residency
        warm = residency.is_warm(adapter.task_id)
        loading = warm and residency.is_loading(adapter.task_id)
        return Decision(chosen.pod_id, not warm, warm, self._policy.name, choice.reason, loading)

    # -- bookkeeping -----------------------------------------------------------------------------
    def start(self, decision: Decision, request: RouteRequest) -> Ticket:
        """The request is being sent as decided: count it in flight, store weights in the pod's
        shadow (when sent) and pin the adapter there until :meth:`finish`.
        """
        pod = self._pods.get(decision.pod)
        if pod is None:
            raise UnknownPod(decision.pod)
        now_s = self._now()
        pod.load.inflight += 1
        adapter = request.adapter
        if request.background:
            pod.load.batch_started(adapter.task_id if adapter is not None else None)
        self._reserve.started(request, decision.policy == PREWARM_POLICY, now_s, self._ready)
        ticket_id = next(self._tickets)
        blocks = request.blocks
        hashes = blocks.hashes if self._uses_prefix else ()
        # a batch line books its blocks but no queued prefill: it is not streamed, so its "first token" is its
        # whole answer, and its prefill would count as queued there for as long as it decodes
        prefill_tokens = 0 if request.background else request.prompt_tokens
        self._prefix.book(ticket_id, pod.pod_id, hashes, prefill_tokens, blocks.block_tokens, now_s)
        task_id = None
        pinned = loads = False
        if adapter is not None:
            task_id = adapter.task_id
            self._demand.started(task_id, now_s)
            if decision.policy != PREWARM_POLICY:
                self._placer.record(task_id, now_s)
            if decision.send_weights:
                pod.cold_loads_total += 1
                loads = self._residency.put(pod.pod_id, task_id, adapter.pages)
                if loads:
                    self._residency.begin_load(pod.pod_id, task_id)
            else:
                pod.warm_routes_total += 1
            pinned = self._residency.acquire(pod.pod_id, task_id)
        if decision.reason != PREFETCH_REASON:  # the placement's own pushes are not demand for the autoscaler
            self._window.record(task_id, now_s)
        ticket = Ticket(
            ticket_id, pod.pod_id, pod.uid, task_id, decision.send_weights, pinned, now_s, loads, request.background
        )
        self._open[ticket.ticket_id] = ticket
        if loads:
            self._loading.add(ticket.ticket_id)
        if self._journal is not None:
            kind = EventKind.PUT if decision.send_weights and adapter is not None else EventKind.ACQUIRE
            pages = adapter.pages if adapter is not None else 0
            self._journal.record(self._model, pod.pod_id, pod.discovered_uid, kind, ticket.ticket_id, task_id, pages,
                                 hashes, request.background)
        return ticket

    def first_token(self, ticket: Ticket) -> None:
        """The request's first output came back: its prefill is done (idempotent; :meth:`finish` implies it).

        The other replicas booked its prefill too: they learn it is done from a ``loaded`` event, which
        :meth:`confirm` publishes for a request that carried weights (the router confirms at the same first
        response) and this publishes for the others. A replica of an earlier version ignores a ``loaded``
        for a request without weights (unknown in-transit ticket)."""
        if not self._prefix.prefill_done(ticket.ticket_id, self._now()) or self._journal is None:
            return
        if ticket.loads_weights and ticket.ticket_id not in self._loading:
            return  # confirmed already: its loaded went out
        pod = self._pods.get(ticket.pod)
        if pod is not None and pod.uid == ticket.pod_uid:
            self._journal.record(self._model, pod.pod_id, pod.discovered_uid, EventKind.LOADED, ticket.ticket_id)

    def confirm(self, ticket: Ticket) -> None:
        """The pod admitted the request (its first response arrived): weights it carried are stored.

        Optional and idempotent; without it a load counts as in transit until :meth:`finish`.
        """
        if ticket.ticket_id not in self._loading:
            return
        self._loading.discard(ticket.ticket_id)
        pod = self._pods.get(ticket.pod)
        if pod is not None and pod.uid == ticket.pod_uid and ticket.task_id is not None:
            self._residency.end_load(pod.pod_id, ticket.task_id)
            if self._journal is not None:
                self._journal.record(self._model, pod.pod_id, pod.discovered_uid, EventKind.LOADED, ticket.ticket_id)

    def finish(self, ticket: Ticket, outcome: Outcome) -> None:
        """The request ended with ``outcome``; pass every ticket exactly once."""
        if ticket.ticket_id not in self._open:
            raise RoutingError(f"ticket {ticket.ticket_id} finished twice or never started")
        self.confirm(ticket)
        self._prefix.prefill_done(ticket.ticket_id, self._now())
        del self._open[ticket.ticket_id]
        if (task_id := ticket.task_id) is not None:
            self._demand.finished(task_id)
        pod = self._pods.get(ticket.pod)
        journal = self._journal
        if journal is not None:  # always: the other replicas end the request even if the pod is gone
            uid = pod.discovered_uid if pod is not None else ""
            journal.record(self._model, ticket.pod, uid, EventKind.RELEASE, ticket.ticket_id)
        if pod is None or pod.uid != ticket.pod_uid:
            return  # the pod left or restarted: its books were reset
        pod.load.inflight -= 1
        if ticket.background:
            pod.load.batch_finished(task_id)
        if task_id is not None and ticket.pinned:
            self._residency.release(pod.pod_id, task_id)
        if outcome is Outcome.OK:
            return
        if outcome is Outcome.MISS:
            pod.misses_total += 1
        elif outcome is Outcome.CACHE_FULL:
            pod.cache_full_total += 1
            pod.cache_full_until_s = self._now() + self._config.cache_full_backoff_s
        else:
            pod.failures_total += 1
        # MISS: the pod does not hold it. CACHE_FULL / FAILED: weights we sent may not be stored.
        if task_id is not None and (outcome is Outcome.MISS or ticket.sent_weights):
            self._residency.mark_cold(pod.pod_id, task_id)
            if journal is not None:
                journal.record(self._model, pod.pod_id, pod.discovered_uid, EventKind.MARK_COLD, 0, task_id)
        log.debug("request ended %s", outcome.value, extra={"pod": pod.pod_id, "task_id": task_id})

    @property
    def residency(self) -> Residency:
        return self._residency

    @property
    def pods(self) -> Mapping[str, PodState]:
        return self._pods

    def open_tickets(self) -> list[Ticket]:
        return list(self._open.values())

    def activity(self) -> dict[int | None, int]:
        """Requests started per task id (None: no adapter) over the last ``ACTIVITY_WINDOW_S``, every replica's."""
        return self._window.counts(self._now())

    def reserved_now(self, count: int) -> frozenset[str]:
        """Ready pods a reserve of ``count`` keeps free of batch lines now (``routing/reserve.py``)."""
        return self._reserve.reserved_now(count, self._rankings, self._ready, self._now())

    def ready_count(self) -> int:
        """Pods of the fleet that are ready now (ejected ones included: they come back)."""
        return len(self._ready)

    def room(self, per_pod: float) -> tuple[int, frozenset[str]]:
        """Requests the ready pods may still start before each holds ``per_pod`` in flight (every replica's; a
        fraction rounds up), and the ready pods that hold that many already."""
        free = 0
        full = []
        limit = math.ceil(per_pod)
        for pod in self._ready:
            load = pod.load
            held = load.inflight + load.remote_inflight
            if held >= per_pod:
                full.append(pod.pod_id)
            else:
                free += limit - held
        return free, frozenset(full)

    def inflight_total(self) -> int:
        """Requests in flight on the fleet's pods, this replica's and the others'."""
        return sum(pod.load.inflight + pod.load.remote_inflight for pod in self._pods.values())

    def load_of(self, pod: str) -> int:
        """The load policies compare for ``pod`` now (in flight plus its fresh queue; 0 if unknown)."""
        return 0 if (state := self._pods.get(pod)) is None else state.load.load(self._now())

    def observe_metrics(self, pod: str, snapshot: PodMetrics) -> None:
        """Scraped metrics of ``pod`` as of now (unknown pods are ignored)."""
        state = self._pods.get(pod)
        if state is not None:
            state.load.observe(snapshot, self._now(), self._config.metrics_stale_after_s)
            self._prefix.observe_metrics(pod, snapshot)

    def observe_kv_events(self, pod: str, events: Sequence[KvEvent]) -> tuple[int, int]:
        """KV-cache events of ``pod`` (routing/kvevents.py); (blocks stored, blocks skipped)."""
        state = self._pods.get(pod)
        return (0, 0) if state is None else apply_events(self._prefix, pod, state.kv_events, events)

    @property
    def prefix_index(self) -> PrefixIndex:
        return self._prefix

    # -- pod resets and other replicas' events -------------------------------------------------
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

    # -- prewarming ------------------------------------------------------------------------------
    def prewarm_plan(self, adapters: Sequence[AdapterRef]) -> list[tuple[str, AdapterRef]]:
        """(pod, adapter) pairs keeping each adapter warm on ``min_pods`` ready pods (``fleetreport.prewarm_plan``)."""
        return prewarm_plan(self._pods, self._rankings, adapters)

    def warm_start_plan(self, new_pods: Sequence[str], hottest: Sequence[AdapterRef]) -> list[tuple[str, AdapterRef]]:
        """(pod, adapter) pairs that warm new pods with the hottest adapters (``fleetreport.warm_start_plan``)."""
        return warm_start_plan(self._pods, new_pods, hottest)

    @staticmethod
    def prewarm_decision(pod: str) -> Decision:
        return Decision(pod, True, False, PREWARM_POLICY, "min-pods")

    # -- placement -------------------------------------------------------------------------------
    @property
    def placer(self) -> Placer:
        """The fleet's forecast, placement plan and prefetch pacer (routing/placer.py)."""
        return self._placer

    @property
    def placement(self) -> PlacementPlan:
        return self._placer.plan

    def _holds(self, pod_id: str, task_id: int) -> bool:
        pod = self._pods.get(pod_id)
        return pod is not None and pod.residency.holds(task_id)

    def replan(self, adapters: Sequence[AdapterRef]) -> PlacementPlan:
        """A new placement of the registered ``adapters`` over the ready pods (``routing/placement.py``), from the
        demand forecast as of now. Off the request path: O(adapters x pods) at worst."""
        tiers = [PodTiers(pod.pod_id, pod.host_pages, pod.device_pages) for pod in self._ready]
        plan = self._placer.replan(adapters, tiers, self._rankings.rank, self._holds, self._now())
        log.debug("placement", extra={"model": self._model, "copies": plan.copies(), "moves": plan.moves,
                                      "deferred": plan.deferred})
        return plan

    def prefetch_due(self) -> list[tuple[str, AdapterRef]]:
        """(pod, adapter) planned host copies to push now, paced so they do not compete with traffic
        (``routing/prefetch.py``). Push each with :meth:`prefetch_decision`, and call :meth:`prefetch_ended`
        when its push is over, whatever its outcome."""
        now_s = self._now()
        idle = {
            pod.pod_id: PodIdleness(pod.pod_id, pod.load.foreground(now_s), pod.load.waiting(now_s))
            for pod in self._ready
            if pod.cache_full_until_s <= now_s
        }
        return self._placer.due(self._holds, idle, now_s)

    def prefetch_ended(self, pod: str) -> None:
        """A push :meth:`prefetch_due` returned is over (stored, refused, failed or never sent)."""
        self._placer.pacer.finished(pod)

    @staticmethod
    def prefetch_decision(pod: str) -> Decision:
        return Decision(pod, True, False, PREWARM_POLICY, PREFETCH_REASON)

    # -- introspection ---------------------------------------------------------------------------
    def is_warm(self, pod: str, task_id: int) -> bool:
        """Whether the shadow of ``pod`` holds ``task_id`` (False for an unknown pod)."""
        return (state := self._pods.get(pod)) is not None and state.residency.is_warm(task_id)

    def has_evictable_slot(self, pod: str, pages: int) -> bool:
        """Whether ``pod``'s shadow could store ``pages`` now, evicting idle adapters only."""
        return (state := self._pods.get(pod)) is not None and state.residency.has_evictable_slot(pages)

    def pod_load(self) -> PodLoadSummary:
        """The ready pods' scraped load as of now (what the router exports for the operator's autoscaler)."""
        return pod_load_summary(self._pods, self._now())

    def snapshot(self) -> FleetSnapshot:
        return fleet_snapshot(self._model, self._policy.name, self._now(), self._pods, self._prefix, len(self._open))

    def check_invariants(self) -> None:
        """Books agree with each other (for tests and fixtures' teardown)."""
        self._residency.check_invariants()
        self._prefix.check_invariants()
        check_books(self._pods, self._open, self._loading, self._remote)
