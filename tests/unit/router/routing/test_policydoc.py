"""docs/router-policies.md is generated from the policies (their docstrings and parameter models): it must match."""

from __future__ import annotations

from pathlib import Path

from trtfleet_router.routing.policies import REGISTRY
from trtfleet_router.routing.policydoc import markdown, policies_markdown

DOC = Path(__file__).resolve().parents[4] / "docs" / "router-policies.md"


def test_the_committed_page_is_the_generated_one() -> None:
    assert DOC.read_text(encoding="utf-8") == policies_markdown(), "run `make docs` and commit docs/router-policies.md"


def test_every_registered_policy_has_a_section() -> None:
    text = policies_markdown()
    for name in REGISTRY:
        assert f"## `{name}`" in text


def test_roles_become_code_spans() -> None:
    assert markdown("see :class:`~trtfleet_router.routing.types.CachesBusy` and ``x``") == "see `CachesBusy` and `x`"
