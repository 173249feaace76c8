"""Where built engines are published: local paths (file://, plain paths, mounted PVCs) and s3://.

Publishing is atomic: the runner builds into a staging directory *beside* the destination (same file
system), then renames it into place. A lock file in the destination's parent (``fcntl.flock`` on
``.<name>.lock``) serialises concurrent builders of the same engine; whoever gets the lock second sees the
manifest and stops. s3:// destinations are built locally and uploaded object by object with
``manifest.json`` last, so a reader that finds the manifest finds every file; boto3 is an optional
dependency (``pip install 'trtfleet[s3]'``) and its absence is a :class:`MissingDependencyError`.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import logging
import os
import shutil
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

from trtfleet_engines.errors import MissingDependencyError, StorageError

logger = logging.getLogger(__name__)

MANIFEST_NAME = "manifest.json"


def write_bytes_atomic(path: Path, data: bytes) -> None:
    """Write ``data`` to ``path`` through a temporary file in the same directory and a rename."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp_name = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp_name, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp_name)
        raise


def write_text_atomic(path: Path, text: str) -> None:
    write_bytes_atomic(path, text.encode("utf-8"))


def write_json_atomic(path: Path, value: Any) -> None:
    write_text_atomic(path, json.dumps(value, indent=2, sort_keys=True) + "\n")


@dataclass(frozen=True)
class Destination:
    """A parsed ``--out``: either a local directory or an s3 prefix."""

    uri: str
    local_path: Path | None
    s3_bucket: str | None = None
    s3_prefix: str | None = None

    @property
    def is_local(self) -> bool:
        return self.local_path is not None


def parse_destination(uri: str) -> Destination:
    """``file:///x``, ``/x``, ``./x`` -> a local directory; ``s3://bucket/prefix`` -> an s3 prefix."""
    if not uri:
        raise StorageError("the destination is empty: pass --out file:///path, /path or s3://bucket/prefix")
    parsed = urlparse(uri)
    if parsed.scheme in ("", "file"):
        if parsed.scheme == "file" and parsed.netloc not in ("", "localhost"):
            raise StorageError(f"{uri!r}: file URIs must be absolute (file:///path)")
        path = Path(parsed.path if parsed.scheme == "file" else uri)
        return Destination(uri=uri, local_path=path.absolute())
    if parsed.scheme == "s3":
        if not parsed.netloc:
            raise StorageError(f"{uri!r}: an s3 destination needs a bucket (s3://bucket/prefix)")
        prefix = parsed.path.strip("/")
        return Destination(uri=uri, local_path=None, s3_bucket=parsed.netloc, s3_prefix=prefix)
    raise StorageError(f"{uri!r}: unsupported destination scheme {parsed.scheme!r}; use file://, a path or s3://")


def read_manifest(path: Path) -> dict[str, Any] | None:
    """The manifest in directory ``path``, or None when there is none (or it is unreadable)."""
    manifest = path / MANIFEST_NAME
    try:
        value = json.loads(manifest.read_text())
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as exc:
        logger.warning("ignoring unreadable manifest %s: %s", manifest, exc)
        return None
    return value if isinstance(value, dict) else None


@contextlib.contextmanager
def exclusive_lock(target: Path) -> Iterator[None]:
    """Hold an exclusive ``flock`` on ``<parent>/.<name>.lock`` while building ``target``.

    ``flock`` locks die with their process, so a crashed builder never leaves a stale lock behind.
    """
    target.parent.mkdir(parents=True, exist_ok=True)
    lock_path = target.parent / f".{target.name}.lock"
    fd = os.open(lock_path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        fcntl.flock(fd, fcntl.LOCK_UN)
        os.close(fd)


def staging_dir_beside(target: Path) -> Path:
    """A fresh empty directory next to ``target`` (same file system, so a rename publishes it)."""
    target.parent.mkdir(parents=True, exist_ok=True)
    return Path(tempfile.mkdtemp(prefix=f".{target.name}.staging-", dir=target.parent))


def remove_stale_staging(target: Path) -> None:
    """Remove staging directories of builders that died; call only while holding :func:`exclusive_lock`."""
    for stale in target.parent.glob(f".{target.name}.staging-*"):
        logger.info("removing the staging directory of an interrupted build: %s", stale)
        _remove_tree(stale)


def publish_local(staging: Path, target: Path) -> None:
    """Rename ``staging`` to ``target``; a ``target`` without a manifest (a leftover) is replaced."""
    if target.exists():
        if read_manifest(target) is not None:
            raise StorageError(f"{target} already holds a published engine; refusing to overwrite it")
        aside = target.parent / f".{target.name}.stale-{os.getpid()}"
        os.rename(target, aside)
        _remove_tree(aside)
    os.rename(staging, target)


def _remove_tree(path: Path) -> None:
    shutil.rmtree(path, ignore_errors=True)


def remove_tree(path: Path) -> None:
    """Remove a staging directory (best effort: it never held a published engine)."""
    _remove_tree(path)


def s3_client() -> Any:
    try:
        import boto3  # type: ignore[import-not-found,unused-ignore]
    except ImportError as exc:
        raise MissingDependencyError(
            "s3:// destinations need boto3, which is not installed: pip install 'trtfleet[s3]'"
        ) from exc
    return boto3.client("s3")


def s3_read_manifest(destination: Destination) -> dict[str, Any] | None:
    client = s3_client()
    key = f"{destination.s3_prefix}/{MANIFEST_NAME}".lstrip("/")
    try:
        body = client.get_object(Bucket=destination.s3_bucket, Key=key)["Body"].read()
    except client.exceptions.NoSuchKey:
        return None
    except Exception as exc:  # botocore's ClientError and transport errors have no common public base
        raise StorageError(f"cannot read s3://{destination.s3_bucket}/{key}: {exc}") from exc
    value = json.loads(body)
    return value if isinstance(value, dict) else None


def s3_publish(staging: Path, destination: Destination) -> None:
    """Upload every file of ``staging`` under the prefix, ``manifest.json`` last."""
    client = s3_client()
    files = sorted(p for p in staging.rglob("*") if p.is_file())
    files.sort(key=lambda p: p.name == MANIFEST_NAME)
    for path in files:
        key = f"{destination.s3_prefix}/{path.relative_to(staging).as_posix()}".lstrip("/")
        try:
            client.upload_file(str(path), destination.s3_bucket, key)
        except Exception as exc:  # see s3_read_manifest
            raise StorageError(f"cannot upload {path} to s3://{destination.s3_bucket}/{key}: {exc}") from exc
