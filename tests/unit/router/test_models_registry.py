"""Served names -> targets, engine limits, registry builders from the API types."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from trtfleet_router.chat import ChatMessage, chat_renderer
from trtfleet_router.errors import LimitExceeded, ModelNotFound
from trtfleet_router.models_registry import (
    AdapterEntry,
    BaseModelEntry,
    EngineLimits,
    ModelRegistry,
    base_entry_from_spec,
)

from trtfleet.api.basemodel import BaseModel
from trtfleet.loracache import declared_geometry, pages_for_adapter

ROOT = Path(__file__).resolve().parents[3]


def _base(name: str = "tiny") -> BaseModelEntry:
    return BaseModelEntry(name, "reference", EngineLimits(100, 150), chat_renderer("reference"), bytes_per_token=1.0)


def test_resolve() -> None:
    registry = ModelRegistry(
        [_base()],
        [
            AdapterEntry("up", "tiny", 5, "/a"),
            AdapterEntry("tiny", "tiny", 6, "/b"),
            AdapterEntry("orphan", "gone", 7, "/c"),
        ],
    )
    assert registry.resolve("tiny").adapter is None  # a base model wins over an adapter with its name
    target = registry.resolve("up")
    assert target.adapter is not None and target.adapter.ref.task_id == 5 and target.model_kind == "adapter"
    assert registry.adapter_by_task("tiny", 5).served_name == "up"
    assert registry.served_names() == ["tiny", "up"]
    for missing in ("orphan", "nope"):
        with pytest.raises(ModelNotFound):
            registry.resolve(missing)
    with pytest.raises(ModelNotFound):
        registry.adapter_by_task("tiny", 99)


def test_limits() -> None:
    base = _base()
    assert base.estimate_tokens("abcd") == 6  # 4 bytes + 2 specials
    assert base.resolve_max_tokens(50, None) == 100  # default 256 capped by the room left
    assert base.resolve_max_tokens(50, 100) == 100
    with pytest.raises(LimitExceeded, match="at most 100 input tokens"):
        base.resolve_max_tokens(101, 1)
    with pytest.raises(LimitExceeded, match="maxSeqLen of 150") as info:
        base.resolve_max_tokens(50, 101)
    assert info.value.param == "max_tokens" and info.value.code == "context_length_exceeded"


def test_entry_from_the_reference_example() -> None:
    obj = BaseModel.model_validate(yaml.safe_load((ROOT / "examples" / "basemodel-reference-tiny.yaml").read_text()))
    entry = base_entry_from_spec("tiny", obj.spec)
    assert entry.limits == EngineLimits(128, 256) and entry.architecture == "reference"
    assert entry.bytes_per_token == 1.0 and entry.weights_datatype == "FP16"
    assert entry.chat([ChatMessage("system", "s"), ChatMessage("user", "say hi")]) == "say hi"


def test_adapter_pages_from_geometry() -> None:
    obj = BaseModel.model_validate(
        {
            "spec": {
                "source": {"uri": "file:///m"},
                "architecture": "llama",
                "dimensions": {
                    "hiddenSize": 64,
                    "intermediateSize": 128,
                    "numLayers": 2,
                    "numAttentionHeads": 4,
                    "numKvHeads": 4,
                    "vocabSize": 260,
                },
                "lora": {
                    "maxRank": 8,
                    "cache": {"hostMemoryBytes": "2Mi", "optimalAdapterSize": 8, "maxAdapterSize": 8},
                },
            }
        }
    )
    geometry = declared_geometry(obj.spec)
    assert geometry is not None
    pages = pages_for_adapter(geometry, 8, None, 0)
    assert pages >= 1
    entry = base_entry_from_spec("m", obj.spec)
    assert entry.host_pages > 0 and entry.architecture == "llama"
    assert pages_for_adapter(None, None, None, 10) == 1
