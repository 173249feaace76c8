"""Fixtures for the engine tooling's unit tests: a small, valid BaseModel spec to patch."""

from __future__ import annotations

import copy
from collections.abc import Callable, Mapping
from typing import Any

import pytest

from trtfleet.api.basemodel import BaseModelSpec

BASE_SPEC: dict[str, Any] = {
    "source": {"uri": "hf://meta-llama/Meta-Llama-3-8B-Instruct", "revision": "abc123"},
    "architecture": "llama",
    "dtype": "float16",
    "engine": {"gpu": {"product": "H100-80GB", "count": 1}},
    "runtime": "tensorrtllm",  # the engine flow; the API default is pytorch
}


def merge(base: Mapping[str, Any], patch: Mapping[str, Any]) -> dict[str, Any]:
    """``base`` with ``patch`` deep-merged into it (dicts merge, everything else replaces)."""
    out = copy.deepcopy(dict(base))
    for key, value in patch.items():
        if isinstance(value, Mapping) and isinstance(out.get(key), Mapping):
            out[key] = merge(out[key], value)
        else:
            out[key] = copy.deepcopy(value)
    return out


@pytest.fixture
def make_spec() -> Callable[..., BaseModelSpec]:
    def make(patch: Mapping[str, Any] | None = None) -> BaseModelSpec:
        return BaseModelSpec.model_validate(merge(BASE_SPEC, patch or {}))

    return make
