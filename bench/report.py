"""Markdown tables, plots and the benchmark pages' sections (the only module here that writes docs).

``docs/benchmarks.md`` is a hand-kept summary; the figures live in per-topic pages under
``docs/benchmarks/``. Each benchmark owns one ``## Heading`` of one page; :func:`write_section` replaces
the text between that heading's markers (``<!-- bench:KEY:start -->`` ... ``<!-- bench:KEY:end -->``)
and leaves every other section, including those other engineers write, untouched. A missing page or
heading is created.
"""

from __future__ import annotations

import datetime as dt
import json
import math
import os
import platform
import re
import subprocess
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
PAGES = ROOT / "docs" / "benchmarks"
IMG = ROOT / "docs" / "img"
RESULTS = ROOT / "bench" / "results"

SECTIONS: tuple[tuple[str, str, str], ...] = (  # (key, heading, page under docs/benchmarks/)
    ("routing", "## Routing quality (real runs)", "routing"),
    ("routing-pytorch", "## Routing quality (real runs, runtime pytorch)", "routing"),
    ("bound", "## Offline bound", "routing"),
    ("sim", "## Fleet simulation", "simulation"),
    ("sim-pytorch", "## Fleet simulation (runtime pytorch)", "simulation"),
    ("prefix", "## Prefix and adapter", "prefix"),
    ("overhead", "## Router overhead", "overhead"),
    ("decision", "## Routing decision time", "overhead"),
    ("trees", "## Two trees side by side (a restructuring's CPU)", "overhead"),
    ("batch", "## Batch", "batch"),
    ("replicas-real-shadow", "## Router replicas", "replicas"),
    ("replicas-real-peers", "## Router replicas", "replicas"),
    ("replicas-sim", "## Router replicas", "replicas"),
    ("autoscale", "## Autoscaling", "autoscaling"),
    ("autoscale-azure", "## Autoscaling on real traces", "autoscaling"),
    ("autoscale-mooncake", "## Autoscaling on real traces", "autoscaling"),
    ("spec-reference", "## Speculative decoding: the reference engine", "speculative"),
    ("spec-sim", "## Speculative decoding: the simulator", "speculative"),
    ("gateway", "## Gateway mode", "gateway"),
    ("adapters-sim", "## Adapters are free: the simulator", "adapters"),
    ("adapters-real", "## Adapters are free: the reference fleet", "adapters"),
    ("tenants-sim", "## Tenants: the simulator", "tenants"),
    ("tenants-real", "## Tenants: the reference fleet", "tenants"),
)
_PREAMBLE = """# Benchmarks: {page}

Part of [the benchmark record](../benchmarks.md): how each figure was measured (command, machine, date,
commit) and what it means. Definitions used throughout are on that page.
"""


def page_of(key: str) -> Path:
    """The page that holds section ``key``."""
    return PAGES / f"{_section(key)[2]}.md"


def _section(key: str) -> tuple[str, str, str]:
    for section in SECTIONS:
        if section[0] == key:
            return section
    raise KeyError(f"unknown benchmark section {key!r}; known: {', '.join(s[0] for s in SECTIONS)}")


def machine() -> dict[str, str]:
    cpu = "unknown"
    try:
        for line in Path("/proc/cpuinfo").read_text(encoding="utf-8").splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    try:
        commit = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True, check=False
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "status", "--porcelain"], cwd=ROOT, capture_output=True, text=True, check=False
        ).stdout.strip()
    except OSError:
        commit, dirty = "unknown", ""
    return {
        "cpu": cpu,
        "nproc": str(os.cpu_count()),
        "python": platform.python_version(),
        "date": dt.date.today().isoformat(),
        "commit": (commit or "unknown") + (" (with uncommitted changes)" if dirty else ""),
    }


def provenance(command: str) -> str:
    info = machine()
    return (
        f"Command: `{command}`. Machine: {info['nproc']} x {info['cpu']}, Python {info['python']}. "
        f"Date: {info['date']}. Commit: {info['commit']}."
    )


def fmt(value: Any, digits: int = 3) -> str:
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, int):
        return f"{value:,}"
    if isinstance(value, float):
        if math.isnan(value):
            return "-"
        if value != 0 and (abs(value) >= 1000 or abs(value) < 10 ** -(digits - 1)):
            return f"{value:,.0f}" if abs(value) >= 1000 else f"{value:.2g}"
        return f"{value:.{digits}g}"
    return str(value)


def table(rows: Sequence[Mapping[str, Any]], columns: Sequence[tuple[str, str]]) -> str:
    """A markdown table of ``rows`` with ``(key, header)`` columns."""
    head = "| " + " | ".join(header for _key, header in columns) + " |"
    rule = "|" + "|".join("---" for _ in columns) + "|"
    body = ["| " + " | ".join(fmt(row.get(key, "")) for key, _h in columns) + " |" for row in rows]
    return "\n".join([head, rule, *body])


def _markers(key: str) -> tuple[str, str]:
    return f"<!-- bench:{key}:start -->", f"<!-- bench:{key}:end -->"


def _skeleton(page: str) -> str:
    blocks: dict[str, list[str]] = {}  # one heading may hold several blocks, in SECTIONS order
    for key, heading, section_page in SECTIONS:
        if section_page == page:
            start, end = _markers(key)
            blocks.setdefault(heading, []).append(f"{start}\n_Not measured yet._\n{end}\n")
    preamble = _PREAMBLE.format(page=page.capitalize())
    return "\n".join([preamble, *(f"{heading}\n\n" + "\n".join(body) for heading, body in blocks.items())])


def write_section(key: str, body: str, doc: Path | None = None) -> None:
    """Replace the body of section ``key`` in its page (``doc`` overrides the path; the file or the heading is
    created if needed)."""
    _key, heading, page = _section(key)
    doc = doc or page_of(key)
    text = doc.read_text(encoding="utf-8") if doc.exists() else _skeleton(page)
    start, end = _markers(key)
    block = f"{start}\n{body.strip()}\n{end}"
    if start in text and end in text:
        before, rest = text.split(start, 1)
        _old, after = rest.split(end, 1)
        text = before + block + after
    elif heading in text:  # after the blocks of the same heading listed before it, else right after the heading
        keys = [other for other, other_heading, _page in SECTIONS if other_heading == heading]
        anchor = heading
        for other in keys[: keys.index(key)]:
            if _markers(other)[1] in text:
                anchor = _markers(other)[1]
        text = text.replace(anchor, f"{anchor}\n\n{block}", 1)
    else:
        text = text.rstrip() + f"\n\n{heading}\n\n{block}\n"
    doc.parent.mkdir(parents=True, exist_ok=True)
    doc.write_text(text, encoding="utf-8")


def save_json(name: str, data: Any) -> Path:
    RESULTS.mkdir(parents=True, exist_ok=True)
    path = RESULTS / f"{name}.json"
    path.write_text(json.dumps(data, indent=2, default=str) + "\n", encoding="utf-8")
    return path


CALIBRATION_HEAD = "**Calibration against the real runs**"
KEPT_NOTE = "_The calibration above was made by an earlier run of this section"


def kept_calibration(doc: Path | None = None) -> dict[str, Any] | None:
    """The calibration block of the ``sim`` section now in its page (or ``doc``), to keep when the real runs are
    not re-run: its text, marked with the date and commit of the run that made it; None when there is none."""
    doc = doc or page_of("sim")
    text = doc.read_text(encoding="utf-8") if doc.exists() else ""
    start, end = _markers("sim")
    if start not in text or end not in text:
        return None
    old = text.split(start, 1)[1].split(end, 1)[0]
    if CALIBRATION_HEAD not in old:
        return None
    block = CALIBRATION_HEAD + old.split(CALIBRATION_HEAD, 1)[1].rstrip()
    if KEPT_NOTE not in block:
        made = re.search(r"Date: ([^.]+)\. Commit: ([^\n]+?)\.(?:\n|$)", old)
        when = f", on {made.group(1)} at commit {made.group(2)}" if made else ""
        block += f"\n\n{KEPT_NOTE}{when}; the real runs were not repeated for this one._"
    return {"text": block}


def pyplot() -> Any:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def save_figure(fig: Any, name: str) -> str:
    """Save to docs/img/NAME.png; returns the path relative to a page under docs/benchmarks/."""
    IMG.mkdir(parents=True, exist_ok=True)
    fig.tight_layout()
    fig.savefig(IMG / f"{name}.png", dpi=110)
    pyplot().close(fig)
    return f"../img/{name}.png"


def bar_panels(
    rows: Sequence[Mapping[str, Any]], panels: Sequence[tuple[str, str]], name: str, title: str,
    *, reference: Mapping[str, float] | None = None,
) -> str:
    """One bar chart per ``(key, label)`` panel, a bar per policy; ``reference`` draws a dashed line
    (e.g. the bound) on the panel of that key."""
    plt = pyplot()
    fig, axes = plt.subplots(1, len(panels), figsize=(3.2 * len(panels), 3.4))
    axes = list(axes) if len(panels) > 1 else [axes]
    names = [str(row["policy"]) for row in rows]
    colours = ["#999999", "#7a9cc6", "#d4a35a", "#8fbf7f", "#c0392b"]
    for axis, (key, label) in zip(axes, panels, strict=True):
        values = [float(row.get(key) or 0.0) for row in rows]
        axis.bar(range(len(rows)), values, color=[colours[i % len(colours)] for i in range(len(rows))])
        axis.set_xticks(range(len(rows)), names, rotation=40, ha="right", fontsize=8)
        axis.set_title(label, fontsize=9)
        if reference and key in reference:
            axis.axhline(reference[key], color="black", linestyle="--", linewidth=1)
            axis.text(len(rows) - 0.5, reference[key], "bound", fontsize=7, va="bottom", ha="right")
    fig.suptitle(title, fontsize=10)
    return save_figure(fig, name)
