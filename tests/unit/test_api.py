"""The API types: examples parse, Python-side rules mirror the CEL rules, CRDs do not drift."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from pydantic import ValidationError

from trtfleet.api import Adapter, BaseModel, BaseModelSpec, Batch, parse_quantity
from trtfleet.api.crdgen import render_crds

ROOT = Path(__file__).resolve().parents[2]


def _examples() -> list[Path]:
    """The examples of trtfleet's own kinds (the PVC and HTTPRoute examples are Kubernetes' and Gateway API's)."""
    paths = (ROOT / "examples").glob("*.yaml")
    return sorted(p for p in paths if yaml.safe_load(p.read_text())["apiVersion"].startswith("trtfleet.io/"))


@pytest.mark.parametrize("path", _examples(), ids=lambda p: p.name)
def test_examples_parse(path: Path) -> None:
    for doc in yaml.safe_load_all(path.read_text()):
        model = {"BaseModel": BaseModel, "Adapter": Adapter, "Batch": Batch}[doc["kind"]]
        obj = model.model_validate(doc)
        assert obj.metadata["name"]


def test_committed_crds_match_generation() -> None:
    for name, text in render_crds().items():
        assert (ROOT / "crds" / name).read_text() == text, f"crds/{name} is stale: run `make crds`"


SPEC = {"source": {"uri": "hf://org/model"}, "architecture": "llama"}


@pytest.mark.parametrize(
    ("patch", "message"),
    [
        ({"engine": {"maxInputLen": 4096, "maxSeqLen": 4096}}, "maxInputLen must be smaller"),
        ({"lora": {"maxRank": 3}}, "power of two"),
        ({"parallelism": {"tensor": 2}}, "must equal engine.gpu.count"),
        ({"quantization": {"mode": "fp8", "kvCacheDtype": "int8"}}, "int8 KV cache"),
        ({"source": {"uri": "ftp://x/y"}}, "String should match pattern"),
        ({"serving": {"replicas": -1}}, "greater than or equal to 0"),
        ({"bogus": 1}, "Extra inputs are not permitted"),
        ({"lora": {"targetModules": ["attn_q", "attn_q"]}}, "twice"),
    ],
)
def test_spec_rules(patch: dict[str, object], message: str) -> None:
    with pytest.raises(ValidationError, match=message):
        BaseModelSpec.model_validate({**SPEC, **patch})


def test_defaults_and_quantities() -> None:
    spec = BaseModelSpec.model_validate(SPEC)
    assert spec.lora.cache.host_bytes == 1 << 30
    assert spec.engine.max_seq_len > spec.engine.max_input_len
    assert parse_quantity("512Mi") == 512 << 20
    assert parse_quantity("2G") == 2_000_000_000
    with pytest.raises(ValueError, match="not a byte quantity"):
        parse_quantity("lots")


def test_crd_reference_doc_is_current() -> None:
    from trtfleet.api.docgen import render_crd_reference

    assert (ROOT / "docs" / "crd-reference.md").read_text() == render_crd_reference(), "run `make docs`"
