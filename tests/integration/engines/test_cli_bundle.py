"""The trtfleet CLI bundle (``trtfleet.clibundle``) in a pod of a stock TensorRT-LLM image, played locally.

The bundle is built from this environment, copied elsewhere (as the init container copies it into an
emptyDir) and the original removed; then ``trtfleet engines build`` runs from the copy in an environment that
stands for NVIDIA's image: its own ``python3`` and ``trtllm-build`` first on the PATH (shell stand-ins that
record how they were called and write what the real tools write), and a ``PYTHONPATH`` whose ``pydantic``
breaks any import. The build must publish the engine, run the image's ``python3`` for
``convert_checkpoint.py``, and hand the image's environment unchanged to it; trtfleet itself imports nothing
of the image's Python. A real NVIDIA image cannot run here (no GPU, no registry); what this does not show is
the bundle's interpreter started on another glibc (python-build-standalone, used by the Dockerfile, is built
for glibc 2.17 and later).
"""

from __future__ import annotations

import json
import shutil
import stat
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from trtfleet_engines.plan import plan_engine_build

from trtfleet.api import BaseModel
from trtfleet.clibundle import LAUNCHER, PYTHON_LAUNCHER

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[3]

IMAGE_PYTHON = """#!/bin/sh
# the stock image's python3: records its call and its PYTHONPATH, writes a converted checkpoint
echo "python3 $* PYTHONPATH=$PYTHONPATH" >> "$STANDIN_LOG"
case "$1" in */convert_checkpoint.py) ;; *) echo "unexpected python3 call: $*" >&2; exit 97 ;; esac
while [ $# -gt 0 ]; do
  if [ "$1" = "--output_dir" ]; then mkdir -p "$2"; echo '{"architecture": "LlamaForCausalLM"}' > "$2/config.json";
    printf 'weights' > "$2/rank0.safetensors"; fi
  shift
done
"""
IMAGE_TRTLLM_BUILD = """#!/bin/sh
echo "trtllm-build $*" >> "$STANDIN_LOG"
while [ $# -gt 0 ]; do
  if [ "$1" = "--output_dir" ]; then mkdir -p "$2"; echo '{"build_config": {}}' > "$2/config.json";
    printf 'engine' > "$2/rank0.engine"; fi
  shift
done
"""


def _executable(path: Path, text: str) -> None:
    path.write_text(text)
    path.chmod(path.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)


@pytest.fixture(scope="module")
def pod_cli(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The bundle as a pod sees it: built, copied with ``cp -a`` like the init container, original removed."""
    root = tmp_path_factory.mktemp("bundle")
    built = root / "built"
    subprocess.run([sys.executable, "-m", "trtfleet.clibundle", "--out", str(built)], check=True,
                   capture_output=True, text=True)
    pod = root / "pod" / "opt" / "trtfleet-cli"
    pod.mkdir(parents=True)
    subprocess.run(["cp", "-a", f"{built}/.", str(pod)], check=True)
    shutil.rmtree(built)
    return pod


def _image(tmp_path: Path) -> dict[str, str]:
    """The environment of a stock image: its tools first on the PATH, a poisoned PYTHONPATH, nothing else."""
    image_bin = tmp_path / "image" / "bin"
    image_bin.mkdir(parents=True)
    _executable(image_bin / "python3", IMAGE_PYTHON)
    _executable(image_bin / "trtllm-build", IMAGE_TRTLLM_BUILD)
    poison = tmp_path / "image-site"
    poison.mkdir()
    (poison / "pydantic.py").write_text("raise ImportError('the image pydantic must not reach trtfleet')\n")
    (tmp_path / "standin.log").touch()
    return {"PATH": f"{image_bin}:/usr/bin:/bin", "PYTHONPATH": str(poison), "HOME": str(tmp_path),
            "STANDIN_LOG": str(tmp_path / "standin.log"),
            "TRTFLEET_TERMINATION_LOG": str(tmp_path / "termination-log")}


def test_engine_build_runs_from_the_bundle_with_the_images_tools(pod_cli: Path, tmp_path: Path) -> None:
    env = _image(tmp_path)
    checkpoint = tmp_path / "hf"
    checkpoint.mkdir()
    for name in ("config.json", "tokenizer.json", "tokenizer_config.json"):
        (checkpoint / name).write_text("{}")
    doc = yaml.safe_load((ROOT / "examples" / "basemodel-llama3-8b-tensorrtllm.yaml").read_text())
    doc["spec"]["source"] = {"uri": f"file://{checkpoint}"}
    plan = plan_engine_build(BaseModel.model_validate(doc).spec, workdir=str(tmp_path / "work"),
                             trtllm_dir=str(tmp_path / "image" / "tensorrt_llm"))
    (tmp_path / "plan.json").write_text(plan.to_json())
    out = tmp_path / "engines" / plan.engine_hash
    done = subprocess.run([str(pod_cli / LAUNCHER), "engines", "build", "--plan", str(tmp_path / "plan.json"),
                           "--out", str(out)], env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
    assert json.loads((out / "manifest.json").read_text())["engineHash"] == plan.engine_hash
    ran = (tmp_path / "standin.log").read_text().splitlines()
    convert = [line for line in ran if line.startswith("python3 ")]
    assert len(convert) == 1 and "/convert_checkpoint.py " in convert[0]
    assert convert[0].endswith(f"PYTHONPATH={env['PYTHONPATH']}"), "the image's environment reaches its tools"
    assert any(line.startswith("trtllm-build ") for line in ran)


def test_prepare_entrypoint_runs_with_the_bundles_python(pod_cli: Path, tmp_path: Path) -> None:
    env = _image(tmp_path)
    done = subprocess.run([str(pod_cli / PYTHON_LAUNCHER), "-m", "trtfleet_operator.jobs.prepare", "--help"],
                          env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert "--plan" in done.stdout
    version = subprocess.run([str(pod_cli / LAUNCHER), "--version"], env=env, capture_output=True, text=True,
                             timeout=60)
    assert version.stdout.startswith("trtfleet "), version.stderr
