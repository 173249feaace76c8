"""hf:// sources through the real ``huggingface_hub`` client, against a local Hub emulator.

No real Hub is reachable here, so :mod:`tests.support.hfhub` serves the Hub's download routes from local
directories and the Jobs' code is pointed at it with ``HF_ENDPOINT`` (how a Job reaches a private Hub
mirror too). Covered: the adapter-conversion Job (a subprocess, as in the cluster) downloading a committed
sample adapter by commit and by branch with a token, and its errors; the engine build's fetch step.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from trtfleet_engines import runner
from trtfleet_engines.plan import plan_engine_build
from trtfleet_engines.reference.numpy_llama import SAMPLE_ADAPTERS_DIR
from trtfleet_operator.artifacts import parse_summary

from tests.integration.engines.test_engines_runner import Builds
from tests.support.hfhub import running_hub

pytestmark = pytest.mark.integration

SAMPLES = Path(SAMPLE_ADAPTERS_DIR)
TOKEN = "hf_test_token_123"
TRTFLEET = str(Path(sys.executable).parent / "trtfleet")


def _hub_env(tmp_path: Path, endpoint: str, token: str | None = TOKEN) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("HF_")}
    env.update({"HF_ENDPOINT": endpoint, "HF_HOME": str(tmp_path / "hf-home"), "HF_HUB_DISABLE_TELEMETRY": "1"})
    if token is not None:
        env["HF_TOKEN"] = token
    return env


def _convert_job(tmp_path: Path, name: str, uri: str, revision: str, env: dict[str, str]) -> tuple[int, str, Path]:
    out, log = tmp_path / name / "out", tmp_path / name / "termination-log"
    log.parent.mkdir(parents=True)
    argv = [
        sys.executable, "-m", "trtfleet_operator.jobs.convert", "--source-uri", uri, "--revision", revision,
        "--out", str(out), "--dtype", "float16", "--work", str(tmp_path / name / "work"),
        "--termination-log", str(log), "--trtfleet", TRTFLEET,
    ]  # fmt: skip
    done = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=120, check=False)
    return done.returncode, log.read_text() if log.exists() else done.stderr, tmp_path / name


def _weights_sha(job_dir: Path) -> str:
    manifest = json.loads((job_dir / "out" / "manifest.json").read_text())
    return str(manifest["outputs"]["model.lora_weights.npy"]["sha256"])


def test_convert_job_downloads_adapters_by_commit_and_branch(tmp_path: Path) -> None:
    with running_hub() as hub:
        upper_sha = hub.add("trtfleet/tiny-adapter", SAMPLES / "upper", token=TOKEN)
        hub.add("trtfleet/tiny-adapter", SAMPLES / "reverse", token=TOKEN)  # main moves on
        env = _hub_env(tmp_path, hub.url)

        code, log, pinned = _convert_job(tmp_path, "pinned", "hf://trtfleet/tiny-adapter", upper_sha, env)
        assert code == 0, log
        downloaded = pinned / "work" / "source"
        for sample in (SAMPLES / "upper").iterdir():
            assert (downloaded / sample.name).read_bytes() == sample.read_bytes()
        code, log, local = _convert_job(tmp_path, "local", f"file://{SAMPLES / 'upper'}", "", env)
        assert code == 0, log
        assert _weights_sha(pinned) == _weights_sha(local)  # the same adapter, converted the same
        assert parse_summary((pinned / "termination-log").read_text()).sha256 == _weights_sha(pinned)

        code, log, branch = _convert_job(tmp_path, "branch", "hf://trtfleet/tiny-adapter", "main", env)
        assert code == 0, log
        code, log, reverse = _convert_job(tmp_path, "reverse", f"file://{SAMPLES / 'reverse'}", "", env)
        assert code == 0, log
        assert _weights_sha(branch) == _weights_sha(reverse) != _weights_sha(pinned)

        assert hub.requests and all(auth == f"Bearer {TOKEN}" for _, _, auth in hub.requests)


@pytest.mark.parametrize(
    ("repo", "revision", "token", "error"),
    [
        ("nobody/missing", "main", TOKEN, "RepositoryNotFoundError"),
        ("trtfleet/tiny-adapter", "no-such-branch", TOKEN, "RevisionNotFoundError"),
        ("trtfleet/tiny-adapter", "main", None, "RepositoryNotFoundError"),  # private, no token
    ],
    ids=["unknown-repo", "unknown-revision", "no-token"],
)
def test_convert_job_says_what_the_hub_refused(
    tmp_path: Path, repo: str, revision: str, token: str | None, error: str
) -> None:
    with running_hub() as hub:
        hub.add("trtfleet/tiny-adapter", SAMPLES / "upper", token=TOKEN)
        code, log, job = _convert_job(tmp_path, "job", f"hf://{repo}", revision, _hub_env(tmp_path, hub.url, token))
    assert code == 1
    assert log.startswith(f"fetching hf://{repo} failed: {error}"), log
    assert not (job / "out").exists()


def test_engine_build_fetch_step_downloads_the_checkpoint(tmp_path: Path) -> None:
    world = Builds(tmp_path)
    (world.override / "fetch").unlink()  # the real download, not the stand-in
    checkpoint = Path(world.spec.source.uri.removeprefix("file://"))
    with running_hub() as hub:
        sha = hub.add("org/tiny-llama", checkpoint)
        source = world.spec.source.model_copy(update={"uri": "hf://org/tiny-llama", "revision": sha})
        plan = plan_engine_build(world.spec.model_copy(update={"source": source}), workdir=str(tmp_path / "work"))
        env = world.env(HF_ENDPOINT=hub.url, HF_HOME=str(tmp_path / "hf-home"), HF_HUB_DISABLE_TELEMETRY="1")
        result = runner.run_build(plan, str(tmp_path / "hf-out"), env=env, progress=lambda _line: None)
        assert result.status == "built"
        assert world.ran() == ["convert_checkpoint.py", "trtllm-build"]
        for path in checkpoint.rglob("*"):
            if path.is_file():
                assert (tmp_path / "work" / "source" / path.relative_to(checkpoint)).read_bytes() == path.read_bytes()
        assert (tmp_path / "hf-out" / "tokenizer" / "tokenizer.json").is_file()

        missing = world.spec.source.model_copy(update={"uri": "hf://org/not-there", "revision": None})
        plan = plan_engine_build(world.spec.model_copy(update={"source": missing}), workdir=str(tmp_path / "w2"))
        with pytest.raises(runner.StepFailedError) as failed:
            runner.run_build(plan, str(tmp_path / "missing-out"), env=env, progress=lambda _line: None)
    assert failed.value.step_name == "fetch"
    assert failed.value.stderr_tail.startswith("downloading hf://org/not-there: RepositoryNotFoundError")
    assert not (tmp_path / "missing-out").exists()
