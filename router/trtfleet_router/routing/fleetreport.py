"""What :class:`~trtfleet_router.routing.fleet.Fleet` reports and plans off the request path: the prewarm
plans (``minPods`` and a new pod's warm start), the snapshot, the pods' scraped load for the operator's
autoscaler, the consistency check of its books (pure functions of the fleet's state)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from trtfleet_router.routing.hashing import RendezvousRankings
from trtfleet_router.routing.podstate import PodState
from trtfleet_router.routing.prefixindex import PrefixIndex
from trtfleet_router.routing.remote import RemoteBook
from trtfleet_router.routing.types import AdapterRef, FleetSnapshot, PodSnapshot, Ticket


def prewarm_plan(
    pods: Mapping[str, PodState], rankings: RendezvousRankings, adapters: Sequence[AdapterRef]
) -> list[tuple[str, AdapterRef]]:
    """(pod, adapter) pairs to push weights to so each adapter is warm on ``min_pods`` ready pods.

    Targets follow the adapter's rendezvous ranking (where cold loads would place it anyway)
    and skip pods whose cache has no room without evicting a busy adapter. Push each pair as
    a request whose Decision is ``Fleet.prewarm_decision(pod)``, through start/finish.
    O(adapters with min_pods x pods): call it from a timer, not per request.
    """
    plan: list[tuple[str, AdapterRef]] = []
    for adapter in adapters:
        if adapter.min_pods <= 0:
            continue
        warm = 0
        targets: list[str] = []
        for pod_id in rankings.rank(adapter.name):
            pod = pods[pod_id]
            if not pod.ready:
                continue
            if pod.residency.is_warm(adapter.task_id):
                warm += 1
            elif pod.residency.has_evictable_slot(adapter.pages):
                targets.append(pod_id)
            if warm + len(targets) >= adapter.min_pods:
                break
        needed = max(0, adapter.min_pods - warm)
        plan.extend((pod_id, adapter) for pod_id in targets[:needed])
    return plan


def warm_start_plan(
    pods: Mapping[str, PodState], new_pods: Sequence[str], hottest: Sequence[AdapterRef]
) -> list[tuple[str, AdapterRef]]:
    """(pod, adapter) pairs that give each new ready pod the hottest adapters before or with its first
    traffic (warm scale-up): ``hottest`` in order of demand, as many as fit in the pod's device pages,
    skipping adapters already warm there and any its cache could store only by evicting a busy adapter.
    Unknown or not-ready pods get nothing."""
    plan: list[tuple[str, AdapterRef]] = []
    for pod_id in new_pods:
        pod = pods.get(pod_id)
        if pod is None or not pod.ready:
            continue
        budget = pod.device_pages
        for adapter in hottest:
            if adapter.pages > budget:
                break
            budget -= adapter.pages
            if not pod.residency.is_warm(adapter.task_id) and pod.residency.has_evictable_slot(adapter.pages):
                plan.append((pod_id, adapter))
    return plan


def fleet_snapshot(
    model: str, policy: str, now_s: float, pods: Mapping[str, PodState], prefix: PrefixIndex, open_tickets: int
) -> FleetSnapshot:
    snapshots = []
    for pod_id in sorted(pods):
        pod = pods[pod_id]
        cache = pod.residency.cache
        snapshots.append(
            PodSnapshot(
                pod_id=pod_id,
                address=pod.address,
                uid=pod.uid,
                ready=pod.ready,
                inflight=pod.load.inflight,
                waiting_requests=pod.load.waiting(now_s),
                kv_cache_used_fraction=pod.load.kv_used(now_s),
                resident_task_ids=tuple(cache.resident()),
                host_pages_used=cache.host.used,
                host_pages=cache.host.capacity,
                cache_full_until_s=pod.cache_full_until_s,
                warm_routes_total=pod.warm_routes_total,
                cold_loads_total=pod.cold_loads_total,
                misses_total=pod.misses_total,
                cache_full_total=pod.cache_full_total,
                failures_total=pod.failures_total,
                evictions_total=pod.residency.evictions_total,
                kv_blocks_held=prefix.blocks_held(pod_id),
                kv_blocks_capacity=prefix.capacity(pod_id),
                kv_prefix_confidence=prefix.confidence(pod_id),
                batch_lines=pod.load.background,
                remote_inflight=pod.load.remote_inflight,
                remote_batch_lines=pod.load.remote_background,
            )
        )
    return FleetSnapshot(model, policy, now_s, tuple(snapshots), open_tickets)


@dataclass(frozen=True, slots=True)
class PodLoadSummary:
    """The scraped load of a base model's ready pods whose metrics are fresh."""

    pods_reporting: int
    requests: int
    """Running plus queued on those pods (the engines' own counts)."""
    kv_cache_used_fraction: float | None
    """Mean over those that export it; None when none does."""


def pod_load_summary(pods: Mapping[str, PodState], now_s: float) -> PodLoadSummary:
    fresh = [m for m in (p.load.fresh_metrics(now_s) for p in pods.values() if p.ready) if m is not None]
    kv = [m.kv_cache_used_fraction for m in fresh if m.kv_cache_used_fraction is not None]
    return PodLoadSummary(
        len(fresh), sum(m.active_requests + m.waiting_requests for m in fresh), sum(kv) / len(kv) if kv else None
    )


def check_books(
    pods: Mapping[str, PodState], open_tickets: Mapping[int, Ticket], loading: set[int], remote: RemoteBook
) -> None:
    """Tickets, loads in flight and in-flight counts agree with each pod's view (tests and teardown)."""
    open_per_pod: dict[tuple[str, str], int] = {}
    background_per_pod: dict[tuple[str, str], int] = {}
    background_tasks: dict[tuple[str, str], dict[int | None, int]] = {}
    for ticket in open_tickets.values():
        key = (ticket.pod, ticket.pod_uid)
        open_per_pod[key] = open_per_pod.get(key, 0) + 1
        if ticket.background:
            background_per_pod[key] = background_per_pod.get(key, 0) + 1
            tasks = background_tasks.setdefault(key, {})
            tasks[ticket.task_id] = tasks.get(ticket.task_id, 0) + 1
    loading_per_pod: dict[tuple[str, str, int], int] = {}
    for ticket_id in loading:
        ticket = open_tickets[ticket_id]
        assert ticket.task_id is not None and ticket.loads_weights
        key3 = (ticket.pod, ticket.pod_uid, ticket.task_id)
        loading_per_pod[key3] = loading_per_pod.get(key3, 0) + 1
    for pod in pods.values():
        held = {(pod.pod_id, pod.uid, task): n for task, n in pod.residency.loading.items()}
        mine = {key: n for key, n in loading_per_pod.items() if key[:2] == (pod.pod_id, pod.uid)}
        for task, n in remote.loading(pod.pod_id, pod.uid).items():
            mine[(pod.pod_id, pod.uid, task)] = mine.get((pod.pod_id, pod.uid, task), 0) + n
        if held != mine:
            raise AssertionError(f"{pod.pod_id}: loading {held} != loading tickets {mine}")
        expected = open_per_pod.get((pod.pod_id, pod.uid), 0)
        if pod.load.inflight != expected:
            raise AssertionError(f"{pod.pod_id}: in-flight {pod.load.inflight} != open tickets {expected}")
        background = background_per_pod.get((pod.pod_id, pod.uid), 0)
        if pod.load.background != background:
            raise AssertionError(f"{pod.pod_id}: batch lines in flight {pod.load.background} != tickets {background}")
        tasks = background_tasks.get((pod.pod_id, pod.uid), {})
        if pod.load.background_tasks != tasks:
            raise AssertionError(f"{pod.pod_id}: batch lines by adapter {pod.load.background_tasks} != tickets {tasks}")
        in_flight = remote.inflight(pod.pod_id, pod.uid)
        if pod.load.remote_inflight != in_flight:
            raise AssertionError(f"{pod.pod_id}: remote in-flight {pod.load.remote_inflight} != {in_flight}")
        remote_lines = remote.background(pod.pod_id, pod.uid)
        if pod.load.remote_background != remote_lines:
            raise AssertionError(f"{pod.pod_id}: remote batch lines {pod.load.remote_background} != {remote_lines}")
