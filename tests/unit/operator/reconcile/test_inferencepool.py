"""A BaseModel's InferencePool: the step's table (CRD served or not, the picker Service there or not), the driver
(applied from the first reconcile, reported in ``InferencePoolReady``, absent when the operator renders none) and
the ``--inference-pool-picker`` flag."""

from __future__ import annotations

import argparse
from dataclasses import dataclass, replace

import pytest
from trtfleet_operator import cli
from trtfleet_operator.config import InferencePoolConfig, OperatorConfig
from trtfleet_operator.errors import ConfigError
from trtfleet_operator.reconcile.basemodel import BaseModelObserved, reconcile_basemodel
from trtfleet_operator.reconcile.inferencepool import PoolObserved

from tests.unit.operator.helpers import NAMESPACE, NOW, by_kind, condition, example, llama, stored, tiny
from trtfleet.api import BaseModelStatus

PICKER = InferencePoolConfig(picker_service="trtfleet-epp", picker_port=9002)
CONFIG = OperatorConfig(inference_pool=PICKER)
PICKER_SERVICE = {
    "apiVersion": "v1",
    "kind": "Service",
    "metadata": {"name": "trtfleet-epp", "namespace": NAMESPACE},
    "spec": {"ports": [{"name": "grpc", "port": 9002, "targetPort": "grpc"}]},
}
OTHER_PORT_SERVICE = {**PICKER_SERVICE, "spec": {"ports": [{"name": "grpc", "port": 9090}]}}


def run(obj: dict, pool: PoolObserved | None, config: OperatorConfig = CONFIG):  # type: ignore[no-untyped-def,type-arg]
    result = reconcile_basemodel(obj, BaseModelObserved(basemodels=(obj,), inference_pool=pool), config, NOW)
    BaseModelStatus.model_validate(result.status)
    return result


@dataclass(frozen=True)
class Case:
    name: str
    crd_served: bool
    service: dict | None  # type: ignore[type-arg]
    applied: bool
    status: str
    reason: str
    says: str


CASES = [
    Case("no CRD: nothing, and how to get one", False, PICKER_SERVICE, False, "False", "CRDNotServed",
         "install the Gateway API Inference Extension's CRD"),
    Case("no CRD and no picker: the CRD is what to fix first", False, None, False, "False", "CRDNotServed",
         "does not serve inference.networking.k8s.io/v1"),
    Case("picker Service elsewhere: applied, and said", True, None, True, "False", "PickerServiceMissing",
         "Service trtfleet-epp port 9002, does not exist in namespace models"),
    Case("picker Service without the port", True, OTHER_PORT_SERVICE, True, "False", "PickerServiceMissing",
         "has no such port"),
    Case("all there", True, PICKER_SERVICE, True, "True", "Applied",
         "InferencePool tiny: the serving pods' port 8000, endpoint picker Service trtfleet-epp port 9002"),
]


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_pool_step(case: Case) -> None:
    result = run(tiny(), PoolObserved(crd_served=case.crd_served, picker_service=case.service))
    pools = by_kind(result.apply, "InferencePool")
    assert len(pools) == (1 if case.applied else 0)
    ready = condition(result.status, "InferencePoolReady")
    assert (ready["status"], ready["reason"]) == (case.status, case.reason)
    assert case.says in ready["message"]
    assert ready["observedGeneration"] == 1


def test_the_pool_selects_the_serving_pods_on_their_http_port_with_the_picker() -> None:
    result = run(tiny(), PoolObserved(crd_served=True, picker_service=PICKER_SERVICE))
    (pool,) = by_kind(result.apply, "InferencePool")
    (deployment,) = by_kind(result.apply, "Deployment")
    pod = deployment["spec"]["template"]
    assert pool["metadata"]["name"] == "tiny" and pool["metadata"]["namespace"] == NAMESPACE
    assert pool["spec"]["selector"]["matchLabels"].items() <= pod["metadata"]["labels"].items()
    (http,) = [p for p in pod["spec"]["containers"][0]["ports"] if p["name"] == "http"]
    assert pool["spec"]["targetPorts"] == [{"number": http["containerPort"]}]
    assert pool["spec"]["endpointPickerRef"] == {
        "group": "", "kind": "Service", "name": "trtfleet-epp", "port": {"number": 9002}, "failureMode": "FailClose"
    }
    (owner,) = pool["metadata"]["ownerReferences"]
    assert (owner["kind"], owner["name"], owner["uid"], owner["controller"]) == ("BaseModel", "tiny", "uid-tiny", True)


def test_failure_mode_comes_from_the_spec_and_changes_no_pod() -> None:
    observed = PoolObserved(crd_served=True, picker_service=PICKER_SERVICE)
    plain = run(tiny(), observed)
    fail_open = run(tiny(spec={"serving": {"gateway": {"failureMode": "FailOpen"}}}), observed)
    (pool,) = by_kind(fail_open.apply, "InferencePool")
    assert pool["spec"]["endpointPickerRef"]["failureMode"] == "FailOpen"
    assert "failureMode FailOpen" in condition(fail_open.status, "InferencePoolReady")["message"]
    for kind in ("Deployment", "ConfigMap"):
        assert by_kind(fail_open.apply, kind) == by_kind(plain.apply, kind), kind


def test_a_pool_from_the_first_reconcile_while_the_engine_builds() -> None:
    result = run(llama(), PoolObserved(crd_served=True, picker_service=PICKER_SERVICE))
    assert result.status["phase"] == "Building"
    assert [p["metadata"]["name"] for p in by_kind(result.apply, "InferencePool")] == ["llama3-8b"]


def test_pytorch_pools_target_trtllm_serve() -> None:
    obj = stored(example("basemodel-llama3-8b-pytorch.yaml"))
    result = run(obj, PoolObserved(crd_served=True, picker_service=PICKER_SERVICE))
    (pool,) = by_kind(result.apply, "InferencePool")
    assert pool["spec"]["targetPorts"] == [{"number": 8000}]


def test_no_pool_and_no_condition_when_the_operator_renders_none() -> None:
    result = run(tiny(), None, OperatorConfig())
    assert not by_kind(result.apply, "InferencePool")
    assert "InferencePoolReady" not in {c["type"] for c in result.status["conditions"]}


def test_one_event_per_change_none_while_nothing_changes() -> None:
    """A missing CRD is a Warning once, not an error loop; the pool created once it is served is one Normal."""
    missing = PoolObserved(crd_served=False, picker_service=PICKER_SERVICE)
    first = run(tiny(), missing)
    assert [(e.type, e.reason) for e in first.events if e.reason == "CRDNotServed"] == [("Warning", "CRDNotServed")]
    again = run(tiny(status=first.status), missing)
    assert not [e for e in again.events if e.reason == "CRDNotServed"] and again.requeue_after_s is None
    served = run(tiny(status=again.status), PoolObserved(crd_served=True, picker_service=PICKER_SERVICE))
    assert condition(served.status, "InferencePoolReady")["status"] == "True"
    assert [(e.type, e.reason) for e in served.events if e.reason == "Applied"] == [("Normal", "Applied")]


def _parse(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    cli.configure(parser)
    return parser.parse_args(list(argv))


def test_flag_sets_the_picker() -> None:
    config = cli.config_from_args(_parse("--inference-pool-picker", "trtfleet-epp:9002"))
    assert config.inference_pool == PICKER
    assert cli.config_from_args(_parse()).inference_pool is None


@pytest.mark.parametrize(
    ("value", "says"),
    [
        ("trtfleet-epp", "expected SERVICE:PORT"),
        ("trtfleet-epp:grpc", "expected SERVICE:PORT"),
        ("Trtfleet_EPP:9002", "is not a DNS label"),
        ("trtfleet-epp:0", "is not in 1..65535"),
    ],
)
def test_flag_refuses_what_is_no_service_port(value: str, says: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        _parse("--inference-pool-picker", value)
    assert says in capsys.readouterr().err


def test_config_refuses_a_bad_picker() -> None:
    with pytest.raises(ConfigError, match="DNS label"):
        replace(PICKER, picker_service="-epp")
