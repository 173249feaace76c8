"""Batches on the reference fleet: throughput, adapter loads grouped vs input order, interactive TTFT.

    .venv/bin/python -m bench.batch                 # 10,000 lines (the docs/benchmarks/batch.md figures)
    .venv/bin/python -m bench.batch --lines 500     # a smoke run
    .venv/bin/python -m bench.batch --cases interactive,interactive+batch --batch-pod-slots 6,4 --repeats 3
    .venv/bin/python -m bench.batch --cases interactive,interactive+batch --trace   # where interactive time goes
    .venv/bin/python -m bench.batch --cases interactive,interactive+batch --batch-concurrency 24,6,2 \
        --cancel-after-interactive --repeats 3    # what each batch rate costs interactive requests
    .venv/bin/python -m bench.batch --workers 6 --trtfleet loadOverheadS=0.0016 --trtfleet inflightDelayS=0.01 \
        --cases interactive,interactive+batch --batch-reserve-pods 3,4 --batch-pod-slots 8 --cancel-after-interactive \
        --repeats 3
        # six pods, the policy priced for the reference workers (a cold load 1.6 ms, a request in flight 10 ms)

``--batch-pod-slots``, ``--batch-concurrency`` and ``--batch-reserve-pods`` take one value or several (one
``interactive+batch`` case per value, named ``interactive+batch slots=N``, ``conc=N`` or ``reserve=N``; the
reserve also takes ``auto``; several lists: every combination);
``--cancel-after-interactive`` cancels the batch when the interactive load ends (through the API, as a user
would), so the batch runs throughout the window and ``lines_per_s`` is the rate in it at any concurrency;
``--repeats N`` runs the cases N times, round by round (machine noise hits
every case alike), and ends with each case's medians: on a shared 2-core machine the interactive p99 of a
single 120 s run (about 240 requests: its third-slowest) moves by more than the 10 % the goal is about.

Fleet: :class:`bench.realfleet.RealFleet` (K real ``tritonserver`` reference workers with small host LoRA
caches, every engine step at least ``min_step_ms``: a pretend GPU step) and ``trtfleet router`` with
``--batch-store``. Four fresh fleets (cold caches each):

1. ``interactive``: interactive requests only (open loop, Poisson ``interactive_rps``, streamed, random
   adapters) for ``interactive_s``: the TTFT baseline;
2. ``interactive+batch``: the same interactive load while a grouped batch runs: TTFT with a batch;
3. ``batch grouped`` and 4. ``batch input order``: the batch alone, ``--batch-order model`` vs ``input``
   (the lines' adapters are drawn at random, so input order is what online arrival order would be):
   lines/s and the router's ``adapter_loads`` (requests that carried weights to a pod).

Batch lines and interactive requests use the same prompts' shape; greedy; ``max_tokens`` fixed.

``--trace`` runs the router at debug level and adds, from its ``upstream done`` lines, how the interactive
requests were routed (warm, or carrying weights) and where their time went: waiting for a decision in the
router, and from the decision to the pod's first answer (p99, warm and cold apart). The debug log costs the
router some CPU: compare traced runs with traced runs. Every case also reports the router's own
CPU and its event loop's lag over the window (:mod:`bench.routerwindow`); ``--router-nice N`` runs every case's
router at nice N (below 0: ahead of the pods for CPU). ``--batch-pods-cpus LIST`` (with a fixed reserve) keeps the
pods the reserve leaves to the batch on those CPUs and the reserved pods, the router and the load on the others, in
every case: pods with compute of their own, as near as a small machine gets.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sys
import threading
import time
from collections.abc import Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any

from trtfleet_router.routing.reserve import RESERVE_AUTO

from bench import report
from bench.batchapi import batch_input, start_batch, wait_batch
from bench.batchreport import WARMUP_REQUESTS, medians, section, table, trace_summary
from bench.batchscenario import DIMENSIONS, BatchScenario, batch_pods, expand_cases, parse_setting, setting_text
from bench.cpushare import Burn, burn_list, cpu_set, pin_split, pin_tree, renice_tree, tree_cpu_s
from bench.prefix_realfleet import setting
from bench.realfleet import RealFleet, parse_counters, synthetic_adapters
from bench.realscenario import host_cache_bytes_for
from bench.routerwindow import RouterWindow
from bench.simstats import percentile
from bench.traces import prompt_text

WORK = report.RESULTS / "batch"


def interactive_load(base_url: str, scenario: BatchScenario, names: Sequence[str]) -> dict[str, Any]:
    """Open loop: each request in its own thread at its Poisson time; TTFT of every answered request."""
    import openai

    client = openai.OpenAI(base_url=base_url + "/v1", api_key="unused", max_retries=0, timeout=120)
    rng = random.Random(scenario.seed + 1)
    answered: list[tuple[int, float]] = []  # (send index, TTFT s)
    errors: list[str] = []
    lock = threading.Lock()

    def one(index: int, model: str) -> None:
        began = time.perf_counter()
        try:
            stream = client.completions.create(
                model=model,
                prompt=prompt_text(f"live-{index}", scenario.prompt_tokens),
                max_tokens=scenario.max_tokens,
                temperature=0,
                stream=True,
            )
            first = None
            for chunk in stream:
                if first is None and chunk.choices and chunk.choices[0].text:
                    first = time.perf_counter() - began
            with lock:
                if first is not None:
                    answered.append((index, first))
        except openai.OpenAIError as exc:
            with lock:
                errors.append(str(exc)[:200])

    threads: list[threading.Thread] = []
    start = time.monotonic()
    at_s, index = rng.expovariate(scenario.interactive_rps), 0
    while at_s < scenario.interactive_s:
        delay = start + at_s - time.monotonic()
        if delay > 0:
            time.sleep(delay)
        thread = threading.Thread(target=one, args=(index, rng.choice(list(names))), daemon=True)
        thread.start()
        threads.append(thread)
        index += 1
        at_s += rng.expovariate(scenario.interactive_rps)
    for thread in threads:
        thread.join(300)
    ttfts = [t for _, t in sorted(answered)]  # in send order: the first WARMUP_REQUESTS meet a fresh fleet
    return {
        "requests": index,
        "errors": len(errors),
        "ttft_p50_ms": percentile(ttfts, 50) * 1000,
        "ttft_p99_ms": percentile(ttfts, 99) * 1000,
        "ttft_top5_ms": [round(t * 1000) for t in sorted(ttfts)[-5:]],
        "ttft_p99_past_warmup_ms": percentile(ttfts[WARMUP_REQUESTS:], 99) * 1000,
        "ttfts_ms": [round(t * 1000, 1) for t in ttfts],  # every round's, pooled over rounds (batchreport.py)
        "ttft_mean_ms": round(1000 * sum(ttfts) / max(1, len(ttfts)), 1),
    }


def policy_config(scenario: BatchScenario) -> dict[str, dict[str, float]] | None:
    """The router's routing config: the ``ttft_cost`` block's settings given (None: every default)."""
    return {"ttft_cost": dict(scenario.trtfleet)} if scenario.trtfleet else None


def run_case(
    case: str,
    scenario: BatchScenario,
    adapters: list[tuple[str, int, Path]],
    host_bytes: int,
    data: bytes | None,
    settings: dict[str, int] | None = None,
    label: str | None = None,
    burn_cores: float = 0.0,
) -> dict[str, Any]:
    """One case on a fresh fleet; ``settings`` (``slots``, ``conc``, ``reserve``) override the scenario's;
    ``burn_cores`` of CPU kept busy beside it (:class:`bench.cpushare.Burn`). ``fleet_cores``: the CPU the
    bench's child processes took (fleet and burn), per second of the interactive window or of the batch."""
    label = label or case
    work = WORK / label.replace(" ", "-").replace("+", "-").replace("=", "")
    order = "input" if case == "batch input order" else "model"
    values = {"slots": scenario.batch_pod_slots, "conc": scenario.batch_concurrency,
              "reserve": scenario.batch_reserve_pods, "nice": scenario.batch_pods_nice, **(settings or {})}
    router_args = [
        "--batch-store", str(work / "store"), "--batch-order", order, "--batch-concurrency", str(values["conc"]),
        "--batch-pod-slots", str(values["slots"]), "--batch-reserve-pods", setting_text("reserve", values["reserve"]),
    ]
    if scenario.batch_ttft_target_ms is not None:
        router_args += ["--batch-ttft-target-ms", f"{scenario.batch_ttft_target_ms:g}"]
    if scenario.trace:
        router_args += ["--log-level", "DEBUG"]  # the last --log-level wins
    router_log = work / "router.log"
    log_offset = router_log.stat().st_size if router_log.exists() else 0  # the log is appended to
    fleet = RealFleet("ttft-cost", scenario.workers, adapters, host_bytes, work, max_batch_size=scenario.max_batch_size,
                      seed=scenario.seed, min_step_ms=scenario.min_step_ms, router_args=router_args,
                      policy_config=policy_config(scenario))
    names = [name for name, _, _ in adapters]
    row: dict[str, Any] = {"case": label}
    with fleet, Burn(burn_cores):
        if scenario.router_nice:
            renice_tree(fleet.router_pid(), scenario.router_nice)
        if scenario.batch_pods_cpus:  # the batch's pods on cores of their own (also with no batch: the same fleet)
            pids = {f"w{i}": fleet.worker_pid(i) for i in range(scenario.workers)} | {"router": fleet.router_pid()}
            row["batch_pods_pinned"] = pin_split(pids, batch_pods(scenario.workers, values["reserve"]),
                                                 set(scenario.batch_pods_cpus), set(scenario.other_cpus))
            if scenario.router_cpus:
                pin_tree(fleet.router_pid(), set(scenario.router_cpus))
        if data is not None and values["nice"] and values["reserve"] > 0:
            row["batch_pods_niced"] = batch_pods(scenario.workers, values["reserve"])
            for pod in row["batch_pods_niced"]:
                renice_tree(fleet.worker_pid(int(pod[1:])), values["nice"])
        loads_before = parse_counters(fleet.router_metrics(), "trtfleet_router_adapter_loads")
        client = batch_id = None
        began, cpu_before, window = time.monotonic(), tree_cpu_s(), RouterWindow(fleet)
        if data is not None:
            client, batch_id = start_batch(fleet.base_url, data)
        if case.startswith("interactive"):
            row.update(interactive_load(fleet.base_url, scenario, names))
            if data is not None and values["reserve"] == RESERVE_AUTO:  # the size auto holds as the window ends
                row["reserved_pods"] = parse_counters(fleet.router_metrics(), "trtfleet_router_batch_reserved_pods")
            row["fleet_cores"] = round((tree_cpu_s() - cpu_before) / (time.monotonic() - began), 2)
            row.update(window.summary())
        if client is not None and batch_id is not None:
            if scenario.cancel_after_interactive and case.startswith("interactive"):
                took_s = time.monotonic() - began
                batch = client.batches.retrieve(batch_id)
                counts = batch.request_counts
                done = counts.completed if counts else 0
                if batch.status in ("validating", "in_progress"):
                    client.batches.cancel(batch_id)
                    batch = wait_batch(client, batch_id)
                else:  # it ended inside the window: the window did not run beside a batch all along
                    row["batch_ended_in_window"] = True
                    batch = wait_batch(client, batch_id)  # past "finalizing"
                    if batch.completed_at:  # its own time (whole seconds), not the window's
                        took_s = float(batch.completed_at - batch.created_at) or took_s
            else:
                batch = wait_batch(client, batch_id)
                took_s = time.monotonic() - began
                done = scenario.lines
                row.setdefault("fleet_cores", round((tree_cpu_s() - cpu_before) / took_s, 2))
                row.update({**window.summary(), **row})
            counts = batch.request_counts
            row.update(
                status=batch.status,
                completed=counts.completed if counts else 0,
                failed=counts.failed if counts else 0,
                batch_s=round(took_s, 1),
                lines_per_s=round(done / took_s, 1),
            )
            if scenario.cancel_after_interactive and case.startswith("interactive"):
                row["completed_in_window"] = done  # "completed" adds the lines in flight at the cancel
        loads = parse_counters(fleet.router_metrics(), "trtfleet_router_adapter_loads") - loads_before
        row["adapter_loads"] = int(loads)
        row["loads_per_adapter_per_pod"] = round(loads / (len(adapters) * scenario.workers), 2)
    if scenario.trace:
        with router_log.open(encoding="utf-8", errors="replace") as handle:
            handle.seek(log_offset)
            row.update(trace_summary(handle))
    return row


CASES = ("interactive", "interactive+batch", "batch grouped", "batch input order")


def run(
    scenario: BatchScenario, cases: Sequence[str] = CASES, dimensions: dict[str, Sequence[int]] | None = None,
    burns: Sequence[float] = (),
) -> list[dict[str, Any]]:
    """The cases in order, then the interactive load once beside each CPU burn of ``burns`` (cores)."""
    paths = synthetic_adapters(scenario.adapters, seed=scenario.seed)
    adapters = [(f"bench-{i}", 100 + i, path) for i, path in enumerate(paths)]
    host_bytes, _ = host_cache_bytes_for(scenario.host_cache_pages)
    data = batch_input(scenario, [name for name, _, _ in adapters])
    return [
        run_case(case, scenario, adapters, host_bytes, None if case == "interactive" else data, settings, label)
        for case, settings, label in expand_cases(cases, dimensions or {})
    ] + [run_case("interactive", scenario, adapters, host_bytes, None, label=f"interactive cpu={cores:g}",
                  burn_cores=cores) for cores in burns]


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.batch", description=__doc__.split("\n")[0])
    parser.add_argument("--lines", type=int, default=BatchScenario.lines)
    parser.add_argument("--adapters", type=int, default=BatchScenario.adapters)
    parser.add_argument("--workers", type=int, default=BatchScenario.workers, help="reference workers (pods)")
    parser.add_argument("--interactive-s", type=float, default=BatchScenario.interactive_s)
    parser.add_argument("--interactive-rps", type=float, default=BatchScenario.interactive_rps)
    parser.add_argument("--batch-pod-slots", default=str(BatchScenario.batch_pod_slots),
                        help="batch slots per pod; several, comma-separated: one interactive+batch case each")
    parser.add_argument("--min-step-ms", type=float, default=BatchScenario.min_step_ms,
                        help="the workers' pretend GPU step (the simulator's H100 profile: 5.2 ms fixed per step)")
    parser.add_argument("--batch-concurrency", default=str(BatchScenario.batch_concurrency),
                        help="the runner's lines in flight; several, comma-separated: one interactive+batch case each")
    parser.add_argument("--batch-reserve-pods", default=str(BatchScenario.batch_reserve_pods),
                        help="router's --batch-reserve-pods; several, comma-separated: one interactive+batch case each")
    parser.add_argument("--cancel-after-interactive", action="store_true",
                        help="cancel the batch when the interactive load ends (lines_per_s: the rate in that window)")
    parser.add_argument("--repeats", type=int, default=1,
                        help="rounds over the cases (interleaved); with more than one, a last table of medians")
    parser.add_argument("--batch-ttft-target-ms", type=float, default=BatchScenario.batch_ttft_target_ms,
                        help="AIMD target for interactive first answers (0: off)")
    parser.add_argument("--cases", default=",".join(CASES), help=f"comma-separated of {', '.join(CASES)}")
    parser.add_argument("--trtfleet", action="append", default=[], metavar="KEY=VALUE", type=setting,
                        help="a number in the trtfleet policy's routing section for every case, e.g. "
                        "loadOverheadS=0.0016 (repeatable; default: the policy's defaults)")
    parser.add_argument("--cpu-burn", type=burn_list, default=[],
                        help="cores, comma-separated: after the cases, the interactive load once beside each burn "
                        "of that much CPU, no batch (a control for what a batch takes of a small machine)")
    parser.add_argument("--batch-pods-nice", default="0", help="with a fixed reserve: the pods it leaves to the "
                        "batch at this nice value, 0-19 (their engines use CPU the reserved pods leave idle, as pods "
                        "with their own CPUs would); several, comma-separated: one interactive+batch case each")
    parser.add_argument("--router-nice", type=int, default=0, help="every case's router at this nice value, -20 "
                        "to 19 (below 0: ahead of the pods for CPU, as a router with its own CPU would be)")
    parser.add_argument("--batch-pods-cpus", type=cpu_set, default=set(), help="with a fixed reserve, every case: "
                        "the pods it leaves to the batch on these CPUs (taskset -c style), the other pods, the router "
                        "and the load on the rest (pods with compute of their own, as near as a small machine gets)")
    parser.add_argument("--router-cpus", type=cpu_set, default=set(), help="with --batch-pods-cpus: the router's "
                        "CPUs instead of the reserved pods' (e.g. the batch pods', with those at --batch-pods-nice 19)")
    parser.add_argument("--trace", action="store_true",
                        help="router at debug level: how interactive requests were routed and where their time went")
    parser.add_argument("--write-doc", action="store_true", help="write the Batch section of docs/benchmarks/batch.md")
    args = parser.parse_args(argv)
    cases = [c.strip() for c in args.cases.split(",") if c.strip()]
    if set(cases) - set(CASES):
        parser.error(f"unknown cases {sorted(set(cases) - set(CASES))}")
    try:
        dimensions = {name: [parse_setting(name, text) for text in getattr(args, flag[2:].replace("-", "_")).split(",")
                             if text.strip()] for name, flag in DIMENSIONS.items()}
    except ValueError:
        parser.error(f"{', '.join(DIMENSIONS.values())}: integers (or auto for reserve), comma-separated")
    lowest, nice = {"slots": 1, "conc": 1, "reserve": RESERVE_AUTO, "nice": 0}, dimensions["nice"]
    if (any(not values or min(values) < lowest[name] for name, values in dimensions.items()) or args.repeats < 1
            or args.workers < 1 or max(nice) > 19 or (max(nice) > 0 and min(dimensions["reserve"]) < 1)
            or not -20 <= args.router_nice <= 19 or (args.batch_pods_cpus and min(dimensions["reserve"]) < 1)
            or (args.router_cpus and not args.batch_pods_cpus)):
        parser.error("--batch-pod-slots and --batch-concurrency need values of at least 1, --batch-reserve-pods "
                     "at least 0 or auto, --batch-pods-nice 0 to 19 (above 0 only with reserves of 1 or more, as "
                     "--batch-pods-cpus; --router-cpus only with it), "
                     "--repeats and --workers at least 1, --router-nice -20 to 19")
    scenario = BatchScenario(lines=args.lines, adapters=args.adapters, workers=args.workers,
                             interactive_s=args.interactive_s,
                             interactive_rps=args.interactive_rps, batch_pod_slots=dimensions["slots"][0],
                             batch_concurrency=dimensions["conc"][0], batch_reserve_pods=dimensions["reserve"][0],
                             min_step_ms=args.min_step_ms, trtfleet=tuple(args.trtfleet),
                             batch_ttft_target_ms=args.batch_ttft_target_ms or None, trace=args.trace,
                             cancel_after_interactive=args.cancel_after_interactive,
                             batch_pods_nice=dimensions["nice"][0], router_nice=args.router_nice,
                             batch_pods_cpus=tuple(sorted(args.batch_pods_cpus)),
                             other_cpus=tuple(sorted(os.sched_getaffinity(0) - args.batch_pods_cpus)),
                             router_cpus=tuple(sorted(args.router_cpus)))
    load_before = os.getloadavg()
    rounds = []
    for index in range(args.repeats):
        rounds.append(run(scenario, cases, dimensions, args.cpu_burn))
        print(f"round {index + 1} of {args.repeats}:\n{table(rounds[-1])}", flush=True)
    rows = medians(rounds) if args.repeats > 1 else rounds[0]
    loads = (load_before, os.getloadavg())
    WORK.mkdir(parents=True, exist_ok=True)
    (WORK / "results.json").write_text(
        json.dumps({"scenario": asdict(scenario), "dimensions": dimensions, "rounds": rounds,
                    "rows": rows, "loadavg_before_after": loads}, indent=2)
    )
    if args.repeats > 1:
        print(f"medians over {args.repeats} rounds:")
    print(table(rows))
    if args.write_doc:
        given = sys.argv[1:] if argv is None else list(argv)
        command = " ".join([".venv/bin/python -m bench.batch", *given])
        report.write_section("batch", section(scenario, rows, command, loads))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
