"""Entrypoint of the adapter-conversion Job: ``python3 -m trtfleet_operator.jobs.convert``.

1. Make the PEFT source readable: ``file://`` and ``pvc://`` in place (the Job mounts each claim at
   ``PVC_MOUNT_ROOT/<claim>``, as build Jobs do), ``hf://`` with huggingface_hub and ``s3://`` with boto3
   into ``--work``.
2. Run ``trtfleet lora convert SRC OUT --dtype D [--architecture A]`` with the widest limits (every module,
   the API's largest rank): the operator checks rank and modules against the BaseModel itself, so that it
   can say which limit an adapter breaks. ``OUT`` is content-addressed (source digest + dtype, plus the
   module mapping for Phi-3) and conversion is deterministic, so an ``OUT`` with a manifest is reused.
3. With ``--stage-peft`` (Adapters of ``runtime: pytorch`` BaseModels, whose pods read PEFT directories
   themselves): the conversion in step 2 goes to scratch space and only validates (the same rank, module,
   dtype and DoRA checks); the PEFT directory itself is copied to ``OUT`` with the conversion's
   ``manifest.json`` beside it, through a staging directory renamed into place.
4. Write the manifest summary (:mod:`trtfleet_operator.artifacts`) to the termination log.

Any failure writes one line saying what failed to the termination log and exits 1.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path
from urllib.parse import urlparse

from trtfleet_engines.plan import PVC_MOUNT_ROOT

from trtfleet.api.basemodel import LoraModule
from trtfleet_operator.artifacts import SummaryError, summarize

MAX_RANK = 256
"""The largest ``lora.maxRank`` the API allows."""
TERMINATION_LOG_MAX_BYTES = 4096
STDERR_TAIL_BYTES = 3000


class FetchError(Exception):
    pass


def local_source(uri: str, revision: str | None, work: Path) -> Path:
    """A local directory holding the adapter of ``uri`` (downloaded into ``work`` when remote)."""
    parsed = urlparse(uri)
    if parsed.scheme == "file":
        return Path(parsed.path)
    if parsed.scheme == "pvc":
        return Path(PVC_MOUNT_ROOT) / parsed.netloc / parsed.path.lstrip("/")
    target = work / "source"
    if parsed.scheme == "hf":
        try:
            from huggingface_hub import snapshot_download
        except ImportError as exc:
            raise FetchError("hf:// adapters need huggingface_hub in the convert image") from exc
        try:
            snapshot_download(
                repo_id=uri.removeprefix("hf://"),
                revision=revision or None,
                local_dir=str(target),
                token=os.environ.get("HF_TOKEN") or None,
                endpoint=os.environ.get("HF_ENDPOINT") or None,
            )
        except Exception as exc:  # huggingface_hub's errors (not found, gated, HTTP) share no base class with OSError
            raise FetchError(f"{type(exc).__name__}: {exc}") from exc
        return target
    if parsed.scheme == "s3":
        try:
            import boto3  # type: ignore[import-not-found,unused-ignore]
        except ImportError as exc:
            raise FetchError("s3:// adapters need boto3 in the convert image (pip install 'trtfleet[s3]')") from exc
        client = boto3.client("s3")
        prefix = parsed.path.strip("/") + "/"
        for page in client.get_paginator("list_objects_v2").paginate(Bucket=parsed.netloc, Prefix=prefix):
            for item in page.get("Contents", []):
                path = target / item["Key"][len(prefix) :]
                path.parent.mkdir(parents=True, exist_ok=True)
                client.download_file(parsed.netloc, item["Key"], str(path))
        return target
    raise FetchError(f"{uri}: unsupported scheme {parsed.scheme!r}")


def _report(path: Path, text: str) -> None:
    data = text.encode()[:TERMINATION_LOG_MAX_BYTES]
    try:
        path.write_bytes(data)
    except OSError as exc:
        print(f"cannot write {path}: {exc}", file=sys.stderr)


def stage_peft(source: Path, manifest: Path, out: Path) -> None:
    """Copy the validated PEFT directory ``source`` to ``out`` with ``manifest`` beside it, published by a
    rename so pods never see half an adapter."""
    staging = out.with_name(f".{out.name}.staging")
    shutil.rmtree(staging, ignore_errors=True)
    shutil.copytree(source, staging, ignore=shutil.ignore_patterns(".git", ".cache", "manifest.json"))
    shutil.copy2(manifest, staging / "manifest.json")
    shutil.rmtree(out, ignore_errors=True)
    staging.rename(out)


def run(args: argparse.Namespace) -> int:
    log = Path(args.termination_log)
    out = Path(args.out)
    try:
        source = local_source(args.source_uri, args.revision, Path(args.work))
    except (FetchError, OSError) as exc:
        _report(log, f"fetching {args.source_uri} failed: {exc}")
        return 1
    if not (out / "manifest.json").is_file():
        converted = Path(args.work) / "converted" if args.stage_peft else out
        argv = [
            args.trtfleet,
            "lora",
            "convert",
            str(source),
            str(converted),
            "--dtype",
            args.dtype,
            "--max-rank",
            str(MAX_RANK),
            "--target-modules",
            *[m.value for m in LoraModule],
            *(["--architecture", args.architecture] if args.architecture else []),
            "--force",
        ]
        done = subprocess.run(argv, stderr=subprocess.PIPE, text=True, check=False)
        if done.returncode != 0:
            tail = done.stderr.strip()[-STDERR_TAIL_BYTES:] or f"exit code {done.returncode}"
            _report(log, f"trtfleet lora convert {args.source_uri} failed: {tail}")
            sys.stderr.write(done.stderr)
            return 1
        if args.stage_peft:
            try:
                stage_peft(source, converted / "manifest.json", out)
            except OSError as exc:
                _report(log, f"staging the PEFT directory of {args.source_uri} in {out} failed: {exc}")
                return 1
    try:
        summary = summarize(json.loads((out / "manifest.json").read_text()))
    except (OSError, ValueError, SummaryError) as exc:
        _report(log, f"{out}/manifest.json is unreadable: {exc}")
        return 1
    _report(log, summary.to_json())
    print(summary.to_json())
    return 0


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python3 -m trtfleet_operator.jobs.convert", description=__doc__)
    p.add_argument("--source-uri", required=True)
    p.add_argument("--revision", default="")
    p.add_argument("--out", required=True, help="output directory in the artifact volume")
    p.add_argument("--dtype", required=True)
    p.add_argument("--architecture", default="", help="the base model's architecture, where its module mapping differs")
    p.add_argument("--work", default="/work", help="scratch directory for downloads")
    p.add_argument(
        "--stage-peft",
        action="store_true",
        help="validate by converting to scratch space, then stage the PEFT directory itself (runtime pytorch)",
    )
    p.add_argument("--termination-log", default="/dev/termination-log")
    p.add_argument("--trtfleet", default="trtfleet", help="the trtfleet command")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    return run(parser().parse_args(argv))


if __name__ == "__main__":
    raise SystemExit(main())
