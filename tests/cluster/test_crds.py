"""The trtfleet CRDs in a real kube-apiserver: install, examples, server-side validation
(OpenAPI schema + CEL rules), printer columns, status subresource and generation."""

from __future__ import annotations

import functools
import json
import textwrap
from pathlib import Path
from typing import Any

import pytest

from tests.support import inferencepool
from tests.support.controlplane import ControlPlane, eventually

pytestmark = pytest.mark.cluster

ROOT = Path(__file__).resolve().parents[2]
CRD_DIR = ROOT / "crds"
CRD_NAMES = ("basemodels.trtfleet.io", "adapters.trtfleet.io", "batches.trtfleet.io")
EXAMPLES = sorted((ROOT / "examples").glob("*.yaml"))


@pytest.fixture(scope="module")
def crds(control_plane: ControlPlane) -> ControlPlane:
    """The CRDs applied with plain `kubectl apply -f crds/` and Established."""
    control_plane.kubectl("apply", "-f", str(CRD_DIR))
    control_plane.wait_established(*CRD_NAMES)
    # Discovery follows Established closely, not atomically: poll until served.
    def served(resource: str) -> bool:
        return control_plane.kubectl("get", resource, "-A", check=False).returncode == 0

    for resource in ("basemodels", "adapters", "batches"):
        eventually(functools.partial(served, resource), timeout=30, what=f"{resource} to be served")
    inferencepool.install_httproute(control_plane)  # examples/httproute-inferencepool.yaml
    return control_plane


def apply(cp: ControlPlane, ns: str, doc: str, check: bool = True):  # type: ignore[no-untyped-def]
    return cp.kubectl("apply", "--validate=strict", "-n", ns, "-f", "-", input=doc, check=check)


def get(cp: ControlPlane, ns: str, kind: str, name: str) -> dict[str, Any]:
    obj: dict[str, Any] = json.loads(cp.kubectl("get", kind, name, "-n", ns, "-o", "json").stdout)
    return obj


def basemodel(spec: str, name: str = "bm") -> str:
    """A BaseModel manifest; ``spec`` is YAML (indented under spec:)."""
    return (
        f"apiVersion: trtfleet.io/v1alpha1\nkind: BaseModel\nmetadata:\n  name: {name}\nspec:\n"
        + textwrap.indent(textwrap.dedent(spec).strip(), "  ")
        + "\n"
    )


def adapter(spec: str, name: str = "ad") -> str:
    return (
        f"apiVersion: trtfleet.io/v1alpha1\nkind: Adapter\nmetadata:\n  name: {name}\nspec:\n"
        + textwrap.indent(textwrap.dedent(spec).strip(), "  ")
        + "\n"
    )


def batch(spec: str, name: str = "bt") -> str:
    return (
        f"apiVersion: trtfleet.io/v1alpha1\nkind: Batch\nmetadata:\n  name: {name}\nspec:\n"
        + textwrap.indent(textwrap.dedent(spec).strip(), "  ")
        + "\n"
    )


SRC = "source: {uri: 'hf://meta-llama/Meta-Llama-3-8B-Instruct'}"
VALID_BM = f"{SRC}\narchitecture: llama"
VALID_AD = "baseModel: llama3-8b\nsource: {uri: 's3://adapters/sql'}"


def test_crds_established(crds: ControlPlane) -> None:
    for name in CRD_NAMES:
        crd = json.loads(crds.kubectl("get", "crd", name, "-o", "json").stdout)
        conditions = {c["type"]: c["status"] for c in crd["status"]["conditions"]}
        assert conditions.get("Established") == "True", conditions
        assert conditions.get("NamesAccepted") == "True", conditions
    # Re-applying is a no-op (idempotent install).
    out = crds.kubectl("apply", "-f", str(CRD_DIR)).stdout
    assert "unchanged" in out


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.name)
def test_examples_apply(crds: ControlPlane, kube_namespace: str, path: Path) -> None:
    res = crds.kubectl("apply", "--validate=strict", "-n", kube_namespace, "-f", str(path))
    assert "created" in res.stdout
    assert crds.kubectl("get", "-n", kube_namespace, "-f", str(path), "-o", "name").stdout.strip()


# (manifest, substrings the API server's error must contain). A manifest with
# several documents applies all but the last first; those must succeed.
INVALID: dict[str, tuple[str, tuple[str, ...]]] = {
    "architecture-enum": (
        basemodel(f"{SRC}\narchitecture: gpt5"),
        ("spec.architecture", "Unsupported value", '"gpt5"'),
    ),
    "dtype-enum": (basemodel(f"{VALID_BM}\ndtype: float32"), ("spec.dtype", "Unsupported value")),
    "missing-source": (basemodel("architecture: llama"), ("spec.source", "Required value")),
    "missing-source-uri": (
        basemodel("source: {revision: main}\narchitecture: llama"),
        ("spec.source.uri", "Required value"),
    ),
    "bad-uri-scheme": (
        basemodel("source: {uri: 'http://example.com/model'}\narchitecture: llama"),
        ("spec.source.uri", "should match"),
    ),
    "negative-replicas": (
        basemodel(f"{VALID_BM}\nserving: {{replicas: -1}}"),
        ("spec.serving.replicas", "greater than or equal to 0"),
    ),
    "replicas-wrong-type": (
        basemodel(f"{VALID_BM}\nserving: {{replicas: two}}"),
        ("spec.serving.replicas", "integer"),
    ),
    "kv-fraction-zero": (
        basemodel(f"{VALID_BM}\nserving: {{kvCacheFreeGpuMemFraction: 0}}"),
        ("spec.serving.kvCacheFreeGpuMemFraction",),
    ),
    "lora-maxrank-3": (
        basemodel(f"{VALID_BM}\nlora: {{maxRank: 3}}"),
        ("spec.lora.maxRank", "lora.maxRank must be a power of two"),
    ),
    "lora-unknown-module": (
        basemodel(f"{VALID_BM}\nlora: {{targetModules: [attn_q, lm_head]}}"),
        ("spec.lora.targetModules[1]", "Unsupported value"),
    ),
    "lora-duplicate-module": (
        basemodel(f"{VALID_BM}\nlora: {{targetModules: [attn_q, attn_q]}}"),
        ("spec.lora.targetModules[1]", "Duplicate value"),
    ),
    "lora-cache-fraction": (
        basemodel(f"{VALID_BM}\nlora: {{cache: {{gpuMemoryFraction: 0.9}}}}"),
        ("spec.lora.cache.gpuMemoryFraction", "less than or equal to 0.5"),
    ),
    "input-not-below-seq": (
        basemodel(f"{VALID_BM}\nengine: {{maxInputLen: 4096, maxSeqLen: 4096}}"),
        ("spec.engine.maxInputLen", "must be smaller than engine.maxSeqLen"),
    ),
    "tp-pp-vs-gpus": (
        basemodel(f"{VALID_BM}\nparallelism: {{tensor: 2, pipeline: 2}}\nengine: {{gpu: {{count: 2}}}}"),
        ("parallelism.tensor * parallelism.pipeline must equal engine.gpu.count",),
    ),
    "fp8-int8-kv": (
        basemodel(f"{VALID_BM}\nquantization: {{mode: fp8, kvCacheDtype: int8}}"),
        ("spec.quantization", "fp8 cannot use an int8 KV cache"),
    ),
    "unknown-field": (basemodel(f"{VALID_BM}\nbogusField: 1"), ('unknown field "spec.bogusField"',)),
    "unknown-nested-field": (
        basemodel(f"{VALID_BM}\nengine: {{maxBatchSise: 8}}"),
        ('unknown field "spec.engine.maxBatchSise"',),
    ),
    "runtime-enum": (basemodel(f"{VALID_BM}\nruntime: vllm"), ("spec.runtime", "Unsupported value")),
    "merging-band-inverted": (
        basemodel(f"{VALID_BM}\nmerging: {{mergeAbovePodFraction: 0.3, unmergeBelowPodFraction: 0.4}}"),
        ("spec.merging.unmergeBelowPodFraction", "must be below merging.mergeAbovePodFraction"),
    ),
    "merging-capacity-zero": (
        basemodel(f"{VALID_BM}\nmerging: {{podRequestsPerSecond: 0}}"),
        ("spec.merging.podRequestsPerSecond", "greater than 0"),
    ),
    "batch-bad-input-scheme": (
        batch("input: 'http://example.com/in.jsonl'"),
        ("spec.input", "should match"),
    ),
    "batch-deadline-in-days": (batch("input: 's3://data/in.jsonl'\ndeadline: 1d"), ("spec.deadline", "should match")),
    "batch-priority-range": (
        batch("input: 's3://data/in.jsonl'\npriority: 101"),
        ("spec.priority", "less than or equal to 100"),
    ),
    "adapter-missing-basemodel": (
        adapter("source: {uri: 's3://adapters/sql'}"),
        ("spec.baseModel", "Required value"),
    ),
    "adapter-bad-servedname": (
        adapter(f"{VALID_AD}\nservedName: '-bad name'"),
        ("spec.servedName", "should match"),
    ),
    "adapter-mode-enum": (adapter(f"{VALID_AD}\nmode: fused"), ("spec.mode", "Unsupported value")),
    "adapter-missing-spec": (
        "apiVersion: trtfleet.io/v1alpha1\nkind: Adapter\nmetadata: {name: nospec}\n",
        ("spec", "Required value"),
    ),
    "adapter-basemodel-immutable": (
        adapter(VALID_AD) + "---\n" + adapter("baseModel: mistral-7b\nsource: {uri: 's3://adapters/sql'}"),
        ("spec.baseModel", "baseModel is immutable"),
    ),
}


@pytest.mark.parametrize(("manifest", "expected"), INVALID.values(), ids=INVALID.keys())
def test_invalid_objects_rejected(
    crds: ControlPlane, kube_namespace: str, manifest: str, expected: tuple[str, ...]
) -> None:
    *setup, doc = manifest.split("---\n")
    for earlier in setup:
        apply(crds, kube_namespace, earlier)
    res = apply(crds, kube_namespace, doc, check=False)
    assert res.returncode != 0, f"accepted:\n{doc}\n{res.stdout}"
    for text in expected:
        assert text in res.stderr, f"{text!r} not in: {res.stderr}"


def test_at_least_ten_invalid_cases() -> None:
    assert len(INVALID) >= 10


def test_printer_columns_status_subresource_and_generation(crds: ControlPlane, kube_namespace: str) -> None:
    ns, cp = kube_namespace, crds
    apply(cp, ns, basemodel(VALID_BM, name="gen"))
    obj = get(cp, ns, "basemodel", "gen")
    assert obj["metadata"]["generation"] == 1
    assert obj["spec"]["serving"]["replicas"] == 1  # structural defaults applied

    # status through the status subresource: stored, generation untouched.
    cp.kubectl(
        "patch",
        "basemodel",
        "gen",
        "-n",
        ns,
        "--subresource=status",
        "--type=merge",
        "-p",
        json.dumps({"status": {"phase": "Ready", "readyReplicas": 1, "engine": {"hash": "sha256-abc"}}}),
    )
    obj = get(cp, ns, "basemodel", "gen")
    assert obj["status"]["phase"] == "Ready"
    assert obj["metadata"]["generation"] == 1

    # status through the main resource is ignored.
    cp.kubectl("patch", "basemodel", "gen", "-n", ns, "--type=merge", "-p", '{"status": {"phase": "Failed"}}')
    assert get(cp, ns, "basemodel", "gen")["status"]["phase"] == "Ready"

    table = cp.kubectl("get", "basemodels", "-n", ns).stdout.splitlines()
    assert table[0].split() == ["NAME", "PHASE", "RUNTIME", "ENGINE", "READY", "DESIRED", "COLDSTART", "AGE"]
    assert table[1].split()[:6] == ["gen", "Ready", "pytorch", "sha256-abc", "1", "1"]  # the default runtime

    # a spec change bumps the generation.
    cp.kubectl(
        "patch", "basemodel", "gen", "-n", ns, "--type=merge", "-p", '{"spec": {"serving": {"replicas": 3}}}'
    )
    obj = get(cp, ns, "basemodel", "gen")
    assert obj["metadata"]["generation"] == 2
    assert obj["status"]["phase"] == "Ready"

    # Adapters have a status subresource too.
    apply(cp, ns, adapter(VALID_AD, name="sql"))
    cp.kubectl(
        "patch",
        "adapter",
        "sql",
        "-n",
        ns,
        "--subresource=status",
        "--type=merge",
        "-p",
        '{"status": {"phase": "Ready", "taskId": 1}}',
    )
    ad = get(cp, ns, "adapter", "sql")
    assert ad["status"]["taskId"] == 1 and ad["metadata"]["generation"] == 1
    assert "NAME" in cp.kubectl("get", "adapters", "-n", ns).stdout.splitlines()[0]
