"""Where a batch line of an adapter goes: the pods that already hold the adapter, one adapter per pod (pure).

A batch line is not waiting for a first token, so it is placed for the fewest adapter loads, not the shortest
queue. The interactive policies spread a busy adapter to the next pod; for a batch that keeps its lines
going, that loads every adapter of the batch on every pod, each load evicting an adapter that interactive
requests may want next. Here (``slots``: the dispatcher's batch slots per pod):

1. ``batch-warm``: a candidate where the adapter is warm and the load is below the slots, least loaded first;
2. ``batch-spread``: a candidate that runs no other adapter's batch lines, below the slots, that can store the
   adapter: the adapter takes one more pod to itself (a batch of one adapter still uses every pod);
3. ``batch-wait``: the least loaded candidate where the adapter is warm, though it is full: the batch lane
   holds the line until that pod has room (the runner keeps one adapter per ready pod going meanwhile,
   ``trtfleet/batch/lanes.py``);
4. ``batch-cold``: no warm candidate: the one that can store the adapter with the fewest other adapters'
   batch lines, then the lowest load (the lane holds the line while that pod is full).

Equal candidates go in the adapter's rendezvous order, so every replica agrees. None when no candidate can
store the adapter: the fleet's policy decides (and raises :class:`~trtfleet_router.routing.types.CachesBusy`
if it cannot either). Only this router's batch lines are known per adapter; other replicas' count as load.
"""

from __future__ import annotations

from trtfleet_router.routing.framework import Choice, PodView, RoutingContext


def place_batch_line(ctx: RoutingContext) -> Choice | None:
    """The placement of ``ctx.request`` when it is a batch line of an adapter (``batch_slots`` set), else None."""
    adapter, slots = ctx.request.adapter, ctx.request.batch_slots
    if adapter is None or slots is None:
        return None
    task_id = adapter.task_id
    order = {pod_id: rank for rank, pod_id in enumerate(ctx.rankings.rank(adapter.name))}
    warm: list[tuple[int, int, PodView]] = []
    cold: list[tuple[int, int, int, PodView]] = []
    for pod, load in zip(ctx.pods, ctx.loads, strict=True):
        rank = order.get(pod.pod_id, len(order))
        residency = pod.residency
        if residency.is_warm(task_id):
            warm.append((load, rank, pod))
        elif residency.holds(task_id) or residency.has_evictable_slot(adapter.pages):
            others = sum(n for task, n in pod.load.background_tasks.items() if task != task_id)
            cold.append((others, load, rank, pod))
    room = [entry for entry in warm if entry[0] < slots]
    if room:
        return Choice(min(room, key=_warm_key)[2], "batch-warm")
    free = [entry for entry in cold if entry[0] == 0 and entry[1] < slots]
    if free:
        return Choice(min(free, key=_cold_key)[3], "batch-spread")
    if warm:
        return Choice(min(warm, key=_warm_key)[2], "batch-wait")
    if cold:
        return Choice(min(cold, key=_cold_key)[3], "batch-cold")
    return None


def _warm_key(entry: tuple[int, int, PodView]) -> tuple[int, int]:
    return entry[0], entry[1]


def _cold_key(entry: tuple[int, int, int, PodView]) -> tuple[int, int, int]:
    return entry[0], entry[1], entry[2]
