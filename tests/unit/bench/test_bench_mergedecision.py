"""The merge-decision bench runs, and on its trace the advice never flaps (the property it reports)."""

from __future__ import annotations

from bench.mergedecision import _flips, run, section
from trtfleet.api import Suggestion


def test_the_trace_advises_the_busiest_and_never_flaps() -> None:
    tracks, pod_s, capacity = run(seed=7)
    by_name = {t.name: t for t in tracks}
    assert by_name["zipf-001"].suggestions[-1] is Suggestion.MERGED
    assert Suggestion.MERGED not in by_name["bursty"].suggestions  # 2-minute spikes are not a sustained share
    assert all(_flips(t.suggestions) <= 2 for t in tracks)
    assert "| ramp |" in section(tracks, pod_s, capacity)
