"""The engine hash: exhaustive over the BaseModel spec's fields (each one changes it or is listed as not
changing it), and its full and short forms."""

from __future__ import annotations

import typing
from collections.abc import Callable, Iterator
from typing import Any

import pydantic
import pytest
from trtfleet_engines.plan import engine_hash, engine_hash_short, plan_engine_build

from trtfleet.api.basemodel import BaseModelSpec

MakeSpec = Callable[..., BaseModelSpec]
MEDUSA: dict[str, Any] = {"mode": "Medusa", "draft": {"source": {"uri": "hf://org/heads"}, "numHeads": 4},
                          "allowUntestedWithLora": True}


CHANGES_HASH: list[tuple[str, tuple[str, ...], dict[str, Any]]] = [
    ("source uri", ("source.uri",), {"source": {"uri": "hf://org/other"}}),
    ("source revision", ("source.revision",), {"source": {"revision": "def456"}}),
    ("architecture", ("architecture",), {"architecture": "mistral"}),
    ("dtype", ("dtype",), {"dtype": "bfloat16"}),
    ("quantization mode", ("quantization.mode",), {"quantization": {"mode": "int8_weight_only"}}),
    ("kv cache dtype", ("quantization.kvCacheDtype",), {"quantization": {"kvCacheDtype": "int8"}}),
    (
        "tensor parallel",
        ("parallelism.tensor", "engine.gpu.count"),
        {"parallelism": {"tensor": 2}, "engine": {"gpu": {"count": 2}}},
    ),
    (
        "pipeline parallel",
        ("parallelism.pipeline",),
        {"parallelism": {"pipeline": 2}, "engine": {"gpu": {"count": 2}}},
    ),
    ("max batch size", ("engine.maxBatchSize",), {"engine": {"maxBatchSize": 128}}),
    ("max input len", ("engine.maxInputLen",), {"engine": {"maxInputLen": 1024}}),
    ("max seq len", ("engine.maxSeqLen",), {"engine": {"maxSeqLen": 8192}}),
    ("max num tokens", ("engine.maxNumTokens",), {"engine": {"maxNumTokens": 4096}}),
    (
        "image",
        ("engine.image",),
        {"engine": {"image": "nvcr.io/nvidia/tritonserver:26.01-trtllm-python-py3"}},
    ),
    ("gpu of another SM", ("engine.gpu.product",), {"engine": {"gpu": {"product": "A100-80GB"}}}),
    ("lora off", ("lora.enabled",), {"lora": {"enabled": False}}),
    ("lora max rank", ("lora.maxRank",), {"lora": {"maxRank": 16}}),
    ("lora modules", ("lora.targetModules",), {"lora": {"targetModules": ["attn_q", "attn_v"]}}),
    ("speculative", ("speculative",), {"speculative": MEDUSA}),
    ("speculative draft revision", ("speculative",),
     {"speculative": {**MEDUSA, "draft": {**MEDUSA["draft"], "source": {"uri": "hf://org/heads", "revision": "b"}}}}),
    ("speculative draft length", ("speculative",), {"speculative": {**MEDUSA, "maxDraftLen": 2}}),
]

KEEPS_HASH: list[tuple[str, tuple[str, ...], dict[str, Any]]] = [
    ("gpu of the same SM", ("engine.gpu.product",), {"engine": {"gpu": {"product": "H200"}}}),
    ("gpu product alias", ("engine.gpu.product",), {"engine": {"gpu": {"product": "nvidia-h100-80gb-hbm3"}}}),
    (
        "lora modules reordered",
        ("lora.targetModules",),
        {
            "lora": {
                "targetModules": [
                    "mlp_gate",
                    "mlp_4h_to_h",
                    "mlp_h_to_4h",
                    "attn_dense",
                    "attn_v",
                    "attn_k",
                    "attn_q",
                ]
            }
        },
    ),
    ("secret", ("source.secretRef",), {"source": {"secretRef": {"name": "hf-token"}}}),
    ("runtime", ("runtime",), {"runtime": "reference"}),
    (
        "dimensions",
        ("dimensions",),
        {
            "dimensions": {
                "hiddenSize": 8,
                "intermediateSize": 8,
                "numLayers": 1,
                "numAttentionHeads": 1,
                "numKvHeads": 1,
                "vocabSize": 8,
            }
        },
    ),
    (
        "cache gpu fraction",
        ("lora.cache.gpuMemoryFraction",),
        {"lora": {"cache": {"gpuMemoryFraction": 0.2}}},
    ),
    ("cache host bytes", ("lora.cache.hostMemoryBytes",), {"lora": {"cache": {"hostMemoryBytes": "8Gi"}}}),
    (
        "cache optimal size",
        ("lora.cache.optimalAdapterSize",),
        {"lora": {"cache": {"optimalAdapterSize": 32}}},
    ),
    ("cache max size", ("lora.cache.maxAdapterSize",), {"lora": {"cache": {"maxAdapterSize": 128}}}),
    ("replicas", ("serving.replicas",), {"serving": {"replicas": 9}}),
    ("replaces", ("serving.replaces",), {"serving": {"replaces": "older-model"}}),
    ("server", ("serving.server",), {"serving": {"server": "trtllm-serve"}}),
    ("autoscaling", ("autoscaling",), {"autoscaling": {"minReplicas": 0, "maxReplicas": 4}}),
    ("merging", ("merging",), {"merging": {"podRequestsPerSecond": 3.5, "mergeAbovePodFraction": 0.6}}),
    ("kv fraction", ("serving.kvCacheFreeGpuMemFraction",), {"serving": {"kvCacheFreeGpuMemFraction": 0.5}}),
    ("kv reuse", ("serving.enableKvCacheReuse",), {"serving": {"enableKvCacheReuse": False}}),
    ("chunked context", ("serving.enableChunkedContext",), {"serving": {"enableChunkedContext": False}}),
    ("scheduler", ("serving.batchSchedulerPolicy",), {"serving": {"batchSchedulerPolicy": "maxUtilization"}}),
    ("queue size", ("serving.maxQueueSize",), {"serving": {"maxQueueSize": 1}}),
    ("queue delay", ("serving.maxQueueDelayMicroseconds",), {"serving": {"maxQueueDelayMicroseconds": 7}}),
    ("chat template", ("serving.chatTemplate",), {"serving": {"chatTemplate": "{system}{messages}"}}),
    ("resources", ("serving.resources",), {"serving": {"resources": {"limits": {"cpu": "4"}}}}),
    ("rollout", ("serving.rollout",), {"serving": {"rollout": {"strategy": "Replace"}}}),
    ("node selector", ("serving.nodeSelector",), {"serving": {"nodeSelector": {"pool": "gpu"}}}),
    ("tolerations", ("serving.tolerations",), {"serving": {"tolerations": [{"operator": "Exists"}]}}),
    ("gateway failure mode", ("serving.gateway",), {"serving": {"gateway": {"failureMode": "FailOpen"}}}),
    ("waiting queue", ("serving.waitingQueuePolicy",), {"serving": {"waitingQueuePolicy": "fcfs"}}),
]


@pytest.mark.parametrize(("name", "paths", "patch"), CHANGES_HASH, ids=[c[0] for c in CHANGES_HASH])
def test_engine_hash_changes(
    make_spec: MakeSpec, name: str, paths: tuple[str, ...], patch: dict[str, Any]
) -> None:
    assert engine_hash(make_spec(patch)) != engine_hash(make_spec()), name


@pytest.mark.parametrize(("name", "paths", "patch"), KEEPS_HASH, ids=[c[0] for c in KEEPS_HASH])
def test_engine_hash_keeps(
    make_spec: MakeSpec, name: str, paths: tuple[str, ...], patch: dict[str, Any]
) -> None:
    assert engine_hash(make_spec(patch)) == engine_hash(make_spec()), name


def _leaf_paths(model: type[pydantic.BaseModel], prefix: str = "") -> Iterator[str]:
    for name, info in model.model_fields.items():
        alias = info.alias or name
        annotation = info.annotation
        if (
            isinstance(annotation, type)
            and issubclass(annotation, pydantic.BaseModel)
            and typing.get_origin(annotation) is None
        ):
            yield from _leaf_paths(annotation, f"{prefix}{alias}.")
        else:
            yield f"{prefix}{alias}"


def test_hash_tables_cover_every_spec_field() -> None:
    covered = {path for table in (CHANGES_HASH, KEEPS_HASH) for _, paths, _ in table for path in paths}
    assert set(_leaf_paths(BaseModelSpec)) - covered == set()


def test_hash_tables_cover_every_adapter_field_that_enters_a_hash() -> None:
    """Adapter fields in a hash: a QLoRA base variant's quantization (its table and tests:
    tests/unit/engines/test_engines_variant_plan.py)."""
    from tests.unit.engines.test_engines_variant_plan import VARIANT_CHANGES_HASH
    from trtfleet.api.adapter import BaseQuantizationSpec

    prefix = "training.baseQuantization."
    assert set(_leaf_paths(BaseQuantizationSpec, prefix)) == {f"{prefix}{name}" for name, _ in VARIANT_CHANGES_HASH}


def test_lora_settings_do_not_matter_when_lora_is_off(make_spec: MakeSpec) -> None:
    off = make_spec({"lora": {"enabled": False}})
    assert engine_hash(off) == engine_hash(
        make_spec({"lora": {"enabled": False, "maxRank": 8, "targetModules": ["attn_q"]}})
    )


def test_hash_forms(make_spec: MakeSpec) -> None:
    spec = make_spec()
    full = engine_hash(spec)
    assert len(full) == 64 and int(full, 16) >= 0
    assert engine_hash_short(spec) == full[:16] == plan_engine_build(spec).engine_hash_short
    assert plan_engine_build(spec).engine_hash == full
