"""Merge advice and speculative decoding: what a merged Deployment keeps of the BaseModel's speculation, said
in the advice that suggests merging (and never in one that does not)."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest

from trtfleet.api import Suggestion
from trtfleet.api.speculative import SpeculativeSpec
from trtfleet.mergedecision import Costs, Memory, decide, speculation_after_merge

DRAFT: dict[str, Any] = {"source": {"uri": "hf://org/draft"}}


@pytest.mark.parametrize(
    ("speculative", "words"),
    [
        pytest.param(None, None, id="no-speculation"),
        pytest.param({"mode": "NGram"}, "fits the merged model as it fits the base", id="ngram"),
        pytest.param({"mode": "SA"}, "fits the merged model", id="suffix-automaton"),
        pytest.param({"mode": "MTP"}, "MTP layers", id="mtp"),
        pytest.param({"mode": "Eagle3", "draft": DRAFT}, "trained on the base model's outputs", id="eagle3"),
        pytest.param({"mode": "DraftTarget", "draft": DRAFT}, "runs without LoRA", id="draft-target"),
    ],
)
def test_what_merging_keeps(speculative: dict[str, Any] | None, words: str | None) -> None:
    spec = None if speculative is None else SpeculativeSpec.model_validate(speculative)
    note = speculation_after_merge(spec)
    assert (note is None) if words is None else (note is not None and words in note)


def test_the_note_comes_with_a_merge_suggestion_only() -> None:
    costs = Costs(pod_requests_per_s=10.0, sustain_s=0,
                  speculation=speculation_after_merge(SpeculativeSpec.model_validate({"mode": "NGram"})))
    merged = decide(costs, Memory(), 8.0, 0.0)
    assert merged.suggestion is Suggestion.MERGED and "speculation kept" in merged.message
    dynamic = decide(replace(costs), Memory(), 1.0, 0.0)
    assert dynamic.suggestion is Suggestion.DYNAMIC and "speculation" not in dynamic.message
