"""The build runner with stand-in tools (TRTFLEET_STEP_OVERRIDE_DIR): publish, idempotence, failure, races.

The stand-ins are real executables that write fake checkpoints and engines, record that they ran, fail on
demand (STANDIN_FAIL=<name>) and, for the race test, block on a gate file until the test opens it.
"""

from __future__ import annotations

import hashlib
import json
import os
import stat
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import yaml
from trtfleet_engines import runner
from trtfleet_engines.errors import BuildError, MissingDependencyError, StepFailedError
from trtfleet_engines.plan import BuildPlan, plan_engine_build

from trtfleet.api import BaseModel

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[3]
WAIT_S = 60.0

STANDIN = """#!{python}
import os, sys, time
from pathlib import Path

name = Path(sys.argv[0]).name
args = sys.argv[1:]
with open(os.environ["STANDIN_LOG"], "a") as log:
    log.write(f"{{name}} {{os.getpid()}}\\n")
print(f"{{name}}: working")
gate = os.environ.get("STANDIN_GATE")
if gate and name in ("convert_checkpoint.py", "quantize.py"):
    Path(gate, f"started-{{os.getpid()}}").touch()
    deadline = time.monotonic() + 60
    while not Path(gate, "release").exists():
        if time.monotonic() > deadline:
            sys.exit(9)
        time.sleep(0.01)
if os.environ.get("STANDIN_FAIL") == name:
    for i in range(30):
        print(f"{{name}} noise line {{i}}", file=sys.stderr)
    print("[TensorRT-LLM][ERROR] out of memory while building the engine", file=sys.stderr)
    sys.exit(3)
def flag(option):
    return args[args.index(option) + 1]
if name == "fetch":
    out = Path(args[2]); out.mkdir(parents=True, exist_ok=True)
    (out / "config.json").write_text("{{}}"); (out / "tokenizer.json").write_text("{{}}")
elif name in ("convert_checkpoint.py", "quantize.py"):
    out = Path(flag("--output_dir")); out.mkdir(parents=True, exist_ok=True)
    (out / "config.json").write_text('{{"architecture": "LlamaForCausalLM"}}')
    (out / "rank0.safetensors").write_bytes(os.urandom(64))
elif name == "trtllm-build":
    out = Path(flag("--output_dir")); out.mkdir(parents=True, exist_ok=True)
    (out / "config.json").write_text('{{"build_config": {{}}}}')
    (out / "rank0.engine").write_bytes(b"engine" * 1000)
"""


def _standins(directory: Path) -> Path:
    directory.mkdir()
    for name in ("convert_checkpoint.py", "quantize.py", "trtllm-build", "trtfleet", "fetch"):
        path = directory / name
        path.write_text(STANDIN.format(python=sys.executable))
        path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return directory


def _checkpoint(directory: Path) -> Path:
    directory.mkdir()
    for name, text in {
        "config.json": "{}",
        "tokenizer.json": '{"model": {}}',
        "tokenizer_config.json": "{}",
        "special_tokens_map.json": "{}",
        "generation_config.json": "{}",
    }.items():
        (directory / name).write_text(text)
    (directory / "model.safetensors").write_bytes(b"weights")
    return directory


class Builds:
    """One test's world: stand-ins, a checkpoint, a plan file, and ``trtfleet engines build`` helpers."""

    def __init__(self, tmp_path: Path, patch: dict[str, Any] | None = None) -> None:
        self.tmp = tmp_path
        self.log = tmp_path / "standin.log"
        self.log.touch()
        self.termination_log = tmp_path / "termination-log"
        self.override = _standins(tmp_path / "standins")
        checkpoint = _checkpoint(tmp_path / "hf")
        doc = yaml.safe_load((ROOT / "examples" / "basemodel-llama3-8b-tensorrtllm.yaml").read_text())
        doc["spec"]["source"] = {"uri": f"file://{checkpoint}"}
        doc["spec"].update(patch or {})
        self.spec = BaseModel.model_validate(doc).spec
        self.plan = plan_engine_build(self.spec, workdir=str(tmp_path / "work"))
        self.plan_path = tmp_path / "plan.json"
        self.plan_path.write_text(self.plan.to_json())
        self.out = tmp_path / "store" / self.plan.engine_hash_short

    def env(self, **extra: str) -> dict[str, str]:
        return {
            **os.environ,
            "TRTFLEET_STEP_OVERRIDE_DIR": str(self.override),
            "STANDIN_LOG": str(self.log),
            "TRTFLEET_TERMINATION_LOG": str(self.termination_log),
            **extra,
        }

    def command(self, plan_path: Path | None = None) -> list[str]:
        return [
            sys.executable,
            "-m",
            "trtfleet",
            "engines",
            "build",
            "--plan",
            str(plan_path or self.plan_path),
            "--out",
            f"file://{self.out}",
        ]

    def run(self, **extra: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            self.command(), env=self.env(**extra), capture_output=True, text=True, timeout=WAIT_S
        )

    def ran(self) -> list[str]:
        return [line.split()[0] for line in self.log.read_text().splitlines()]

    def leftovers(self) -> list[str]:
        return sorted(
            p.name for p in self.out.parent.glob(f".{self.out.name}.*") if not p.name.endswith(".lock")
        )


def _assert_intact(out: Path, engine_hash: str) -> dict[str, Any]:
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["engineHash"] == engine_hash
    files = {entry["path"]: entry for entry in manifest["files"]}
    on_disk = {p.relative_to(out).as_posix() for p in out.rglob("*") if p.is_file()} - {"manifest.json"}
    assert set(files) == on_disk
    for path, entry in files.items():
        data = (out / path).read_bytes()
        assert (len(data), hashlib.sha256(data).hexdigest()) == (entry["bytes"], entry["sha256"]), path
    return manifest


def test_build_publishes_engine_tokenizer_and_repository(tmp_path: Path) -> None:
    world = Builds(tmp_path)
    result = world.run()
    assert result.returncode == 0, result.stderr
    assert "[step 2/4] convert-checkpoint:" in result.stdout and "[step 3/4] trtllm-build:" in result.stdout
    assert "[step 3/4] trtllm-build done, elapsed" in result.stdout
    assert f"built: {world.plan.engine_hash}" in result.stdout
    manifest = _assert_intact(world.out, world.plan.engine_hash)
    assert manifest["image"] == world.spec.engine.image and manifest["builtAt"].endswith("Z")
    assert [s["name"] for s in manifest["steps"]] == ["convert-checkpoint", "trtllm-build"]
    assert manifest["steps"][1]["argv"][0] == "trtllm-build"  # the plan's argv, not the stand-in's path
    paths = {entry["path"] for entry in manifest["files"]}
    assert {
        "engine/rank0.engine",
        "engine/config.json",
        "tokenizer/tokenizer.json",
        "tokenizer/tokenizer_config.json",
        "tokenizer/config.json",
    } <= paths
    assert "tokenizer/model.safetensors" not in paths
    assert {
        f"model_repository/{m}/config.pbtxt"
        for m in ("ensemble", "preprocessing", "postprocessing", "tensorrt_llm", "tensorrt_llm_bls")
    } <= paths
    config = (world.out / "model_repository" / "tensorrt_llm" / "config.pbtxt").read_text()
    assert '"/trtfleet/artifact/engine"' in config
    assert world.ran() == ["convert_checkpoint.py", "trtllm-build"]
    assert world.leftovers() == [] and not world.termination_log.exists()


def test_rerun_is_a_no_op(tmp_path: Path) -> None:
    world = Builds(tmp_path)
    assert world.run().returncode == 0
    before = (world.out / "manifest.json").read_bytes()
    again = world.run()
    assert again.returncode == 0 and "already built" in again.stdout
    assert world.ran() == ["convert_checkpoint.py", "trtllm-build"]
    assert (world.out / "manifest.json").read_bytes() == before


def test_failing_step_publishes_nothing_and_explains(tmp_path: Path) -> None:
    world = Builds(tmp_path)
    failed = world.run(STANDIN_FAIL="trtllm-build")
    assert failed.returncode == 1
    assert not world.out.exists() and world.leftovers() == []
    reason = world.termination_log.read_text()
    assert "failed at step 3/4 (trtllm-build) with exit code 3" in reason
    assert "out of memory while building the engine" in reason and "noise line 29" in reason
    assert "noise line 0 " not in reason  # only the tail
    assert "\n" not in reason and len(reason.encode()) <= runner.TERMINATION_LOG_MAX_BYTES
    assert "error:" in failed.stderr and "Traceback" not in failed.stderr
    # a clean retry after the failure publishes normally
    assert world.run().returncode == 0
    _assert_intact(world.out, world.plan.engine_hash)


def test_concurrent_builds_of_one_hash_build_once(tmp_path: Path) -> None:
    world = Builds(tmp_path)
    gate = tmp_path / "gate"
    gate.mkdir()
    env = world.env(STANDIN_GATE=str(gate))
    procs = [
        subprocess.Popen(world.command(), env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        for _ in range(2)
    ]
    try:
        deadline = time.monotonic() + WAIT_S
        while not list(gate.glob("started-*")):
            assert time.monotonic() < deadline, "no build started"
            assert all(p.poll() is None for p in procs), [p.communicate() for p in procs]
            time.sleep(0.01)
        (gate / "release").touch()
        outputs = [p.communicate(timeout=WAIT_S) for p in procs]
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
    assert [p.returncode for p in procs] == [0, 0], outputs
    finals = sorted(out.splitlines()[-1].split(":")[0] for out, _ in outputs)
    assert finals == ["already-built", "built"]
    assert len(list(gate.glob("started-*"))) == 1
    assert world.ran().count("convert_checkpoint.py") == 1
    _assert_intact(world.out, world.plan.engine_hash)
    assert world.leftovers() == []


def test_elapsed_lines_while_a_step_runs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    world = Builds(tmp_path)
    gate = tmp_path / "gate"
    gate.mkdir()
    monkeypatch.setattr(runner, "PROGRESS_INTERVAL_S", 0.05)
    lines: list[str] = []

    def progress(line: str) -> None:
        lines.append(line)
        if "convert-checkpoint ... elapsed" in line:
            (gate / "release").touch()

    result = runner.run_build(
        world.plan, str(world.out), env=world.env(STANDIN_GATE=str(gate)), progress=progress
    )
    assert result.status == "built"
    assert any(line.startswith("[step 2/4] convert-checkpoint ... elapsed ") for line in lines)
    assert "    convert_checkpoint.py: working" in lines


def test_reference_build_copies_the_model(tmp_path: Path) -> None:
    world = Builds(tmp_path, {"runtime": "reference", "engine": {"gpu": {"product": "cpu", "count": 1}}})
    result = world.run()
    assert result.returncode == 0, result.stderr
    manifest = _assert_intact(world.out, world.plan.engine_hash)
    paths = {entry["path"] for entry in manifest["files"]}
    assert {"engine/model.safetensors", "engine/tokenizer.json"} <= paths
    assert not any(p.startswith("tokenizer/") for p in paths)
    assert world.ran() == []
    config = (world.out / "model_repository" / "tensorrt_llm" / "config.pbtxt").read_text()
    assert 'backend: "python"' in config and "reference_model_dir" in config


def test_downloads_go_through_the_fetch_override(tmp_path: Path) -> None:
    world = Builds(tmp_path)
    spec = world.spec.model_copy(
        update={"source": world.spec.source.model_copy(update={"uri": "hf://org/m"})}
    )
    plan = plan_engine_build(spec, workdir=str(tmp_path / "work"))
    result = runner.run_build(plan, str(tmp_path / "hf-out"), env=world.env(), progress=lambda _line: None)
    assert result.status == "built"
    assert world.ran() == ["fetch", "convert_checkpoint.py", "trtllm-build"]
    assert (tmp_path / "hf-out" / "tokenizer" / "tokenizer.json").is_file()


def test_missing_override_executable_is_an_error(tmp_path: Path) -> None:
    world = Builds(tmp_path)
    (world.override / "trtllm-build").unlink()
    with pytest.raises(BuildError, match="no executable 'trtllm-build'"):
        runner.run_build(world.plan, str(world.out), env=world.env(), progress=lambda _line: None)
    assert not world.out.exists() and world.leftovers() == []


def test_destination_holding_another_engine_is_refused(tmp_path: Path) -> None:
    world = Builds(tmp_path)
    world.out.mkdir(parents=True)
    (world.out / "manifest.json").write_text(json.dumps({"engineHash": "0" * 64}))
    result = world.run()
    assert result.returncode == 1 and "already holds engine" in result.stderr
    assert world.ran() == []


def test_missing_source_directory_fails_the_fetch_step(tmp_path: Path) -> None:
    world = Builds(tmp_path)
    data = json.loads(world.plan_path.read_text())
    data["steps"][0]["localDir"] = str(tmp_path / "nowhere")
    plan = BuildPlan.from_json_dict(data)
    with pytest.raises(StepFailedError) as info:
        runner.run_build(plan, str(world.out), env=world.env(), progress=lambda _line: None)
    assert info.value.step_index == 1 and "is not a directory" in info.value.stderr_tail


def test_s3_without_boto3_says_how_to_install(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "boto3", None)  # as if the s3 extra were not installed
    world = Builds(tmp_path)
    with pytest.raises(MissingDependencyError, match=r"pip install 'trtfleet\[s3\]'"):
        runner.run_build(world.plan, "s3://bucket/engines/x", env=world.env(), progress=lambda _line: None)
