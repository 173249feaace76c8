"""QLoRA Adapters: a base variant per (BaseModel, quantization), shared, served and collected by the operator."""

from __future__ import annotations

from typing import Any

import pytest
from trtfleet_operator.config import OperatorConfig
from trtfleet_operator.names import DNS_LABEL_MAX, variant_serving_name
from trtfleet_operator.reconcile.adapter import reconcile_adapter
from trtfleet_operator.reconcile.types import AdapterObserved, Reconciliation

from tests.unit.operator.helpers import NOW, adapter, by_kind, condition, deployment_status, llama, stored, tiny
from trtfleet.api import AdapterStatus

CONFIG = OperatorConfig()
NF4 = {"quantType": "nf4", "doubleQuant": True, "computeDtype": "bfloat16"}


def qlora(name: str, quantization: dict[str, Any] | None = None, base: str = "llama3-8b", **kwargs: Any) -> Any:
    obj = adapter(base, name=name, **kwargs)
    obj["spec"]["training"] = {"baseQuantization": quantization or NF4}
    return obj


def run(obj: Any, observed: AdapterObserved) -> Reconciliation:
    result = reconcile_adapter(obj, observed, CONFIG, NOW)
    AdapterStatus.model_validate(result.status)
    return result


def observe(obj: Any, base: Any, *others: Any, **kwargs: Any) -> AdapterObserved:
    return AdapterObserved(basemodel=base, basemodels=(base,), qlora_adapters=(obj, *others), **kwargs)


def test_a_qlora_adapter_gets_a_variant_build_and_its_own_pods() -> None:
    obj, base = qlora("support"), llama()
    result = run(obj, observe(obj, base))
    variant = result.status["baseVariant"]
    assert variant["quantization"] == "nf4:64:double:bfloat16"
    assert variant["name"] == variant_serving_name("llama3-8b", variant["hash"])
    assert variant["name"].startswith("llama3-8b-q-") and len(variant["name"]) <= DNS_LABEL_MAX
    job = next(j for j in by_kind(result.apply, "Job") if j["metadata"]["name"].startswith("trtfleet-build-"))
    assert job["metadata"]["labels"]["trtfleet.io/variant"] == variant["name"]
    service = by_kind(result.apply, "Service")[0]
    assert service["metadata"]["labels"]["trtfleet.io/role"] == "variant"
    assert service["spec"]["selector"]["trtfleet.io/variant"] == variant["name"]
    assert condition(result.status, "BaseVariantReady")["reason"] == "Building"
    assert by_kind(result.apply, "Deployment") == []  # no pods before the variant's engine exists
    assert by_kind(result.apply, "Job")  # the convert Job runs meanwhile: the adapter is a dynamic one


def test_adapters_trained_alike_share_one_variant_and_others_get_their_own() -> None:
    base = llama()
    first, second, fp4 = qlora("a"), qlora("b"), qlora("c", {"quantType": "fp4"})
    observed = observe(first, base, second, fp4)
    a, b, c = (run(obj, observed) for obj in (first, second, fp4))
    assert a.status["baseVariant"] == b.status["baseVariant"] != c.status["baseVariant"]
    build = by_kind(a.apply, "Service")[0]
    assert [o["name"] for o in build["metadata"]["ownerReferences"]] == ["a", "b"]
    assert not any(o.get("controller") for o in build["metadata"]["ownerReferences"])
    assert [o["name"] for o in by_kind(c.apply, "Service")[0]["metadata"]["ownerReferences"]] == ["c"]


def test_reference_runtime_dequantizes_in_the_worker_and_reports_readiness() -> None:
    base = tiny()
    obj = qlora("tiny-qlora", base="tiny", source={"uri": "file:///opt/trtfleet/adapters/qlora"})
    result = run(obj, observe(obj, base))
    assert not [j for j in by_kind(result.apply, "Job") if "build" in j["metadata"]["name"]]
    deployment = by_kind(result.apply, "Deployment")[0]
    args = deployment["spec"]["template"]["spec"]["containers"][0]["args"]
    assert args[-2:] == ["--base-quantization", "nf4:64:double:bfloat16"]
    assert deployment["spec"]["replicas"] == 1
    assert deployment["spec"]["selector"]["matchLabels"]["trtfleet.io/role"] == "variant"
    assert condition(result.status, "BaseVariantReady")["reason"] == "RollingOut"
    ready = run(obj, observe(obj, base, variant_deployments=(deployment_status(deployment, ready=1),)))
    assert condition(ready.status, "BaseVariantReady")["status"] == "True"


def test_a_variant_nobody_wants_any_more_is_removed_by_its_owners() -> None:
    base = tiny()
    obj = qlora("tiny-qlora", base="tiny")
    old = stored({"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {
        "name": "tiny-q-0123456789", "ownerReferences": [{"uid": obj["metadata"]["uid"], "name": "tiny-qlora"}]}})
    foreign = stored({"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {
        "name": "tiny-q-abcdefabcd", "ownerReferences": [{"uid": "someone-else", "name": "other"}]}})
    result = run(obj, observe(obj, base, variant_deployments=(old, foreign)))
    deleted = {(ref.kind, ref.name) for ref in result.delete}
    assert ("Deployment", "tiny-q-0123456789") in deleted and ("Service", "tiny-q-0123456789") in deleted
    assert not any(name == "tiny-q-abcdefabcd" for _, name in deleted)


def test_a_weight_quantized_base_has_no_variant() -> None:
    obj, base = qlora("support"), llama(spec={"quantization": {"mode": "fp8"}})
    result = run(obj, observe(obj, base))
    assert condition(result.status, "BaseVariantReady")["reason"] == "Unsupported"
    assert "quantization.mode none" in condition(result.status, "BaseVariantReady")["message"]
    assert "baseVariant" not in result.status and by_kind(result.apply, "Service") == []


def test_plain_adapters_are_untouched() -> None:
    result = run(adapter(), AdapterObserved(basemodel=llama()))
    assert "baseVariant" not in result.status
    assert all(c["type"] != "BaseVariantReady" for c in result.status["conditions"])


@pytest.mark.parametrize("base", ["m", "a" * 63, "Upper.Case_name"])
def test_variant_names_are_dns_labels(base: str) -> None:
    name = variant_serving_name(base, "f" * 64)
    assert len(name) <= DNS_LABEL_MAX and name.endswith("-q-ffffffffff") and name[0].isalpha()
    assert name == name.lower()
