"""bench.batch's report: the router's debug lines summed up, medians over rounds, the table, the docs section."""

from __future__ import annotations

import json
import math
import statistics
from collections.abc import Iterable, Sequence
from typing import Any

from bench import report
from bench.batchscenario import BatchScenario, setting_text
from bench.simstats import percentile


def trace_summary(lines: Iterable[str]) -> dict[str, Any]:
    """Of the interactive requests in the router's debug ``upstream done`` lines: how many went warm and how
    many carried weights, the longest wait for a decision, and the p99 from decision to first answer; and, past
    the first :data:`WARMUP_REQUESTS` of them (in log order), how many shared their pod with another request in
    flight as they started (``pod_load`` 2 or more) and their first answers against those that had it alone."""
    warm: list[float] = []
    cold: list[float] = []
    waits: list[float] = []
    started: list[tuple[float, int]] = []  # (first answer ms, pod load this request included), in log order
    for line in lines:
        if '"upstream done"' not in line:
            continue
        record = json.loads(line)
        if record.get("priority") != "interactive" or record.get("first_answer_ms") is None:
            continue
        (cold if record["send_weights"] else warm).append(record["first_answer_ms"])
        waits.append(record["decided_ms"])
        started.append((record["first_answer_ms"], record["pod_load"]))
    past = started[WARMUP_REQUESTS:]
    alone = [first for first, load in past if load <= 1]
    shared = [first for first, load in past if load > 1]

    def pct(values: list[float], q: float) -> float:
        return round(percentile(values, q), 1) if values else math.nan

    return {
        "interactive_warm": len(warm),
        "interactive_cold": len(cold),
        "decision_wait_max_ms": max(waits, default=math.nan),
        "first_answer_p99_ms_warm": pct(warm, 99),
        "first_answer_p99_ms_cold": pct(cold, 99),
        "shared_pod_past_warmup": len(shared),
        "first_answer_p50_ms_alone": pct(alone, 50),
        "first_answer_p99_ms_alone": pct(alone, 99),
        "first_answer_p50_ms_shared": pct(shared, 50),
        "first_answer_p99_ms_shared": pct(shared, 99),
    }


TRACE_COLUMNS = ("interactive_warm", "interactive_cold", "decision_wait_max_ms", "first_answer_p99_ms_warm",
                 "first_answer_p99_ms_cold", "shared_pod_past_warmup", "first_answer_p50_ms_alone",
                 "first_answer_p99_ms_alone", "first_answer_p50_ms_shared", "first_answer_p99_ms_shared")
ROUTER_COLUMNS = ("router_cores", "loop_lag_p50_ms", "loop_lag_p99_ms")  # bench/routerwindow.py
MEDIAN_COLUMNS = ("lines_per_s", "adapter_loads", "loads_per_adapter_per_pod", "ttft_p50_ms", "ttft_p99_ms",
                  "ttft_p99_past_warmup_ms", "ttft_mean_ms", "errors", "failed", "fleet_cores", "reserved_pods",
                  *ROUTER_COLUMNS, *TRACE_COLUMNS)
WARMUP_REQUESTS = 10
"""Interactive requests (in send order, about 5 s at 2 req/s) left out of the ``past_warmup`` figures: each case
starts a fresh fleet, whose first requests (three or four on the 3-worker fleet without a batch, one or two beside
a starting batch) took 70-250 ms in the 2026-12-06 runs and set a 252-request p99 by themselves."""


def medians(rounds: Sequence[Sequence[dict[str, Any]]]) -> list[dict[str, Any]]:
    """Per case (in the first round's order), the median of each numeric column over the rounds, and every
    round's interactive p99 (``p99_per_round_ms``)."""
    rows: list[dict[str, Any]] = []
    for first in rounds[0]:
        runs = [row for one in rounds for row in one if row["case"] == first["case"]]
        merged: dict[str, Any] = {"case": first["case"]}
        for column in MEDIAN_COLUMNS:
            values = [row[column] for row in runs if isinstance(row.get(column), int | float)]
            if values:
                merged[column] = statistics.median(values)
        p99s = [row["ttft_p99_ms"] for row in runs if isinstance(row.get("ttft_p99_ms"), float)]
        if p99s:
            merged["p99_per_round_ms"] = " / ".join(f"{value:.0f}" for value in p99s)
        pooled = [t for row in runs for t in row.get("ttfts_ms") or ()]
        if pooled:  # one p99 over every round's requests: steadier than the median of three tails
            merged["p99_pooled_ms"] = percentile(pooled, 99)
            steady = [t for row in runs for t in (row.get("ttfts_ms") or ())[WARMUP_REQUESTS:]]
            if steady:
                merged["p99_past_warmup_pooled_ms"] = percentile(steady, 99)
        rows.append(merged)
    return rows


def table(rows: Sequence[dict[str, Any]]) -> str:
    columns: tuple[str, ...] = ("case", "lines_per_s", "adapter_loads", "loads_per_adapter_per_pod", "ttft_p50_ms",
                                "ttft_p99_ms", "errors", "failed", "fleet_cores")
    if any("p99_per_round_ms" in row for row in rows):
        columns = (*columns[:6], "p99_per_round_ms", *columns[6:])
    if any("p99_pooled_ms" in row for row in rows):
        columns = (*columns[:6], "p99_pooled_ms", *columns[6:])
    steady = [name for name in ("ttft_p99_past_warmup_ms", "p99_past_warmup_pooled_ms")
              if any(name in row for row in rows)]
    columns = (*columns[:6], *steady, *columns[6:])
    if any("reserved_pods" in row for row in rows):
        columns = (*columns, "reserved_pods")
    columns = (*columns, *(name for name in ROUTER_COLUMNS if any(name in row for row in rows)))
    if any("interactive_cold" in row for row in rows):
        columns = (*columns, *TRACE_COLUMNS)
    lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    for row in rows:
        cells = []
        for column in columns:
            value = row.get(column, "")
            if not isinstance(value, float) or math.isnan(value):
                cells.append(str(value))
            elif column.startswith("loop_lag"):  # a loop's lag is a few ms: tenths
                cells.append(f"{value:.1f}")
            else:  # whole ms; a median of other floats without its binary tail (46.650000000000006: 46.65)
                cells.append(f"{value:.0f}" if "ms" in column else f"{round(value, 3):g}")
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def section(
    scenario: BatchScenario,
    rows: Sequence[dict[str, Any]],
    command: str,
    loads: tuple[tuple[float, float, float], tuple[float, float, float]],
) -> str:
    s = scenario
    aimd = (
        f"`--batch-ttft-target-ms {s.batch_ttft_target_ms:g}` (an interactive first answer slower than that "
        "halves the runner's lines in flight, at most once a second; they grow back by one per window of "
        "finished lines)"
        if s.batch_ttft_target_ms is not None
        else "no TTFT target"
    )
    count = setting_text("reserve", s.batch_reserve_pods)
    reserve = (f" `--batch-reserve-pods {count}` (that many pods take no batch line while interactive "
               "requests come, and take those first)" if s.batch_reserve_pods else "")
    before, after = loads
    window = (" The batch is cancelled when the interactive load ends (`lines_per_s`: its rate in that window)."
              if s.cancel_after_interactive else "")
    return f"""{report.provenance(command)}

{s.workers} real `tritonserver` reference workers (tiny Llama, max batch {s.max_batch_size}, every step at least
{s.min_step_ms:g} ms: a pretend GPU step), host LoRA cache {s.host_cache_pages} pages each, {s.adapters} synthetic
rank-8 adapters, `trtfleet router --batch-store` with `--batch-concurrency {s.batch_concurrency}
--batch-pod-slots {s.batch_pod_slots}`{reserve} and {aimd}; batch lines start on a pod only while its load is below
the slots and no interactive request waits in the router (interactive first). The batch: {s.lines:,}
`/v1/completions` lines ({s.prompt_tokens}-token prompts, `max_tokens` {s.max_tokens}, greedy), each line's
adapter drawn at random (input order = what online arrival order would be). Interactive load: Poisson
{s.interactive_rps:g} req/s for {s.interactive_s:g} s, streamed, random adapters; TTFT is the first streamed
text; `ttft_p99_past_warmup_ms` leaves each case's first {WARMUP_REQUESTS} interactive requests out (a fresh
fleet's first answers). A fresh fleet (cold caches) per case. `adapter_loads`: the router's
`adapter_loads_total` over the case (requests that carried weights); `loads_per_adapter_per_pod` divides it by
adapters x workers (1.0 = each adapter loaded once on each pod).{window}
Machine load average (1/5/15 min) {before[0]:.1f}/{before[1]:.1f}/{before[2]:.1f} at the start
and {after[0]:.1f}/{after[1]:.1f}/{after[2]:.1f} at the end (2 cores shared with other jobs).

{table(rows)}"""
