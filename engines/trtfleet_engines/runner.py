"""Execute a :class:`~trtfleet_engines.plan.BuildPlan` and publish the engine atomically.

Flow of :func:`run_build` for a local destination ``D`` (file://, a path, or a mounted PVC):

1. ``D/manifest.json`` with the plan's hash exists -> "already built", nothing runs.
2. Take an exclusive ``flock`` on ``<parent of D>/.<name of D>.lock`` (held for the whole build, so a
   concurrent builder of the same engine waits here), then look again: the loser of a race finds the
   winner's manifest and stops.
3. Run the steps in the plan's workdir with live progress lines on stdout
   (``[step 3/5] trtllm-build ... elapsed 12.3s``), building into a staging directory beside ``D``.
4. Write ``manifest.json`` (hash, trtfleet version, image, steps, every file's size and sha256,
   ``builtAt``) and rename the staging directory to ``D``.

A failing step raises :class:`StepFailedError`; nothing is published and the staging directory is removed.
The CLI then writes a one-paragraph reason to the termination log (:func:`write_termination_log`).
s3:// destinations are built in a local staging directory and uploaded with the manifest last.

Tests replace the real tools through ``TRTFLEET_STEP_OVERRIDE_DIR``: when set, every command step's
executable (the python script's file name, ``trtllm-build``, ``trtfleet``) must exist in that directory
and runs instead, with the same arguments; a ``fetch`` executable there, if present, replaces hf:// and
s3:// downloads (``fetch URI REVISION LOCAL_DIR``).
"""

from __future__ import annotations

import hashlib
import logging
import os
import shlex
import shutil
import subprocess
import threading
import time
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import IO, Any, Literal

from trtfleet.clibundle import CLI_ENV
from trtfleet.version import __version__
from trtfleet_engines import storage
from trtfleet_engines.errors import BuildError, StepFailedError, StorageError
from trtfleet_engines.plan import REPOSITORY_SUBDIR, BuildPlan, CommandStep, FetchStep, StageStep
from trtfleet_engines.triton import render_model_repository

logger = logging.getLogger(__name__)

STEP_OVERRIDE_ENV = "TRTFLEET_STEP_OVERRIDE_DIR"
TERMINATION_LOG_ENV = "TRTFLEET_TERMINATION_LOG"
DEFAULT_TERMINATION_LOG = "/dev/termination-log"
TERMINATION_LOG_MAX_BYTES = 4096
"""Kubernetes keeps at most 4096 bytes of a termination message."""
PROGRESS_INTERVAL_S = 10.0
"""Seconds between ``... elapsed`` lines while a step runs."""
STDERR_TAIL_LINES = 20
TOKENIZER_FILES = ("tokenizer*", "special_tokens_map.json", "added_tokens.json", "vocab*", "merges.txt",
                   "*.model", "generation_config.json", "config.json", "chat_template*")
"""Files of a HuggingFace checkpoint the tokenizer needs (copied to ``tokenizer/``)."""
WORK_SUBDIRS = ("checkpoint", "engine", "merged", "variant")
"""Directories of the workdir a build writes; removed before it starts so no leftover leaks in."""

Progress = Callable[[str], None]


def print_progress(line: str) -> None:
    print(line, flush=True)


def utc_now() -> datetime:
    return datetime.now(UTC)


@dataclass(frozen=True)
class BuildResult:
    status: Literal["built", "already-built"]
    engine_hash: str
    destination: str
    manifest: Mapping[str, Any]


def _override(argv: tuple[str, ...], env: Mapping[str, str]) -> list[str]:
    """``argv`` with its executable replaced from ``TRTFLEET_STEP_OVERRIDE_DIR`` when that is set; else a
    ``trtfleet`` step runs the command this build runs under (``TRTFLEET_CLI``, set by the bundle's launcher
    in stock images, where no ``trtfleet`` is on the PATH)."""
    override_dir = env.get(STEP_OVERRIDE_ENV)
    if not override_dir:
        if argv and argv[0] == "trtfleet" and env.get(CLI_ENV):
            return [env[CLI_ENV], *argv[1:]]
        return list(argv)
    is_script = Path(argv[0]).name.startswith("python") and len(argv) > 1
    name, rest = (Path(argv[1]).name, argv[2:]) if is_script else (Path(argv[0]).name, argv[1:])
    replacement = Path(override_dir) / name
    if not os.access(replacement, os.X_OK):
        raise BuildError(f"{STEP_OVERRIDE_ENV}={override_dir} has no executable {name!r} for this step")
    return [str(replacement), *rest]


def _pump(stream: IO[str], sink: Progress, tail: deque[str] | None) -> None:
    for raw in stream:
        line = raw.rstrip("\n")
        sink(f"    {line}")
        if tail is not None:
            tail.append(line)


def run_command(
    argv: list[str],
    *,
    index: int,
    total: int,
    name: str,
    cwd: Path,
    env: Mapping[str, str],
    progress: Progress,
) -> None:
    """Run one step, forwarding its output and printing elapsed time; raise :class:`StepFailedError`."""
    start = time.monotonic()
    tail: deque[str] = deque(maxlen=STDERR_TAIL_LINES)
    try:
        proc = subprocess.Popen(argv, cwd=cwd, env=dict(env), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                text=True, errors="replace")
    except OSError as exc:
        raise StepFailedError(index, name, 127, f"cannot start {argv[0]}: {exc}") from exc
    assert proc.stdout is not None and proc.stderr is not None
    pumps = [threading.Thread(target=_pump, args=(proc.stdout, progress, None), daemon=True),
             threading.Thread(target=_pump, args=(proc.stderr, progress, tail), daemon=True)]
    for pump in pumps:
        pump.start()
    while True:
        try:
            code = proc.wait(timeout=PROGRESS_INTERVAL_S)
            break
        except subprocess.TimeoutExpired:
            progress(f"[step {index}/{total}] {name} ... elapsed {time.monotonic() - start:.1f}s")
    for pump in pumps:
        pump.join()
    if code != 0:
        raise StepFailedError(index, name, code, "\n".join(tail))


def _fetch(step: FetchStep, *, index: int, total: int, cwd: Path, env: Mapping[str, str],
           progress: Progress) -> None:
    if not step.download:
        if not Path(step.local_dir).is_dir():
            raise StepFailedError(index, step.name, 1, f"{step.uri}: {step.local_dir} is not a directory")
        return
    override_dir = env.get(STEP_OVERRIDE_ENV)
    if override_dir and (Path(override_dir) / "fetch").is_file():  # as documented: only if it is there
        argv = [str(Path(override_dir) / "fetch"), step.uri, step.revision or "", step.local_dir]
        run_command(argv, index=index, total=total, name=step.name, cwd=cwd, env=env, progress=progress)
        return
    try:
        if step.scheme == "hf":
            _download_hf(step, env)
        else:
            _download_s3(step)
    except (OSError, BuildError) as exc:
        raise StepFailedError(index, step.name, 1, str(exc)) from exc


def _download_hf(step: FetchStep, env: Mapping[str, str]) -> None:
    try:
        from huggingface_hub import snapshot_download
    except ImportError as exc:
        raise BuildError("hf:// sources need huggingface_hub (the TRT-LLM image has it)") from exc
    try:
        snapshot_download(repo_id=step.uri.removeprefix("hf://"), revision=step.revision, local_dir=step.local_dir,
                          token=env.get("HF_TOKEN") or None, endpoint=env.get("HF_ENDPOINT") or None)
    except Exception as exc:  # huggingface_hub's errors (not found, gated, HTTP) share no base class with OSError
        raise BuildError(f"downloading {step.uri}: {type(exc).__name__}: {exc}") from exc


def _download_s3(step: FetchStep) -> None:
    destination = storage.parse_destination(step.uri)
    client = storage.s3_client()
    prefix = f"{destination.s3_prefix}/" if destination.s3_prefix else ""
    paginator = client.get_paginator("list_objects_v2")
    for page in paginator.paginate(Bucket=destination.s3_bucket, Prefix=prefix):
        for item in page.get("Contents", []):
            target = Path(step.local_dir) / item["Key"][len(prefix):]
            target.parent.mkdir(parents=True, exist_ok=True)
            client.download_file(destination.s3_bucket, item["Key"], str(target))


def _stage(step: StageStep, plan: BuildPlan, staging: Path) -> None:
    engine_out = staging / "engine"
    if step.copy_whole_model:
        shutil.copytree(step.model_dir, engine_out)
    else:
        if not Path(step.engine_dir).is_dir():
            raise BuildError(f"the build step left no engine in {step.engine_dir}")
        shutil.move(step.engine_dir, engine_out)
        tokenizer_out = staging / "tokenizer"
        tokenizer_out.mkdir()
        for pattern in TOKENIZER_FILES:
            for path in sorted(Path(step.model_dir).glob(pattern)):
                if path.is_file():
                    shutil.copy2(path, tokenizer_out / path.name)
    render_model_repository(plan.render_spec, step.serve_engine_dir, staging / REPOSITORY_SUBDIR,
                            tokenizer_dir=step.serve_tokenizer_dir)


def _file_entries(root: Path) -> list[dict[str, Any]]:
    entries = []
    for path in sorted(p for p in root.rglob("*") if p.is_file()):
        digest = hashlib.sha256()
        with path.open("rb") as handle:
            for chunk in iter(lambda: handle.read(1 << 20), b""):
                digest.update(chunk)
        entries.append({"path": path.relative_to(root).as_posix(), "bytes": path.stat().st_size,
                        "sha256": digest.hexdigest()})
    return entries


def build_manifest(plan: BuildPlan, staging: Path, built_at: datetime) -> dict[str, Any]:
    return {
        "engineHash": plan.engine_hash,
        "engineHashShort": plan.engine_hash_short,
        "trtfleetVersion": __version__,
        "image": plan.image,
        "gpuSm": plan.gpu_sm,
        "mergedAdapter": dict(plan.merged_adapter) if plan.merged_adapter is not None else None,
        "steps": [{"name": s.name, "argv": list(s.argv)} for s in plan.steps if isinstance(s, CommandStep)],
        "files": _file_entries(staging),
        "builtAt": built_at.strftime("%Y-%m-%dT%H:%M:%SZ"),
    }


def _already_built(manifest: Mapping[str, Any] | None, plan: BuildPlan, where: str) -> bool:
    if manifest is None:
        return False
    if manifest.get("engineHash") != plan.engine_hash:
        raise StorageError(f"{where} already holds engine {manifest.get('engineHash')!r}, not "
                           f"{plan.engine_hash}: publish each engine under its own hash")
    return True


def _execute(plan: BuildPlan, staging: Path, env: Mapping[str, str], progress: Progress) -> None:
    workdir = Path(plan.workdir)
    workdir.mkdir(parents=True, exist_ok=True)
    for sub in WORK_SUBDIRS:
        shutil.rmtree(workdir / sub, ignore_errors=True)
    total = len(plan.steps)
    for index, step in enumerate(plan.steps, start=1):
        start = time.monotonic()
        if isinstance(step, FetchStep):
            progress(f"[step {index}/{total}] {step.name} {step.uri} -> {step.local_dir}")
            _fetch(step, index=index, total=total, cwd=workdir, env=env, progress=progress)
        elif isinstance(step, CommandStep):
            argv = _override(step.argv, env)
            progress(f"[step {index}/{total}] {step.name}: {shlex.join(argv)}")
            run_command(argv, index=index, total=total, name=step.name, cwd=workdir, env=env,
                        progress=progress)
        else:
            progress(f"[step {index}/{total}] {step.name}: tokenizer and Triton model repository")
            _stage(step, plan, staging)
        progress(f"[step {index}/{total}] {step.name} done, elapsed {time.monotonic() - start:.1f}s")


def run_build(
    plan: BuildPlan,
    out_uri: str,
    *,
    env: Mapping[str, str] | None = None,
    progress: Progress = print_progress,
    now: Callable[[], datetime] = utc_now,
) -> BuildResult:
    """Build ``plan`` and publish it at ``out_uri`` (see the module docstring)."""
    env = dict(os.environ if env is None else env)
    destination = storage.parse_destination(out_uri)
    if destination.local_path is None:
        return _run_build_s3(plan, destination, env, progress, now)
    target = destination.local_path
    if _already_built(storage.read_manifest(target), plan, str(target)):
        progress(f"engine {plan.engine_hash_short} already built at {out_uri}")
        return BuildResult("already-built", plan.engine_hash, out_uri, storage.read_manifest(target) or {})
    with storage.exclusive_lock(target):
        manifest = storage.read_manifest(target)
        if _already_built(manifest, plan, str(target)):
            progress(f"engine {plan.engine_hash_short} already built at {out_uri} (by a concurrent build)")
            return BuildResult("already-built", plan.engine_hash, out_uri, manifest or {})
        storage.remove_stale_staging(target)
        staging = storage.staging_dir_beside(target)
        try:
            _execute(plan, staging, env, progress)
            manifest = build_manifest(plan, staging, now())
            storage.write_json_atomic(staging / storage.MANIFEST_NAME, manifest)
            storage.publish_local(staging, target)
        except BaseException:
            storage.remove_tree(staging)
            raise
    progress(f"published engine {plan.engine_hash_short} at {out_uri}")
    return BuildResult("built", plan.engine_hash, out_uri, manifest)


def _run_build_s3(plan: BuildPlan, destination: storage.Destination, env: Mapping[str, str],
                  progress: Progress, now: Callable[[], datetime]) -> BuildResult:
    existing = storage.s3_read_manifest(destination)
    if _already_built(existing, plan, destination.uri):
        progress(f"engine {plan.engine_hash_short} already built at {destination.uri}")
        return BuildResult("already-built", plan.engine_hash, destination.uri, existing or {})
    staging = storage.staging_dir_beside(Path(plan.workdir) / "publish")
    try:
        _execute(plan, staging, env, progress)
        manifest = build_manifest(plan, staging, now())
        storage.write_json_atomic(staging / storage.MANIFEST_NAME, manifest)
        storage.s3_publish(staging, destination)
    finally:
        storage.remove_tree(staging)
    progress(f"published engine {plan.engine_hash_short} at {destination.uri}")
    return BuildResult("built", plan.engine_hash, destination.uri, manifest)


def failure_reason(exc: BaseException, plan: BuildPlan | None) -> str:
    """One paragraph for the termination log: which step, its exit code, the last lines of its stderr."""
    subject = f"trtfleet engines build of {plan.engine_hash_short}" if plan else "trtfleet engines build"
    if isinstance(exc, StepFailedError):
        total = len(plan.steps) if plan else "?"
        tail = " | ".join(line.strip() for line in exc.stderr_tail.splitlines() if line.strip())
        return (f"{subject} failed at step {exc.step_index}/{total} ({exc.step_name}) with exit code "
                f"{exc.exit_code}. Last stderr lines: {tail or '(none)'}")
    return f"{subject} failed: {exc}"


def write_termination_log(message: str, env: Mapping[str, str] | None = None) -> Path | None:
    """Write ``message`` (truncated to what Kubernetes keeps) to the termination log; None if impossible."""
    env = os.environ if env is None else env
    path = Path(env.get(TERMINATION_LOG_ENV) or DEFAULT_TERMINATION_LOG)
    data = message.encode("utf-8")[:TERMINATION_LOG_MAX_BYTES].decode("utf-8", "ignore").encode("utf-8")
    try:
        with path.open("wb") as handle:  # /dev/termination-log is a file Kubernetes created: no rename
            handle.write(data)
    except OSError as exc:
        logger.warning("cannot write the termination log %s: %s", path, exc)
        return None
    return path
