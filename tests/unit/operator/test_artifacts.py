"""The convert Job's report: its summary round trip and its errors."""

from __future__ import annotations

import pytest
from trtfleet_operator.artifacts import ArtifactSummary, SummaryError, parse_summary, summarize


def test_summary_round_trip_and_errors() -> None:
    manifest = {
        "rank": 8,
        "modules": ["attn_v", "attn_q"],
        "weights_bytes": 10,
        "dtype": "float16",
        "outputs": {"model.lora_weights.npy": {"sha256": "ab", "size_bytes": 10}},
    }
    summary = summarize(manifest)
    assert parse_summary(summary.to_json()) == summary == ArtifactSummary(8, ("attn_q", "attn_v"), "ab", 10, "float16")
    assert len(summary.to_json()) < 4096
    for bad in ("", "not json", '{"format": "other"}', '{"format": "trtfleet.convert-summary/v1", "rank": 0}'):
        with pytest.raises(SummaryError):
            parse_summary(bad)
