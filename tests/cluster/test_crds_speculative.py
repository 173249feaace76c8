"""``spec.speculative`` in a real kube-apiserver: the CEL rules refuse each combination with the words the Python
models use (``tests/unit/test_api_speculative.py`` holds the same table), and the accepted ones are stored."""

from __future__ import annotations

import json

import pytest
import yaml

from tests.cluster.test_crds import apply, basemodel, crds  # noqa: F401  (the crds fixture)
from tests.support.controlplane import ControlPlane
from tests.unit.test_api_speculative import ACCEPTED, BASE, REFUSED, Case

pytestmark = pytest.mark.cluster


def _manifest(runtime: str, lora: bool, speculative: dict[str, object], name: str) -> str:
    body = {**BASE, "runtime": runtime, "lora": {"enabled": lora}, "speculative": speculative}
    return basemodel(yaml.safe_dump(body, sort_keys=True), name=name)


@pytest.mark.parametrize("case", REFUSED)
def test_the_api_server_refuses_with_the_same_words(crds: ControlPlane, kube_namespace: str,  # noqa: F811
                                                    case: Case) -> None:
    res = apply(crds, kube_namespace, _manifest(case.runtime, case.lora, case.speculative, "refused"), check=False)
    assert res.returncode != 0, f"accepted: {case}"
    assert case.message in res.stderr, res.stderr


@pytest.mark.parametrize(("runtime", "lora", "speculative"), ACCEPTED)
def test_the_api_server_stores_accepted_specs(crds: ControlPlane, kube_namespace: str,  # noqa: F811
                                              runtime: str, lora: bool, speculative: dict[str, object]) -> None:
    apply(crds, kube_namespace, _manifest(runtime, lora, speculative, "accepted"))
    stored = json.loads(crds.kubectl("get", "basemodel", "accepted", "-n", kube_namespace, "-o", "json").stdout)
    assert stored["spec"]["speculative"]["mode"] == speculative["mode"]
    crds.kubectl("delete", "basemodel", "accepted", "-n", kube_namespace)
