"""The "Fleet simulation (runtime pytorch)" section: the ``sim`` section's traces and policies on trtllm-serve pods.

    .venv/bin/python -m bench --quick --only sim --runtime pytorch

The pods are TensorRT-LLM PyTorch-backend pods as :mod:`bench.podsim` models them (``FleetSpec(runtime=
"pytorch")``): the pod reads a cold adapter's PEFT directory itself, one read at a time, never answers a miss,
and holds a request whose adapter finds the host tier pinned full. Their tiers come from the PyTorch capacity
plan of ``examples/basemodel-llama3-8b-pytorch.yaml`` (:func:`trtfleet_engines.pytorch.capacity.
plan_pytorch_capacity`): the pages that ``max_cpu_loras`` / ``max_loras`` allocate upstream, an adapter taking
the pages of its rank (what the router gets from ``status.capacity``), and the plan's KV tokens; at scale also
with the tiers counted in adapters (``max_cpu_loras`` / ``max_loras`` slots, one per adapter whatever its rank).
Scenarios as :mod:`bench.simbench` (quick sizes in brackets): scale (64 pods, 5,000 adapters, 1,000 req/s,
60 s [10 s]), the load sweep and the trace shapes; not the small caches (a ``hostMemoryBytes`` variant of the
engine flow) nor growth (decision time does not depend on the runtime).
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from trtfleet_engines.cli import load_basemodel
from trtfleet_engines.modeldims import resolve_dimensions
from trtfleet_engines.pytorch.capacity import plan_pytorch_capacity

from bench import report
from bench.optimal import BoundResult
from bench.profiles import h100_llama3_8b_fleet
from bench.simbench import SIM_COLUMNS, fleet_load, run_policies, trace_at_load, verdict
from bench.simulate import FleetSpec
from bench.traces import TraceRequest, TraceSpec, generate
from trtfleet.loracache import adapter_pages, spec_geometry

COMMAND = ".venv/bin/python -m bench{quick} --only sim --runtime pytorch"
EXAMPLE = report.ROOT / "examples" / "basemodel-llama3-8b-pytorch.yaml"
ADAPTER_RANK = 8  # the adapters of the tensorrt simulation (bench.profiles.h100_llama3_8b_fleet)
POD_READ_BYTES_PER_S = 5e8
READ_SOURCE = (
    "the router's `podReadBytesPerS` default (`trtfleet_router/routing/policies/cold_placement.py`: a read of "
    "the PEFT directory from the shared adapter volume plus TRT-LLM's PEFT-to-weights conversion on the pod), "
    "an assumption, not measured on a real trtllm-serve"
)
COLUMNS = tuple(("read_gb", "read GB") if key == "weights_gb" else (key, label) for key, label in SIM_COLUMNS)


class PlanError(Exception):
    """The example BaseModel has no LoRA plan the simulator can use."""


@dataclass(frozen=True, slots=True)
class PytorchTiers:
    """What the PyTorch capacity plan gives one pod: LoRA slots in adapters, KV cache in tokens."""

    source: str
    max_cpu_loras: int
    max_loras: int
    host_pages: int  # the pages those counts allocate upstream (status.capacity.loraHostPages)
    device_pages: int
    adapter_pages: int  # pages one ADAPTER_RANK adapter takes in them
    kv_cache_tokens: int
    max_batch_size: int
    max_num_tokens: int
    max_lora_rank: int


def plan_tiers(path: Path = EXAMPLE) -> PytorchTiers:
    """The tiers of ``path``'s BaseModel as :func:`plan_pytorch_capacity` plans them; PlanError when it has none."""
    spec = load_basemodel(str(path)).spec
    plan = plan_pytorch_capacity(spec)
    if plan.problems or plan.lora is None:
        raise PlanError(f"{path.name}: no usable LoRA plan ({'; '.join(plan.problems) or 'LoRA disabled'})")
    lora = plan.lora
    pages = adapter_pages(spec_geometry(spec, resolve_dimensions(spec).dims), ADAPTER_RANK)
    return PytorchTiers(path.name, lora.max_cpu_loras, lora.max_loras, lora.host.pages, lora.device.pages, pages,
                        plan.kv_cache_tokens, spec.engine.max_batch_size, spec.engine.max_num_tokens,
                        lora.max_lora_rank)


def pytorch_fleet(
    pods: int, tiers: PytorchTiers, *, slots: bool = False, read_bytes_per_s: float = POD_READ_BYTES_PER_S
) -> FleetSpec:
    """The tensorrt profile's pods, step model and rank-8 adapters, with the PyTorch plan's tiers and reads.

    Tiers in the pages upstream allocates, an adapter taking the pages of its rank (what the router gets from
    ``status.capacity``); ``slots``: in adapters instead, ``max_cpu_loras`` / ``max_loras`` of one slot each
    whatever the rank. A host -> device copy moves the adapter's own weights.
    """
    base = h100_llama3_8b_fleet(pods, rank=ADAPTER_RANK, max_batch_size=tiers.max_batch_size)
    host, device, pages = ((tiers.max_cpu_loras, tiers.max_loras, 1) if slots
                           else (tiers.host_pages, tiers.device_pages, tiers.adapter_pages))
    pod = dataclasses.replace(base.pod, host_pages=host, device_pages=device,
                              page_bytes=base.adapter_weights_bytes // pages, kv_capacity_tokens=tiers.kv_cache_tokens,
                              max_num_tokens=tiers.max_num_tokens)
    return dataclasses.replace(base, pod=pod, adapter_pages=pages, runtime="pytorch",
                               pod_read_bytes_per_s=read_bytes_per_s)


def policy_rows(trace: Sequence[TraceRequest], spec: FleetSpec) -> tuple[list[dict[str, Any]], BoundResult]:
    """Every policy on ``trace`` (:func:`bench.simbench.run_policies`) plus ``read_gb``, what the pods read."""
    rows, bound = run_policies(trace, spec)
    for row in rows:  # nothing travels with a request: what a cold adapter costs is the pod's read
        row["read_gb"] = int(row["pod_loads"]) * spec.adapter_weights_bytes / 1e9
    return rows, bound


def _verdict(rows: Sequence[dict[str, Any]], label: str) -> str:
    """:func:`bench.simbench.verdict` against the baselines only (not trtfleet's own adapter-only variant)."""
    return verdict([row for row in rows if row["policy"] != "adapter-affinity"], label)


def _scale(quick: bool, tiers: PytorchTiers) -> str:
    duration_s = 10 if quick else 60
    trace = generate(TraceSpec(name="scale", num_adapters=5000, zipf_alpha=1.0, rate_per_s=1000.0,
                               num_requests=1000 * duration_s, seed=11))
    texts = []
    for slots, label in ((False, "At scale"), (True, "At scale, one slot per adapter")):
        spec = pytorch_fleet(64, tiers, slots=slots)
        print(f"scale (pytorch, {'slots' if slots else 'pages'}): 64 pods x 5,000 adapters x 1,000 req/s, "
              f"{len(trace):,} requests", flush=True)
        rows, bound = policy_rows(trace, spec)
        report.save_json(f"sim-pytorch-scale{'-slots' if slots else ''}",
                         {"bound": bound.hit_rate, "spec": dataclasses.asdict(spec), "rows": rows})
        tier_text = (f"host `max_cpu_loras` {tiers.max_cpu_loras} and device `max_loras` {tiers.max_loras} "
                     "adapters, one slot each" if slots else
                     f"host {tiers.host_pages} and device {tiers.device_pages} pages, a rank-{ADAPTER_RANK} adapter "
                     f"{tiers.adapter_pages} page")
        texts += [
            _verdict(rows, label),
            f"**{label}** ({tier_text}): 64 pods, 5,000 adapters, Zipf 1.0, Poisson 1,000 req/s, {len(trace):,} "
            f"requests (the tensorrt section's trace); fleet load {fleet_load(trace, spec):.0%} of compute "
            f"capacity. Bound {bound.hit_rate:.3f} (K = {bound.capacity_slots:,}; ceiling "
            f"{bound.compulsory_ceiling:.3f}).",
            report.table(rows, COLUMNS),
        ]
    return "\n\n".join(texts)


def _load_sweep(quick: bool, tiers: PytorchTiers) -> str:
    spec = pytorch_fleet(16, tiers)
    base = TraceSpec(name="sweep", num_adapters=1000, zipf_alpha=1.0, num_requests=6000 if quick else 30_000,
                     seed=12)
    sweep: list[dict[str, Any]] = []
    lines = []
    for load in (0.3, 0.5, 0.7, 0.85):
        trace = trace_at_load(spec, load, base)
        print(f"load sweep (pytorch): {load:.0%}", flush=True)
        rows, bound = policy_rows(trace, spec)
        sweep += [{"load": load, "bound": bound.hit_rate, **row} for row in rows]
        lines.append(_verdict(rows, f"At {load:.0%} load"))
    report.save_json("sim-pytorch-load-sweep", sweep)
    columns = [("load", "load"), ("policy", "policy"), ("effective_hit_rate", "effective"), ("bound", "bound"),
               ("of_bound", "of bound"), ("ttft_p50_ms", "TTFT p50 ms"), ("ttft_p99_ms", "TTFT p99 ms"),
               ("e2e_p99_s", "e2e p99 s"), ("read_gb", "read GB"), ("errors", "errors")]
    return (f"**Load sweep**: 16 pods, 1,000 adapters, Zipf 1.0, {base.num_requests:,} requests per point.\n\n"
            + "\n".join(f"* {line}" for line in lines) + "\n\n" + report.table(sweep, columns))


def _shapes(quick: bool, tiers: PytorchTiers) -> str:
    spec = pytorch_fleet(16, tiers)
    requests = 6000 if quick else 30_000
    cases = [
        TraceSpec(name="zipf-n1000-a0.8", num_adapters=1000, zipf_alpha=0.8, num_requests=requests, seed=13),
        TraceSpec(name="zipf-n1000-a1.2", num_adapters=1000, zipf_alpha=1.2, num_requests=requests, seed=13),
        TraceSpec(name="onoff-n1000-a1.0", num_adapters=1000, arrivals="onoff", num_requests=requests, seed=13),
        TraceSpec(name="shift-n1000-a1.0", num_adapters=1000, shift_at_fraction=0.5, num_requests=requests, seed=13),
        TraceSpec(name="gie-regression", num_adapters=15, popularity="gie-regression", num_requests=requests,
                  seed=13),
    ]
    out: list[dict[str, Any]] = []
    for case in cases:
        case_spec = spec
        if case.popularity == "gie-regression":  # 15 adapters fit everywhere: host tiers cut to 4 pages, as there
            case_spec = dataclasses.replace(spec, pod=dataclasses.replace(spec.pod, host_pages=4))
        print(f"shape (pytorch) {case.name}", flush=True)
        rows, bound = policy_rows(trace_at_load(case_spec, 0.6, case), case_spec)
        out += [{"trace": case.name, "bound": bound.hit_rate, **row} for row in rows]
    report.save_json("sim-pytorch-shapes", out)
    columns = [("trace", "trace"), ("policy", "policy"), ("effective_hit_rate", "effective"), ("bound", "bound"),
               ("of_bound", "of bound"), ("ttft_p99_ms", "TTFT p99 ms"), ("e2e_p99_s", "e2e p99 s"),
               ("read_gb", "read GB"), ("errors", "errors")]
    return (f"**Trace shapes** at 60 % load on 16 pods ({requests:,} requests each); the GIE regression shape "
            "(15 adapters) with host tiers cut to 4 pages, as in the tensorrt section.\n\n"
            + report.table(out, columns))


def sim_section(quick: bool) -> str:
    tiers = plan_tiers()
    spec = pytorch_fleet(1, tiers)
    read_ms = spec.adapter_weights_bytes / spec.pod_read_bytes_per_s * 1e3
    model = (
        f"The `sim` section's simulator, traces, policies and GPU step model on trtllm-serve pods "
        f"(`FleetSpec(runtime=\"pytorch\")`, `bench/podsim.py`). Tiers from the PyTorch capacity plan of "
        f"`examples/{tiers.source}` (`trtfleet engines capacity`, `plan_pytorch_capacity`): `max_cpu_loras` "
        f"{tiers.max_cpu_loras} and `max_loras` {tiers.max_loras} adapters of `lora.maxRank` {tiers.max_lora_rank} "
        f"allocate a host tier of {tiers.host_pages} pages and a device tier of {tiers.device_pages} "
        f"(`status.capacity.loraHostPages` / `loraDevicePages`, what the router is given), where a "
        f"rank-{ADAPTER_RANK} adapter ({spec.adapter_weights_bytes / 2**20:.0f} MiB) takes {tiers.adapter_pages} "
        f"page: the tables below use these pages, as `docs/design/pytorch-backend.md` says a residency model must. The "
        f"second scale table counts adapters instead ({tiers.max_cpu_loras} host / {tiers.max_loras} device "
        f"slots, one per adapter whatever its rank), the strictest reading of `max_loras`. KV cache "
        f"{tiers.kv_cache_tokens:,} tokens, max batch {tiers.max_batch_size}. Nothing travels with a request: a "
        f"cold adapter is read by its pod at {spec.pod_read_bytes_per_s / 1e9:.1f} GB/s ({read_ms:.0f} ms per "
        f"adapter, one read at a time per pod), {READ_SOURCE}; a request whose adapter finds the host tier "
        "pinned full waits in the pod, never a miss or a cache-full error. `loads` are the pods' reads, "
        "`read GB` what they read."
    )
    started = os.getloadavg()[0]
    parts = [_scale(quick, tiers), _load_sweep(quick, tiers), _shapes(quick, tiers)]
    load = (f"Load average (1 min): {started:.1f} at the start, {os.getloadavg()[0]:.1f} at the end (shared "
            "cores; only the measured decision time, added to each latency, depends on it).")
    return "\n\n".join([report.provenance(COMMAND.format(quick=" --quick" if quick else "")) + " " + load, model,
                         *parts])
