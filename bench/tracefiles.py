"""Public request traces read from a file and scaled for the autoscaling benchmark.

Two formats (``/work/shared/data/README.md`` says where each comes from):

* ``azure``: the Azure LLM inference trace CSV (Azure/AzurePublicDataset, Splitwise), a header row
  ``TIMESTAMP,ContextTokens,GeneratedTokens`` and one request a line, the timestamp as
  ``YYYY-MM-DD HH:MM:SS[.fraction]``. It has no prefix blocks: each request becomes a
  :class:`bench.mooncake.MooncakeRow` without ``hash_ids``, its own conversation;
* ``mooncake``: the Mooncake JSONL trace, read by :func:`bench.mooncake.read_mooncake`.

A row that is not of its format is refused with its file and line number, nothing returned.

Scaling (:class:`ReplayScale`), every factor stated by the caller:

* **load** (:func:`scale_load`): every request ``load_factor`` times. The original keeps its time; each other
  copy arrives at a seeded uniform time between it and the trace's next later arrival, so every gap of the
  trace carries ``load_factor`` times its requests and the trace's rate curve keeps its shape at the trace's
  own resolution (its bursts and its lulls, its shot noise too). A fraction ``f`` of a copy is one more copy
  with probability ``f``. Each copy is a conversation of its own (its block ids moved past every id of the
  trace), so it draws its own adapter;
* **time**, **lengths** and **adapters**: :func:`bench.mooncake.mooncake_trace` with the scale's
  :class:`bench.mooncake.MooncakeScale`: arrival times times ``time_factor``, token counts times
  ``length_factor`` (cut to the pods' limits), adapters by that module's documented seeded rule (a Zipf draw
  per conversation). The requests carry no prefix blocks unless ``prefix_blocks``: the autoscaling benchmark
  sizes pods for the compute of every prompt token, the same work its bound and its pods' rate count (prefix
  reuse is what ``bench.prefixbench`` measures).
"""

from __future__ import annotations

import csv
import datetime as dt
import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from bench.mooncake import MooncakeRow, MooncakeScale, mooncake_trace, read_mooncake
from bench.traces import TraceRequest

FORMATS = ("azure", "mooncake")
AZURE_COLUMNS = ("TIMESTAMP", "ContextTokens", "GeneratedTokens")


def _azure_time_ms(text: str) -> float:
    """Milliseconds since the epoch (UTC assumed) of ``YYYY-MM-DD HH:MM:SS[.fraction]`` (any fraction digits)."""
    whole, _dot, fraction = text.strip().partition(".")
    if fraction and not fraction.isdigit():
        raise ValueError(f"bad fraction of a second {fraction!r}")
    stamp = dt.datetime.strptime(whole, "%Y-%m-%d %H:%M:%S").replace(tzinfo=dt.UTC)
    return stamp.timestamp() * 1000.0 + (float(f"0.{fraction}") * 1000.0 if fraction else 0.0)


def _count(text: str, column: str) -> int:
    value = int(text)
    if value < 0:
        raise ValueError(f"{column} is negative ({value})")
    return value


def read_azure(path: Path) -> list[MooncakeRow]:
    """The requests of an Azure LLM inference trace CSV, as rows without prefix blocks."""
    rows = []
    with path.open(encoding="utf-8", newline="") as handle:
        reader = csv.reader(handle)
        header = next(reader, None)
        if header is None or tuple(cell.strip() for cell in header) != AZURE_COLUMNS:
            raise ValueError(f"{path}:1: not an Azure LLM trace header: expected {','.join(AZURE_COLUMNS)}, "
                             f"got {','.join(header or [])!r}")
        for cells in reader:
            number = reader.line_num
            if not cells or not any(cell.strip() for cell in cells):
                continue
            try:
                if len(cells) != len(AZURE_COLUMNS):
                    raise ValueError(f"{len(cells)} fields, expected {len(AZURE_COLUMNS)}")
                rows.append(MooncakeRow(_azure_time_ms(cells[0]), _count(cells[1], AZURE_COLUMNS[1]),
                                        _count(cells[2], AZURE_COLUMNS[2]), ()))
            except ValueError as exc:
                raise ValueError(f"{path}:{number}: not an Azure LLM trace row ({exc})") from exc
    return rows


def format_of(path: Path) -> str:
    """The format a file name says: ``.csv`` azure, ``.jsonl`` mooncake."""
    suffixes = {".csv": "azure", ".jsonl": "mooncake"}
    if path.suffix not in suffixes:
        raise ValueError(f"{path}: cannot tell the trace format from its name (.csv: azure, .jsonl: mooncake); "
                         f"name it with --trace-format {' or '.join(FORMATS)}")
    return suffixes[path.suffix]


def read_trace_file(path: Path, trace_format: str | None = None) -> list[MooncakeRow]:
    """The rows of ``path`` in ``trace_format`` (one of ``FORMATS``; None: from the file name)."""
    chosen = trace_format or format_of(path)
    if chosen == "azure":
        return read_azure(path)
    if chosen == "mooncake":
        return read_mooncake(path)
    raise ValueError(f"unknown trace format {chosen!r}: one of {', '.join(FORMATS)}")


def scale_load(rows: list[MooncakeRow], load_factor: float, seed: int) -> list[MooncakeRow]:
    """Each row ``load_factor`` times, in time order (see the module docstring)."""
    if not load_factor > 0 or not math.isfinite(load_factor):
        raise ValueError(f"load factor must be positive, got {load_factor}")
    ordered = sorted(rows, key=lambda row: row.timestamp_ms)
    rng = np.random.default_rng(seed)
    whole = math.floor(load_factor)
    extra = rng.random(len(ordered)) < load_factor - whole
    id_span = 1 + max((max(row.hash_ids) for row in ordered if row.hash_ids), default=0)
    later_ms = [row.timestamp_ms for row in ordered]  # each row's next strictly later arrival (its own: none)
    following: float | None = None
    for index in range(len(ordered) - 2, -1, -1):
        if ordered[index + 1].timestamp_ms > ordered[index].timestamp_ms:
            following = ordered[index + 1].timestamp_ms
        if following is not None:
            later_ms[index] = following
    out: list[MooncakeRow] = []
    for index, row in enumerate(ordered):
        copies = whole + int(extra[index])
        gap_ms = later_ms[index] - row.timestamp_ms
        for copy in range(copies):
            at_ms = row.timestamp_ms if copy == 0 else row.timestamp_ms + gap_ms * float(rng.random())
            blocks = tuple(block + copy * id_span for block in row.hash_ids)
            out.append(MooncakeRow(at_ms, row.input_length, row.output_length, blocks))
    out.sort(key=lambda row: row.timestamp_ms)
    return out


@dataclass(frozen=True, slots=True)
class ReplayScale:
    load_factor: float = 1.0
    time_factor: float = 1.0
    length_factor: float = 1.0
    max_input_tokens: int = 8000  # the pods' max_num_tokens (8,192) less room for the batch's decode tokens
    max_output_tokens: int = 2048
    tokens_per_block: int = 32  # the simulated pods' KV block
    num_adapters: int = 5000
    zipf_alpha: float = 1.0
    seed: int = 0
    prefix_blocks: bool = False

    def mooncake(self) -> MooncakeScale:
        return MooncakeScale(
            length_factor=self.length_factor, time_factor=self.time_factor, max_input_tokens=self.max_input_tokens,
            max_output_tokens=self.max_output_tokens, tokens_per_block=self.tokens_per_block,
            num_adapters=self.num_adapters, zipf_alpha=self.zipf_alpha, seed=self.seed,
        )


def replay_trace(rows: list[MooncakeRow], scale: ReplayScale) -> tuple[list[TraceRequest], int]:
    """(the scaled trace, requests whose prompt was cut to ``max_input_tokens``)."""
    if not scale.time_factor > 0 or not scale.length_factor > 0:
        raise ValueError("time and length factors must be positive")
    return mooncake_trace(scale_load(rows, scale.load_factor, scale.seed), scale.mooncake(),
                          blocks=scale.prefix_blocks)
