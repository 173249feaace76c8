"""The merged view as JSON and back (``/fleet/v1/snapshot``), and the demand summary (``/fleet/v1/demand``).

Snapshot shape (one replica's whole view, plus how far it has applied each origin's events)::

    {"replica": "<id>", "seq": <its own last event>, "watermarks": {"<origin>": <last seq applied>},
     "peers": {"<origin>": "<advertised url>"},
     "fleets": {"<base model>": {
         "pods": [{"pod_id": ..., "uid": ..., "resident": [[task_id, pages], ...],   # LRU idle first, then busy
                   "suspect": [task_id, ...],
                   "blocks": "<base64>", "confidence": 0.8}],   # KV prefix blocks, least recent first
         "tickets": {"<origin>": [[ticket, pod_id, task_id, loading], ...]},    # requests in flight
         "prefill": {"<origin>": [[ticket, uncached tokens], ...]},           # of those, still prefilling
         "batch": {"<origin>": [ticket, ...]}}}}                               # of those, the batch lines

``tickets`` lists each origin's requests in flight (the replica's own included), i.e. its pins and
loads per origin: a replica that imports the snapshot books them as remote requests, so their later
``release`` events unpin them. ``blocks`` (the pod's :data:`SNAPSHOT_BLOCKS_PER_POD` most recent prefix blocks,
in the events' encoding) and ``prefill`` (the prompt work queued on a pod: requests with no first token yet)
let a replica that joins late price prefixes and queues as the others do from its first request; the origin's
later ``loaded`` or ``release`` ends such a prefill. ``batch`` names the batch lines among the requests, so the
joining replica leaves them out of interactive load as the others do. ``blocks``, ``confidence``, ``prefill`` and
``batch`` are new keys, so a replica of an earlier version reads such a snapshot as before. Pure functions over
fleets; no I/O.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from trtfleet_router.models_registry import ModelRegistry
from trtfleet_router.routing.events import EventKind, ResidencyEvent, decode_blocks, encode_blocks
from trtfleet_router.routing.fleet import ACTIVITY_WINDOW_S, Fleet
from trtfleet_router.routing.prefixindex import PrefillKey

Json = dict[str, Any]

SNAPSHOT_BLOCKS_PER_POD = 8192
"""The most recent prefix blocks a snapshot carries per pod: 88 kB each in base64 (about 6 MB at 64 pods), the
blocks most likely to be reused; older ones a joining replica learns from the pods' later requests."""


def export_view(
    fleets: Mapping[str, Fleet], replica_id: str, seq: int, watermarks: Mapping[str, int], peers: Mapping[str, str]
) -> Json:
    out: Json = {}
    for name, fleet in fleets.items():
        prefix = fleet.prefix_index
        pods = []
        for pod_id in sorted(fleet.pods):
            pod = fleet.pods[pod_id]
            host = pod.residency.cache.host
            resident = [[task_id, host.pages_of(task_id)] for task_id in pod.residency.cache.resident()]
            pods.append(
                {
                    "pod_id": pod_id,
                    "uid": pod.discovered_uid,
                    "resident": resident,
                    "suspect": sorted(pod.residency.suspect),
                    "blocks": encode_blocks(prefix.recent_blocks(pod_id, SNAPSHOT_BLOCKS_PER_POD)),
                    "confidence": round(prefix.confidence(pod_id), 4),
                }
            )
        tickets, prefill, batch = _in_flight(fleet, replica_id)
        out[name] = {"pods": pods, "tickets": tickets, "prefill": prefill, "batch": batch}
    return {"replica": replica_id, "seq": seq, "watermarks": dict(watermarks), "peers": dict(peers), "fleets": out}


def _in_flight(
    fleet: Fleet, replica_id: str
) -> tuple[dict[str, list[list[Any]]], dict[str, list[list[int]]], dict[str, list[int]]]:
    """``tickets``, ``prefill`` and ``batch`` of a fleet's snapshot: every origin's requests on pods still known
    as they were."""
    prefix = fleet.prefix_index
    tickets: dict[str, list[list[Any]]] = {}
    prefill: dict[str, list[list[int]]] = {}
    batch: dict[str, list[int]] = {}
    entries: list[tuple[str, int, str, int | None, bool, PrefillKey, bool]] = []
    for ticket in fleet.open_tickets():
        holder = fleet.pods.get(ticket.pod)
        if holder is not None and holder.uid == ticket.pod_uid:
            entries.append((replica_id, ticket.ticket_id, ticket.pod, ticket.task_id, False, ticket.ticket_id,
                            ticket.background))
    for origin, ticket_id, remote in fleet.remote.tickets():
        holder = fleet.pods.get(remote.pod_id)
        if holder is not None and holder.uid == remote.pod_epoch:
            entries.append((origin, ticket_id, remote.pod_id, remote.task_id, remote.loading, (origin, ticket_id),
                            remote.background))
    for origin, ticket_id, pod_id, task_id, loading, key, background in entries:
        tickets.setdefault(origin, []).append([ticket_id, pod_id, task_id, loading])
        if pending := prefix.pending_tokens(key):
            prefill.setdefault(origin, []).append([ticket_id, pending])
        if background:
            batch.setdefault(origin, []).append(ticket_id)
    return tickets, prefill, batch


def import_view(fleets: Mapping[str, Fleet], snapshot: Json) -> int:
    """Load a peer's snapshot into fleets that have booked nothing yet (a starting replica); returns the
    adapters stored. Pods this replica does not know (or knows as another incarnation) are skipped."""
    stored = 0
    for name, data in snapshot.get("fleets", {}).items():
        fleet = fleets.get(name)
        if fleet is None:
            continue
        uids: dict[str, str] = {}
        prefix = fleet.prefix_index
        for pod in data.get("pods", []):
            pod_id, uid = str(pod["pod_id"]), str(pod["uid"])
            state = fleet.pods.get(pod_id)
            if state is None or state.discovered_uid != uid:
                continue
            uids[pod_id] = uid
            for task_id, pages in pod.get("resident", []):
                stored += fleet.residency.put(pod_id, int(task_id), int(pages))
            if pod.get("blocks"):
                prefix.store(pod_id, decode_blocks(str(pod["blocks"])))
            if "confidence" in pod:
                prefix.set_confidence(pod_id, float(pod["confidence"]))
        booked: dict[tuple[str, int], str] = {}  # (origin, ticket) -> pod of the requests booked here
        batch = {(origin, int(ticket)) for origin, lines in data.get("batch", {}).items() for ticket in lines}
        for origin, tickets in data.get("tickets", {}).items():
            for ticket_id, pod_id, task_id, loading in tickets:
                if pod_id not in uids:
                    continue
                kind = EventKind.PUT if loading else EventKind.ACQUIRE
                pages = 0
                host = fleet.residency.pod(pod_id).cache.host
                if loading and task_id is not None and int(task_id) in host:
                    pages = host.pages_of(int(task_id))
                background = (origin, int(ticket_id)) in batch
                fleet.apply_remote(
                    ResidencyEvent(
                        origin, 0, name, pod_id, uids[pod_id], kind, int(ticket_id), task_id, pages, (), background
                    )
                )
                booked[(origin, int(ticket_id))] = pod_id
        for origin, pending in data.get("prefill", {}).items():
            for ticket_id, tokens in pending:
                on_pod = booked.get((origin, int(ticket_id)))
                if on_pod is not None:
                    prefix.prefill_started((origin, int(ticket_id)), on_pod, int(tokens))
        for pod in data.get("pods", []):
            if str(pod["pod_id"]) in uids:
                for task_id in pod.get("suspect", []):
                    fleet.residency.mark_cold(str(pod["pod_id"]), int(task_id))
    return stored


def demand_summary(fleets: Mapping[str, Fleet], registry: ModelRegistry, replica_id: str, now_s: float) -> Json:
    """Per base model, over every replica whose events reach this one: requests in flight, requests waiting
    in the pods' queues (scraped), requests per second per adapter over the window, adapters active in it."""
    bases: Json = {}
    for name, fleet in fleets.items():
        names = {entry.ref.task_id: entry.served_name for entry in registry.adapters_of(name)}
        counts = fleet.activity()
        waiting = [pod.load.waiting(now_s) for pod in fleet.pods.values()]
        known = [w for w in waiting if w is not None]
        per_adapter = {
            names.get(task_id, str(task_id)): round(n / ACTIVITY_WINDOW_S, 4)
            for task_id, n in sorted(counts.items(), key=lambda item: -item[1])
            if task_id is not None
        }
        bases[name] = {
            "inflight_requests": fleet.inflight_total(),
            "waiting_requests": sum(known) if known else None,
            "adapters_active": len(per_adapter),
            "adapter_requests_per_s": per_adapter,
            "base_requests_per_s": round(counts.get(None, 0) / ACTIVITY_WINDOW_S, 4),
        }
    return {"replica": replica_id, "window_s": ACTIVITY_WINDOW_S, "base_models": bases}
