"""QLoRA Adapters on a real kube-apiserver + kube-controller-manager: ``kubectl apply`` of Adapters with
``training.baseQuantization`` gives one base variant per (BaseModel, quantization), shared by the Adapters
trained alike and garbage-collected with the last of them; the API server refuses what the CRD forbids. On a
``tensorrtllm`` BaseModel the variant has a build Job of its own whose plan dequantizes before converting. The
test plays the kubelet for Job pods, as the other operator cluster tests do.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
import yaml
from trtfleet_operator.names import plan_configmap_name

from tests.cluster.operator.harness import (
    BUILDS,
    ROOT,
    OperatorProcess,
    apply,
    cond,
    finish_job_pod,
    get,
    items,
    live_jobs,
    llama_doc,
    wait_until,
)

pytestmark = pytest.mark.cluster

VARIANTS = "trtfleet.io/role=variant"
NF4 = {"quantType": "nf4", "blockSize": 64, "computeDtype": "float32"}


def qlora(name: str, base: str, quantization: dict[str, Any], **spec: Any) -> str:
    return yaml.safe_dump({
        "apiVersion": "trtfleet.io/v1alpha1",
        "kind": "Adapter",
        "metadata": {"name": name},
        "spec": {"baseModel": base, "source": {"uri": f"file:///opt/trtfleet/adapters/{name}"},
                 "training": {"baseQuantization": quantization}, **spec},
    })


def variant_of(cp: Any, ns: str, name: str) -> dict[str, Any]:
    def probe() -> dict[str, Any] | None:
        status = (get(cp, ns, "adapter", name) or {}).get("status") or {}
        return status.get("baseVariant")

    return dict(wait_until(probe, 30, f"adapter {name}'s status.baseVariant"))


def owners(obj: dict[str, Any] | None) -> list[str]:
    return sorted(o["name"] for o in (obj or {}).get("metadata", {}).get("ownerReferences") or [])


def test_adapters_trained_alike_share_a_variant_collected_with_the_last(operator: OperatorProcess) -> None:
    cp, ns = operator.cp, operator.namespace
    apply(cp, ns, (ROOT / "examples" / "basemodel-reference-tiny.yaml").read_text())
    apply(cp, ns, qlora("upper-a", "tiny", NF4))
    apply(cp, ns, qlora("upper-b", "tiny", NF4))
    apply(cp, ns, qlora("upper-fp4", "tiny", {**NF4, "quantType": "fp4"}))
    a, b, fp4 = (variant_of(cp, ns, n) for n in ("upper-a", "upper-b", "upper-fp4"))
    assert a == b and a["quantization"] == "nf4:64:float32"
    assert fp4["name"] != a["name"] and fp4["quantization"] == "fp4:64:float32"
    shared = wait_until(lambda: (d := get(cp, ns, "deployment", a["name"])) and owners(d) == ["upper-a", "upper-b"]
                        and d, 30, "the shared variant Deployment owned by both Adapters")
    container = shared["spec"]["template"]["spec"]["containers"][0]
    assert container["command"] == ["trtfleet", "worker"]
    assert container["args"][-2:] == ["--base-quantization", "nf4:64:float32"]
    assert {d["metadata"]["name"] for d in items(cp, ns, "deployments", VARIANTS)} == {a["name"], fp4["name"]}
    service = get(cp, ns, "service", a["name"])
    assert service is not None and service["spec"]["selector"]["trtfleet.io/variant"] == a["name"]
    base_service = get(cp, ns, "service", "tiny")
    assert base_service is not None and base_service["spec"]["selector"]["trtfleet.io/role"] == "base"
    variant_ready = cond(get(cp, ns, "adapter", "upper-a"), "BaseVariantReady")
    assert variant_ready["reason"] in ("RollingOut", "RolloutComplete") and a["name"] in variant_ready["message"]

    cp.kubectl("delete", "adapter", "upper-a", "-n", ns, "--wait=true")
    wait_until(lambda: owners(get(cp, ns, "deployment", a["name"])) == ["upper-b"], 30,
               "the variant handed over to the remaining Adapter")
    cp.kubectl("delete", "adapter", "upper-b", "-n", ns, "--wait=true")
    wait_until(lambda: get(cp, ns, "deployment", a["name"]) is None and get(cp, ns, "service", a["name"]) is None,
               60, "the variant nobody needs garbage-collected")
    assert get(cp, ns, "deployment", fp4["name"]) is not None  # the other quantization's variant stays


def test_the_api_server_refuses_merged_qlora_and_keeps_training_immutable(operator: OperatorProcess) -> None:
    cp, ns = operator.cp, operator.namespace
    refused = cp.kubectl("apply", "-n", ns, "-f", "-", input=qlora("m", "tiny", NF4, mode="merged"), check=False)
    assert refused.returncode != 0 and "mode merged cannot be combined with training.baseQuantization" in (
        refused.stderr
    )
    auto = cp.kubectl("apply", "-n", ns, "-f", "-", input=qlora("a", "tiny", NF4, mode="auto"), check=False)
    assert auto.returncode != 0 and "nor mode auto" in auto.stderr
    odd = cp.kubectl("apply", "-n", ns, "-f", "-", input=qlora("odd", "tiny", {**NF4, "blockSize": 100}), check=False)
    assert odd.returncode != 0 and "blockSize" in odd.stderr
    apply(cp, ns, qlora("fixed", "tiny", NF4))
    changed = cp.kubectl("apply", "-n", ns, "-f", "-", input=qlora("fixed", "tiny", {**NF4, "quantType": "fp4"}),
                         check=False)
    assert changed.returncode != 0 and "training is immutable" in changed.stderr
    plain = yaml.safe_load(qlora("fixed", "tiny", NF4))
    del plain["spec"]["training"]
    removed = cp.kubectl("apply", "-n", ns, "-f", "-", input=yaml.safe_dump(plain), check=False)
    assert removed.returncode != 0 and "training is immutable" in removed.stderr
    apply(cp, ns, yaml.safe_dump({**plain, "metadata": {"name": "plain"}}))
    added = cp.kubectl("apply", "-n", ns, "-f", "-", input=qlora("plain", "tiny", NF4), check=False)
    assert added.returncode != 0 and "training is immutable" in added.stderr


def test_a_tensorrtllm_variant_is_built_from_the_dequantized_checkpoint(operator: OperatorProcess) -> None:
    cp, ns = operator.cp, operator.namespace
    apply(cp, ns, llama_doc(ns))
    apply(cp, ns, qlora("support", "llama3-8b", {**NF4, "doubleQuant": True, "computeDtype": "bfloat16"}))
    variant = variant_of(cp, ns, "support")
    assert cond(get(cp, ns, "adapter", "support"), "BaseVariantReady")["reason"] == "Building"
    mine = wait_until(lambda: [j for j in live_jobs(cp, ns, BUILDS)
                               if j["metadata"]["labels"].get("trtfleet.io/variant") == variant["name"]],
                      30, "the variant's build Job")
    assert len(mine) == 1 and owners(mine[0]) == ["support"]
    engine_hash = mine[0]["metadata"]["annotations"]["trtfleet.io/engine-hash"]
    assert engine_hash == variant["hash"]
    plan = json.loads(get(cp, ns, "configmap", plan_configmap_name(engine_hash))["data"]["plan.json"])
    steps = [s["name"] for s in plan["steps"]]
    assert steps.index("dequantize-base") < steps.index("convert-checkpoint")
    finish_job_pod(cp, ns, mine[0]["metadata"]["name"], "build", exit_code=0)
    deployment = wait_until(lambda: get(cp, ns, "deployment", variant["name"]), 30, "the variant Deployment")
    assert deployment["spec"]["selector"]["matchLabels"]["trtfleet.io/role"] == "variant"
    assert deployment["metadata"]["annotations"]["trtfleet.io/engine-hash"] == engine_hash
