"""Any TensorRT-LLM release runs as written: build and serving pods use ``spec.engine.image`` itself, and the
pods that need ``trtfleet`` get it from trtfleet's image through an init container (:mod:`.clibundle`)."""

from __future__ import annotations

from trtfleet_engines.runner import _override
from trtfleet_operator.config import OperatorConfig
from trtfleet_operator.reconcile.basemodel import BaseModelObserved, reconcile_basemodel

from tests.unit.operator.helpers import NOW, Obj, llama
from trtfleet.api import BaseModelStatus

CONFIG = OperatorConfig()
OTHER_RELEASE = "nvcr.io/nvidia/tritonserver:24.12-trtllm-python-py3"


def _by_kind(objects: tuple[Obj, ...], kind: str) -> list[Obj]:
    return [o for o in objects if o["kind"] == kind]


def test_a_non_default_trtllm_image_builds_with_the_cli_from_trtfleets_image() -> None:
    obj = llama(spec={"engine": {"image": OTHER_RELEASE}})
    result = reconcile_basemodel(obj, BaseModelObserved(basemodels=(obj,)), CONFIG, NOW)
    BaseModelStatus.model_validate(result.status)
    [job] = _by_kind(result.apply, "Job")
    pod = job["spec"]["template"]["spec"]
    [build] = pod["containers"]
    assert build["image"] == OTHER_RELEASE  # as written: no substitute image, whatever the release
    assert build["command"][:3] == ["/opt/trtfleet-cli/bin/trtfleet", "engines", "build"]
    [init] = pod["initContainers"]
    assert (init["name"], init["image"]) == ("trtfleet-cli", CONFIG.images.trtfleet)
    assert init["command"] == ["cp", "-a", "/opt/trtfleet/cli/.", "/opt/trtfleet-cli"]
    assert {"name": "trtfleet-cli", "emptyDir": {}} in pod["volumes"]
    assert result.status["engine"]["image"] == OTHER_RELEASE


def test_steps_that_run_trtfleet_use_the_bundles_command() -> None:
    env = {"TRTFLEET_CLI": "/opt/trtfleet-cli/bin/trtfleet"}
    merge = ("trtfleet", "lora", "merge", "--base", "/m")
    assert _override(merge, env) == ["/opt/trtfleet-cli/bin/trtfleet", "lora", "merge", "--base", "/m"]
    assert _override(merge, {}) == list(merge)  # trtfleet's own image: on the PATH
    assert _override(("trtllm-build", "--x"), env) == ["trtllm-build", "--x"]
