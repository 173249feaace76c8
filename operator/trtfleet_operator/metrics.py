"""Every metric of the operator, in one place (prefix ``trtfleet_operator_``, base units in names).

No unbounded labels: ``kind`` is BaseModel, Adapter, Autoscale (the autoscaler's timer) or MergeAdvice
(the merge advice timer), ``result``, ``reason`` and ``mode`` one of a fixed set.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Histogram, start_http_server

PREFIX = "trtfleet_operator"
RESULTS = ("ok", "temporary_error", "permanent_error", "error")

REGISTRY = CollectorRegistry(auto_describe=True)

RECONCILES = Counter(
    f"{PREFIX}_reconciles_total", "Reconciles run, by kind and result.", ["kind", "result"], registry=REGISTRY
)
RECONCILE_DURATION = Histogram(
    f"{PREFIX}_reconcile_duration_seconds",
    "Wall time of one reconcile (reads, apply, status), by kind.",
    ["kind"],
    buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0),
    registry=REGISTRY,
)
BUILDS = Counter(
    f"{PREFIX}_builds_total",
    "Engine-build Jobs: started (a Job created), succeeded (an engine recorded), failed (a Job failed).",
    ["result"],
    registry=REGISTRY,
)
COLLECTIONS = Counter(
    f"{PREFIX}_collections_total",
    "Directories collected from the volumes: a deleted Adapter's artifact or an unused engine (what), and "
    "whether it was removed or left because its collect Job failed (result).",
    ["what", "result"],
    registry=REGISTRY,
)
TASKIDS_ALLOCATED = Counter(
    f"{PREFIX}_taskids_allocated_total", "LoRA task ids taken from a BaseModel's counter.", registry=REGISTRY
)
TASKID_CONFLICTS = Counter(
    f"{PREFIX}_taskid_conflicts_total",
    "Compare-and-swap attempts on status.nextTaskId that lost to a concurrent writer (409 Conflict).",
    registry=REGISTRY,
)
APPLIES = Counter(
    f"{PREFIX}_applies_total", "Server-side applies sent, by object kind.", ["object_kind"], registry=REGISTRY
)
SCALINGS = Counter(
    f"{PREFIX}_scalings_total",
    "Replica changes the autoscaler wrote, by reason (ScaledUp, ScaledDown, ScaledToZero, ScaledFromZero).",
    ["reason"],
    registry=REGISTRY,
)

MERGE_ADVICE_WRITES = Counter(
    f"{PREFIX}_merge_advice_writes_total",
    "Adapter status patches the merge advice timer sent (rounds that changed nothing worth a write send none).",
    registry=REGISTRY,
)
MERGE_SWITCHES = Counter(
    f"{PREFIX}_merge_switches_total",
    "mode auto Adapters switched by the merge advice, by the mode switched to (merged, dynamic).",
    ["mode"],
    registry=REGISTRY,
)

BUILD_COUNTER_RESULTS = {"build_started": "started", "build_succeeded": "succeeded", "build_failed": "failed"}


def serve(port: int, addr: str = "0.0.0.0") -> None:
    """Expose ``/metrics`` on ``port`` from a daemon thread."""
    start_http_server(port, addr=addr, registry=REGISTRY)
